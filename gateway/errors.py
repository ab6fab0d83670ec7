"""Every error the gateway raises on purpose, with its stable code and HTTP status.

Foreign exceptions (httpx, litellm, redis, pydantic) are translated into these at the boundary
where they occur; nothing else crosses into the request path. `gateway.http.errors` is the one
place that turns them into responses (each API surface renders them in its own shape).

    GatewayError                    500  api_error          (internal_error)
    ├── GenerationCancelled              cancelled          (in band only: a stream stopped on purpose)
    ├── InvalidRequest              400  invalid_request_error
    │   ├── BodyTooLarge            413
    │   ├── RequestTimeout          408  (the body did not arrive in time)
    │   └── UnsupportedParameter    400
    ├── AuthenticationFailed        401  authentication_error
    ├── PermissionDenied            403  permission_error
    ├── NotFound                    404  not_found_error
    │   └── ModelNotFound           404
    ├── MethodNotAllowed            405  invalid_request_error (GET /mcp: no standalone stream)
    ├── Conflict                    409  conflict           (an approval already decided)
    │   └── SessionNotResumable     409  session_not_resumable (answered while the store was down)
    ├── RateLimited                 429  rate_limit_error   (Retry-After)
    │   ├── InsufficientQuota       429  insufficient_quota (a token budget is spent)
    │   ├── TooManyPendingApprovals 429  too_many_pending_approvals (tools.max_pending_approvals_*)
    │   └── RetryTooEarly           429  retry_too_early    (quota/admission.py: retried before Retry-After)
    ├── NoDeploymentAvailable       503  service_unavailable (every deployment open, unhealthy or full)
    ├── StoreUnavailable            503  service_unavailable (Redis or the SQLite file cannot be reached)
    │   └── StoreNotReached              the call never reached the store: nothing of it was applied
    ├── StoreCorrupt                500  store_record_corrupt (a stored record does not decode)
    ├── DeadlineExceeded            504  timeout_error      (no first output within routing.deadline_s)
    └── UpstreamError               502  upstream_error     (one failed attempt at one deployment)
        ├── UpstreamConnectError         could not connect
        ├── UpstreamTimeout         504  connect / first-token / stall timeout
        ├── UpstreamStatusError          the upstream answered with an error status
        ├── UpstreamProtocolError        malformed chunk, stream cut before [DONE]
        ├── UpstreamInBandError          an error event inside a 200 stream
        └── StreamInterrupted            failed mid-stream and no deployment could continue it

`UpstreamError.retryable` tells the router whether another attempt may succeed.

`public_message` is what a client is told. For upstream and store errors it never carries the
upstream's or the driver's own text (addresses, paths, stack traces, other tenants' data may be in
it): that stays in `message`, which goes to the log and the trace. A server-side (5xx) error's
client text also names the request id, under which `message` is logged.
"""

from __future__ import annotations

import math
from typing import ClassVar


class GatewayError(Exception):
    # Class-level defaults; an instance may refine them (an upstream's own 4xx status, say).
    status: int = 500
    type: str = "api_error"
    code: str = "internal_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        # Set where the request is known; a server-side error's client text names it, so that
        # what the client was spared can be found in the log under it.
        self.request_id: str | None = None

    @property
    def public_message(self) -> str:
        return self.message

    def headers(self) -> dict[str, str]:
        return {}


class GenerationCancelled(GatewayError):
    """A streamed answer stopped on purpose (its session deleted, its client gone under
    `on_client_disconnect: cancel`): only ever an in-band event, for the readers still following."""

    code = "cancelled"


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message, param=param)
        if code is not None:
            self.code = code


class BodyTooLarge(InvalidRequest):
    status = 413
    code = "request_too_large"


class RequestTimeout(InvalidRequest):
    status = 408
    code = "request_timeout"


class UnsupportedParameter(InvalidRequest):
    code = "unsupported_parameter"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"
    code = "permission_denied"


class NotFound(GatewayError):
    status = 404
    type = "not_found_error"
    code = "not_found"


class ModelNotFound(NotFound):
    type = "invalid_request_error"
    code = "model_not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"

    def __init__(self, message: str, *, allow: str) -> None:
        super().__init__(message)
        self.allow = allow

    def headers(self) -> dict[str, str]:
        return {"Allow": self.allow}


