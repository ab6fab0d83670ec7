"""Approval tokens: proof, checkable by a tool server, that a person approved exactly this call.

When a person approves a high-risk call, the gateway issues a token naming the approval, the tool,
a hash of the arguments, an expiry and the key and tenant that requested the call, signed with
HMAC-SHA256 under a secret it shares with the tool server. Before running the call, the tool
server checks it with verify_approval_token() and nothing but that secret: a token for other
arguments, another tool, past its expiry, or not signed with the secret is refused; given the
caller's key id and tenant, so is a token issued to another key.

Format: `base64url(claims JSON) "." base64url(MAC)`, unpadded. The MAC covers a label naming this
token kind and version, then the encoded claims exactly as sent, so the claims are only parsed once
they are known to come from the secret's holder.

The arguments hash is over the canonical form of the parsed arguments: re-serialising them
(whitespace, key order) leaves it unchanged, while any changed value changes it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import re
import time
from dataclasses import dataclass
from typing import Any

import orjson

from policies.arguments import MalformedArguments, canonical_json, parse_arguments_json

TOKEN_VERSION = 2  # v2 binds the token to the requesting key and tenant; v1 tokens are refused
# Keeps a MAC made with this secret for another purpose from ever passing as an approval.
_MAC_LABEL = b"agent-gateway approval token v2\n"
MIN_SECRET_BYTES = 16
_MAX_TOKEN_CHARS = 4096
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_CLAIM_KEYS = frozenset({"v", "id", "tool", "args", "exp", "key", "tenant"})


class InvalidApprovalToken(Exception):
    """The token does not approve this call. `code`: malformed, bad_mac, expired, wrong_tool,
    arguments_changed, wrong_requester."""

    def __init__(self, reason: str, code: str = "malformed") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


@dataclass(frozen=True, slots=True)
class ApprovalClaims:
    """What a valid token vouches for; `approval_id` lets a tool server run each approval once."""

    approval_id: str
    tool: str
    arguments_sha256: str
    expires_at: float
    key_id: str = ""  # the key that requested the call: only its conversation may use the result
    tenant: str = ""


def arguments_sha256(arguments_json: str) -> str:
    """Hex SHA-256 of the canonical JSON of the parsed arguments; MalformedArguments if not JSON."""
    return hashlib.sha256(canonical_json(parse_arguments_json(arguments_json))).hexdigest()


def _check_secret(secret: bytes) -> None:
    # A short secret makes every token forgeable by guessing; refuse it rather than sign with it.
    if not isinstance(secret, bytes) or len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"the approval secret must be at least {MIN_SECRET_BYTES} bytes")


def _mac(secret: bytes, encoded_claims: str) -> bytes:
    return hmac.new(secret, _MAC_LABEL + encoded_claims.encode("ascii"), hashlib.sha256).digest()


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    if not _BASE64URL.fullmatch(text):
        raise InvalidApprovalToken("malformed token: not base64url")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise InvalidApprovalToken("malformed token: not base64url") from None
    if _b64encode(data) != text:
        # Only one spelling of each token is valid, so a token string can serve as a key.
        raise InvalidApprovalToken("malformed token: not canonical base64url")
    return data


def issue_approval_token(
    secret: bytes,
    approval_id: str,
    tool: str,
    arguments_sha256: str,
    expires_at: float,
    *,
    key_id: str = "",
    tenant: str = "",
) -> str:
    """Sign an approval of `tool` with the arguments whose arguments_sha256() is given, until
    `expires_at`, for the call requested by `key_id` of `tenant`."""
    _check_secret(secret)
    if not _SHA256_HEX.fullmatch(arguments_sha256):
        raise ValueError("arguments_sha256 must be the hex digest from arguments_sha256()")
    if isinstance(expires_at, bool) or not isinstance(expires_at, int | float) or not math.isfinite(expires_at):
        raise ValueError("expires_at must be a finite Unix time")
    claims = {
        "v": TOKEN_VERSION,
        "id": approval_id,
        "tool": tool,
        "args": arguments_sha256,
        "exp": expires_at,
        "key": key_id,
        "tenant": tenant,
    }
    encoded = _b64encode(orjson.dumps(claims, option=orjson.OPT_SORT_KEYS))
    return f"{encoded}.{_b64encode(_mac(secret, encoded))}"


def _signed_claims(token: str, secret: bytes) -> Any:
    if not isinstance(token, str) or len(token) > _MAX_TOKEN_CHARS or not token.isascii():
        raise InvalidApprovalToken("malformed token")
    parts = token.split(".")
    if len(parts) != 2:
        raise InvalidApprovalToken("malformed token: expected two dot-separated parts")
    encoded, mac = parts
    _b64decode(encoded)  # a well-formed spelling before spending a MAC on it
    if not hmac.compare_digest(_b64decode(mac), _mac(secret, encoded)):
        raise InvalidApprovalToken("bad signature: not issued with this secret, or altered", "bad_mac")
    try:
        return orjson.loads(_b64decode(encoded))
    except orjson.JSONDecodeError:
        raise InvalidApprovalToken("malformed token: claims are not JSON") from None


def _typed_claims(raw: Any) -> ApprovalClaims:
    # Signed claims were written by issue_approval_token; checking them guards against a secret
    # shared with an older or different issuer.
    if not isinstance(raw, dict) or raw.keys() != _CLAIM_KEYS or raw["v"] != TOKEN_VERSION:
        raise InvalidApprovalToken("malformed token: unexpected claims")
    approval_id, tool, digest, expires_at = raw["id"], raw["tool"], raw["args"], raw["exp"]
    valid_expiry = isinstance(expires_at, int | float) and not isinstance(expires_at, bool)
    strings = (approval_id, tool, digest, raw["key"], raw["tenant"])
    if not (all(isinstance(value, str) for value in strings) and valid_expiry):
        raise InvalidApprovalToken("malformed token: unexpected claims")
    return ApprovalClaims(approval_id, tool, digest, float(expires_at), raw["key"], raw["tenant"])


def verify_approval_token(
    token: str,
    secret: bytes,
    tool: str,
    arguments_json: str,
    now: float | None = None,
    *,
    key_id: str | None = None,
    tenant: str | None = None,
) -> ApprovalClaims:
    """Check that `token` approves calling `tool` with `arguments_json`, now, (when given) for the
    call of `key_id` of `tenant`; raise InvalidApprovalToken if not."""
    _check_secret(secret)
    claims = _typed_claims(_signed_claims(token, secret))
    if (key_id is not None and claims.key_id != key_id) or (tenant is not None and claims.tenant != tenant):
        raise InvalidApprovalToken("approval was issued to another key", "wrong_requester")
    current = time.time() if now is None else now
    if current >= claims.expires_at:
        raise InvalidApprovalToken("approval expired", "expired")
    if claims.tool != tool:
        raise InvalidApprovalToken(f"approval is for tool {claims.tool!r}, not {tool!r}", "wrong_tool")
    try:
        digest = arguments_sha256(arguments_json)
    except MalformedArguments as exc:
        raise InvalidApprovalToken(f"arguments: {exc}", "arguments_changed") from None
    if not hmac.compare_digest(digest, claims.arguments_sha256):
        raise InvalidApprovalToken("arguments differ from the approved ones", "arguments_changed")
    return claims
