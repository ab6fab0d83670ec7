"""Reading request samples from the formats operators have at hand.

Every format ends up as a request body (chat completions, or the Responses API's when the body has
`input` and no `messages`) plus an id and, when the source has one, the time the request
originally arrived (for replay with original timing):

- our JSONL: one request body per line, with optional `id` and `timestamp` keys (not sent);
- the shared samples: `{"id", "category", "body": {...}, ...}` per line;
- OpenAI Batch JSONL: `{"custom_id", "method", "url", "body"}` per line;
- ShareGPT JSON: a list (or JSON lines) of `{"id", "conversations": [{"from", "value"}]}`;
- gateway audit exports in capture mode: lines with `kind: "request"` and `capture.request`.

`prepare` then applies the operator's per-run overrides (--model, --max-tokens, --stream) and
serialises each body before the run starts, so JSON encoding never sits between the moment a
request is due and the moment it is sent.

Lines that are not requests (audit records of other kinds, batch lines for other endpoints) are
skipped and counted, so an operator sees what was left out instead of a silently smaller run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

# A sample file larger than this is almost certainly the wrong file; refuse rather than swap.
MAX_SAMPLE_FILE_BYTES = 2 * 1024**3

_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
}
_CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
_RESPONSES_PATHS = ("/v1/responses", "/responses")
_MESSAGES_PATHS = ("/v1/messages", "/messages")
CHAT, RESPONSES, MESSAGES = "chat", "responses", "messages"  # the API a sample's body is for
_APIS = frozenset({CHAT, RESPONSES, MESSAGES})
# Keys of our JSONL lines that describe the sample rather than being part of the request.
_PLAIN_META = frozenset({"id", "timestamp", "expect_finish_reason", "expect_tool_call", "api"})
# A model name sample sets use to mean "whatever the endpoint serves" (the shared BFCL samples do);
# no server has a model of that name, so such a sample needs --model.
PLACEHOLDER_MODELS = frozenset({"default"})


class SampleError(ValueError):
    """The sample file cannot be used; the message says where and why."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One request to replay; `body` is never mutated (overrides build a copy)."""

    id: str
    body: dict[str, Any]
    format: str
    timestamp: float | None = None
    category: str | None = None
    expect_finish_reason: str | None = None
    expect_tool_call: bool | None = None
    api: str = CHAT


@dataclass(frozen=True, slots=True)
class SampleSet:
    samples: tuple[Sample, ...]
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def formats(self) -> dict[str, int]:
        return dict(Counter(sample.format for sample in self.samples))


def load_samples(path: Path) -> SampleSet:
    """Read every sample in `path`, detecting the format per line (or per file for a JSON list)."""
    try:
        if path.stat().st_size > MAX_SAMPLE_FILE_BYTES:
            raise SampleError(f"{path}: larger than {MAX_SAMPLE_FILE_BYTES} bytes")
        raw = path.read_bytes()
    except OSError as exc:
        raise SampleError(f"cannot read samples {path}: {exc}") from exc
    if raw.lstrip()[:1] == b"[":
        items = _json_list(raw, path)
        found = [(str(n), item) for n, item in enumerate(items)]
    else:
        found = _json_lines(raw)
    samples: list[Sample] = []
    skipped: Counter[str] = Counter()
    for where, item in found:
        result = parse_item(item, where)
        if isinstance(result, Sample):
            samples.append(result)
        else:
            skipped[result] += 1
    if not samples:
        detail = f" (skipped: {dict(skipped)})" if skipped else ""
        raise SampleError(f"{path}: no request samples found{detail}")
    return SampleSet(tuple(samples), dict(skipped))


def _json_list(raw: bytes, path: Path) -> list[Any]:
    try:
        items = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise SampleError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(items, list):
        raise SampleError(f"{path}: expected a JSON list")
    return items


def _json_lines(raw: bytes) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            found.append((str(number), orjson.loads(line)))
        except orjson.JSONDecodeError:
            # Kept as a marker so the skip is counted under its own reason.
            found.append((str(number), _Unparsable()))
    return found