class Conflict(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "conflict"


class SessionNotResumable(Conflict):
    """The session's latest answer was served while the store was down, without a checkpoint."""

    code = "session_not_resumable"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.extra_headers: dict[str, str] = {}  # x-ratelimit-* when a quota said no

    def headers(self) -> dict[str, str]:
        return {**self.extra_headers, "Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


class RetryTooEarly(RateLimited):
    """This key was told to wait (Retry-After) and came back sooner: refused without a chance."""

    code = "retry_too_early"


class NoDeploymentAvailable(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "no_deployment_available"

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


class StoreUnavailable(GatewayError):
    """`message` names the operation and the driver's text (addresses, ports): for the log only."""

    status = 503
    type = "service_unavailable"
    code = "store_unavailable"

    @property
    def public_message(self) -> str:
        return "The gateway's state store is unavailable; try again shortly"


class StoreNotReached(StoreUnavailable):
    """The call never reached the store (no connection could be had): nothing of it was applied.
    Any other StoreUnavailable may have been applied with its answer lost."""


class StoreCorrupt(GatewayError):
    """A record read back from the store does not decode (not JSON, or a field of the wrong type):
    written by a foreign or broken writer, or edited by hand. A server-side data problem, so 500
    and not 503: retrying gives the same answer until an operator repairs or deletes the record.
    The client is told which record (`what` and `key`, names the caller already knows) but never
    the record's content or the decoder's detail, which may quote it; those go to the log only
    (`message`). A list with such a row fails the same way, naming it: a list silently short of a
    row could mislead an operator (say, into a rollback to the wrong release)."""

    status = 500
    type = "api_error"
    code = "store_record_corrupt"

    def __init__(self, what: str, key: str, detail: str) -> None:
        super().__init__(f"the stored {what} {key!r} is malformed: {detail[:300]}")
        self.what = what
        self.key = key

    @property
    def public_message(self) -> str:
        return f"The gateway's stored {self.what} {self.key!r} is malformed; an operator must repair it"


class DeadlineExceeded(GatewayError):
    """No deployment produced output within the request's deadline, over all its attempts."""

    status = 504
    type = "timeout_error"
    code = "deadline_exceeded"


class InsufficientQuota(RateLimited):
    """A budget (daily tokens) is spent; OpenAI's code for that is distinct from a rate limit."""

    code = "insufficient_quota"


class TooManyPendingApprovals(RateLimited):
    """The key, or its tenant, already has as many calls waiting for a person as its cap allows;
    the call is not held (an MCP call gets it as an error result, not as this)."""

    code = "too_many_pending_approvals"


class UpstreamError(GatewayError):
    """One attempt at one deployment failed; `reason` is a short stable label for metrics and audit."""

    status = 502
    type = "upstream_error"
    code = "upstream_error"
    reason: ClassVar[str] = "upstream_error"
    retryable: bool = True

    def __init__(self, message: str, *, deployment: str = "") -> None:
        super().__init__(message)
        self.deployment = deployment

    @property
    def public_message(self) -> str:
        return f"The model server failed ({self.reason})"


class UpstreamConnectError(UpstreamError):
    code = "upstream_connect_error"
    reason = "connect_error"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"
    reason = "timeout"

    def __init__(self, message: str, *, deployment: str = "", phase: str, deployment_limit: bool = False) -> None:
        super().__init__(message, deployment=deployment)
        self.phase = phase  # "connect" | "first_token" | "stall"
        # The deployment's own first_token_s / stall_s ran out: its breaker opens at once, since
        # every request it holds would wait as long. False for a connect timeout, an attempt's
        # share of the request's deadline (the request's budget, not the deployment's fault), and
        # an attempt cut because another one's stall opened the breaker.
        self.deployment_limit = deployment_limit

    @property
    def public_message(self) -> str:
        return f"The model server timed out ({self.phase.replace('_', ' ')})"


class UpstreamStatusError(UpstreamError):
    code = "upstream_status_error"
    reason = "status"

    def __init__(
        self,
        message: str,
        *,
        deployment: str = "",
        upstream_status: int,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, deployment=deployment)
        self.upstream_status = upstream_status
        self.retry_after_s = retry_after_s
        # 4xx other than 408/409/429 means the request itself is wrong: another deployment of the
        # same model would say the same, so retrying only burns time.
        self.retryable = upstream_status in (408, 409, 429) or upstream_status >= 500
        if not self.retryable:
            # The upstream rejected the request itself: the client gets that status and message.
            self.status = upstream_status
            self.type = "invalid_request_error"

    @property
    def public_message(self) -> str:
        if not self.retryable:
            return f"The model server rejected the request (HTTP {self.upstream_status})"
        return f"The model server answered HTTP {self.upstream_status}"


class UpstreamProtocolError(UpstreamError):
    code = "upstream_protocol_error"
    reason = "protocol_error"


class UpstreamInBandError(UpstreamError):
    code = "upstream_inband_error"
    reason = "inband_error"


class StreamInterrupted(UpstreamError):
    code = "stream_interrupted"
    reason = "stream_interrupted"
    retryable = False

    def __init__(self, tokens_sent: int, cause: UpstreamError) -> None:
        super().__init__(
            f"The answer was interrupted after {tokens_sent} tokens ({cause.reason}: {cause.message}) "
            "and no deployment could continue it",
            deployment=cause.deployment,
        )
        self.cause = cause
        self.tokens_sent = tokens_sent

    @property
    def public_message(self) -> str:
        return (
            f"The answer was interrupted after {self.tokens_sent} tokens ({self.cause.reason}) "
            "and no deployment could continue it"
        )
