"""The tool-policy engine: which tools an agent may call, with which arguments, and which calls
wait for a person. A standalone library: it never imports the gateway, which imports it."""

from policies.approvals import (
    MIN_SECRET_BYTES,
    ApprovalClaims,
    InvalidApprovalToken,
    arguments_sha256,
    issue_approval_token,
    verify_approval_token,
)
from policies.arguments import MalformedArguments, parse_arguments_json
from policies.engine import Allow, Decision, Deny, DenyCode, NeedsApproval, PolicyEngine
from policies.model import (
    ApprovalMode,
    ApprovalSettings,
    Bindings,
    OnForbidden,
    Policy,
    PolicyError,
    PolicyFile,
    Risk,
    ToolRule,
    load_policy_file,
    parse_policy_file,
)

__all__ = [
    "MIN_SECRET_BYTES",
    "Allow",
    "ApprovalClaims",
    "ApprovalMode",
    "ApprovalSettings",
    "Bindings",
    "Decision",
    "Deny",
    "DenyCode",
    "InvalidApprovalToken",
    "MalformedArguments",
    "NeedsApproval",
    "OnForbidden",
    "Policy",
    "PolicyEngine",
    "PolicyError",
    "PolicyFile",
    "Risk",
    "ToolRule",
    "arguments_sha256",
    "issue_approval_token",
    "load_policy_file",
    "parse_arguments_json",
    "parse_policy_file",
    "verify_approval_token",
]