class _Unparsable:
    """Stands in for a line that is not JSON."""


def parse_item(item: Any, where: str) -> Sample | str:
    """A sample, or the reason (a short phrase) the item is skipped."""
    if isinstance(item, _Unparsable):
        return "line is not valid JSON"
    if not isinstance(item, dict):
        return "line is not a JSON object"
    if "kind" in item:
        return _audit(item, where)
    if "custom_id" in item and isinstance(item.get("body"), dict):
        return _batch(item)
    if isinstance(item.get("body"), dict):
        return _shared(item, where)
    if isinstance(item.get("conversations"), list):
        return _sharegpt(item, where)
    if isinstance(item.get("messages"), list) or _is_responses(item):
        return _plain(item, where)
    return "unrecognized line"


def _is_responses(body: dict[str, Any]) -> bool:
    return isinstance(body.get("input"), str | list) and "messages" not in body


def _is_messages(body: dict[str, Any]) -> bool:
    """An Anthropic Messages body: messages with a top-level `system`, or tools with `input_schema`
    (a chat body has neither; one with no system and no tools needs the line's `"api"`)."""
    tools = body.get("tools")
    schema_tools = isinstance(tools, list) and any(isinstance(t, dict) and "input_schema" in t for t in tools)
    return isinstance(body.get("messages"), list) and ("system" in body or schema_tools)


def _api_of(body: dict[str, Any], named: Any = None) -> str:
    """The API a body is for: the line's `api` when it names one, else the Responses API for
    `input` without `messages`, the Messages API for its own marks (`_is_messages`), else chat."""
    if isinstance(named, str) and named in _APIS:
        return named
    if _is_responses(body):
        return RESPONSES
    return MESSAGES if _is_messages(body) else CHAT


def _plain(item: dict[str, Any], where: str) -> Sample | str:
    body = {k: v for k, v in item.items() if k not in _PLAIN_META}
    expect = item.get("expect_finish_reason")
    return Sample(
        id=str(item.get("id", f"line-{where}")),
        body=body,
        format="jsonl",
        timestamp=parse_timestamp(item.get("timestamp")),
        expect_finish_reason=expect if isinstance(expect, str) else None,
        expect_tool_call=_flag(item.get("expect_tool_call")),
        api=_api_of(body, item.get("api")),
    )


def _shared(item: dict[str, Any], where: str) -> Sample | str:
    body = item["body"]
    if not isinstance(body.get("messages"), list) and not _is_responses(body):
        return "body without messages"
    expect = item.get("expect_finish_reason")
    return Sample(
        id=str(item.get("id", f"line-{where}")),
        body=body,
        format="shared",
        timestamp=parse_timestamp(item.get("timestamp")),
        category=item.get("category") if isinstance(item.get("category"), str) else None,
        expect_finish_reason=expect if isinstance(expect, str) else None,
        expect_tool_call=_flag(item.get("expect_tool_call")),
        api=_api_of(body, item.get("api")),
    )


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _batch(item: dict[str, Any]) -> Sample | str:
    url, body = item.get("url"), item["body"]
    if url in _RESPONSES_PATHS and _is_responses(body):
        return Sample(id=str(item["custom_id"]), body=body, format="batch", api=RESPONSES)
    if url in _MESSAGES_PATHS and isinstance(body.get("messages"), list):
        return Sample(id=str(item["custom_id"]), body=body, format="batch", api=MESSAGES)
    if url is not None and url not in _CHAT_PATHS:
        return f"batch line for {url}"
    if not isinstance(body.get("messages"), list):
        return "body without messages"
    return Sample(id=str(item["custom_id"]), body=body, format="batch")


def _audit(item: dict[str, Any], where: str) -> Sample | str:
    if item.get("kind") != "request":
        return f"audit record of kind {item.get('kind')!r}"
    capture = item.get("capture")
    request = capture.get("request") if isinstance(capture, dict) else None
    if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        return "audit request without capture"
    # The record is written when the request ends; its start is `ts - duration`.
    ts, duration_ms = item.get("ts"), item.get("duration_ms")
    timestamp = None
    if isinstance(ts, int | float):
        timestamp = float(ts) - (float(duration_ms) / 1000 if isinstance(duration_ms, int | float) else 0.0)
    return Sample(
        id=str(item.get("request_id") or f"line-{where}"),
        body=request,
        format="audit",
        timestamp=timestamp,
    )


def _sharegpt(item: dict[str, Any], where: str) -> Sample | str:
    messages: list[dict[str, Any]] = []
    for turn in item["conversations"]:
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            return "sharegpt turn without text"
        role = _SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
        if role is None:
            return f"sharegpt role {turn.get('from')!r}"
        messages.append({"role": role, "content": turn["value"]})
    # Replay asks for the reply to the last user turn, so later assistant turns are dropped.
    last_user = max((n for n, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        return "sharegpt conversation without a user turn"
    body: dict[str, Any] = {"messages": messages[: last_user + 1]}
    if isinstance(item.get("model"), str):
        body["model"] = item["model"]
    return Sample(id=str(item.get("id", f"item-{where}")), body=body, format="sharegpt")


def parse_timestamp(value: Any) -> float | None:
    """Unix seconds from a number or an ISO 8601 string; None when absent or unreadable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


class PrepareError(ValueError):
    """A sample cannot be sent as configured (e.g. it names no model and --model is not given)."""


@dataclass(frozen=True, slots=True)
class Overrides:
    model: str | None = None
    max_tokens: int | None = None
    stream: bool | None = None


@dataclass(frozen=True, slots=True)
class Prepared:
    """One request ready to go: the sample's identity and the body bytes."""

    sample_id: str
    body: bytes
    stream: bool
    expect_length: bool  # finish_reason "length" is what the sample (or operator) asked for
    expect_tool_call: bool | None = None
    api: str = CHAT


def apply_overrides(body: dict[str, Any], overrides: Overrides, api: str = CHAT) -> dict[str, Any]:
    """A copy of `body` with the overrides applied; a chat stream always asks for usage (a
    Responses stream always ends with it)."""
    out = dict(body)
    if overrides.model is not None:
        out["model"] = overrides.model
    if overrides.max_tokens is not None:
        limits = {RESPONSES: ("max_output_tokens",), MESSAGES: ("max_tokens",)}.get(
            api, ("max_completion_tokens", "max_tokens")
        )
        named = [name for name in limits if name in out]
        for name in named or [limits[-1]]:
            out[name] = overrides.max_tokens
    if overrides.stream is not None:
        out["stream"] = overrides.stream
    if api != CHAT:  # their streams always end with the usage, and they know no stream_options
        return out
    if out.get("stream") is True:
        # Token counts from the server beat any client-side estimate, so always ask for them.
        options = out.get("stream_options")
        out["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    else:
        # Servers reject stream_options on a non-streaming request.
        out.pop("stream_options", None)
    return out


def prepare(sample: Sample, overrides: Overrides) -> Prepared:
    body = apply_overrides(sample.body, overrides, sample.api)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise PrepareError(f"sample {sample.id} names no model; pass --model")
    if body["model"] in PLACEHOLDER_MODELS:
        raise PrepareError(
            f"sample {sample.id} names the placeholder model {body['model']!r}, which no server serves; "
            "pass --model NAME to send it to a real model"
        )
    # With --max-tokens the operator caps the output on purpose, so hitting the cap is expected.
    expect_length = sample.expect_finish_reason == "length" or overrides.max_tokens is not None
    return Prepared(
        sample_id=sample.id,
        body=orjson.dumps(body),
        stream=body.get("stream") is True,
        expect_length=expect_length,
        expect_tool_call=sample.expect_tool_call,
        api=sample.api,
    )


def prepare_all(samples: tuple[Sample, ...], overrides: Overrides) -> list[Prepared]:
    return [prepare(sample, overrides) for sample in samples]
