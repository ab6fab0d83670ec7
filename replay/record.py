"""One replayed request as the client saw it, and the vocabulary of failure reasons.

Times inside a record are seconds from the moment the request was sent (its body written to the
socket), except `start_s`, which is the dispatch time from the start of the run. Keeping the raw
arrival times lets any metric be recomputed later from the JSON result file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any, Final

# Failure reasons. HTTP statuses other than these are reported as `http_<code>`.
CONNECT_ERROR: Final = "connect_error"
CONNECT_TIMEOUT: Final = "connect_timeout"
FIRST_TOKEN_TIMEOUT: Final = "first_token_timeout"
STALL_TIMEOUT: Final = "stall_timeout"
REQUEST_TIMEOUT: Final = "request_timeout"
TRANSPORT_ERROR: Final = "transport_error"
STREAM_CUT: Final = "stream_cut"
MALFORMED_CHUNK: Final = "malformed_chunk"
INBAND_ERROR: Final = "inband_error"
CONTENT_FILTER: Final = "content_filter"
LENGTH: Final = "length"
EMPTY_OUTPUT: Final = "empty_output"
INVALID_TOOL_ARGS: Final = "invalid_tool_args"
NO_TOOL_CALL: Final = "no_tool_call"
# Still running when the run's drain deadline passed: the tool gave up, not the server.
CANCELLED: Final = "cancelled"

REASON_LABELS: Final = (
    (CONNECT_ERROR, "could not connect"),
    (CONNECT_TIMEOUT, "connect (or pool) timeout"),
    (FIRST_TOKEN_TIMEOUT, "no first token within --first-token-timeout"),
    (STALL_TIMEOUT, "no bytes within --stall-timeout after the first token"),
    (REQUEST_TIMEOUT, "request exceeded --request-timeout"),
    (TRANSPORT_ERROR, "connection failed before a response"),
    ("http_429", "HTTP 429 rate limited"),
    (STREAM_CUT, "stream ended without [DONE]"),
    (MALFORMED_CHUNK, "chunk or body is not valid JSON"),
    (INBAND_ERROR, 'in-band error event (data: {"error": ...})'),
    (CONTENT_FILTER, "finish_reason content_filter"),
    (LENGTH, "finish_reason length the sample did not expect"),
    (EMPTY_OUTPUT, "finished without content, reasoning or tool call"),
    (INVALID_TOOL_ARGS, "tool call arguments are not a JSON object"),
    (NO_TOOL_CALL, "the sample expected a tool call (expect_tool_call) and got none"),
    (CANCELLED, "still running when the run ended (not counted)"),
)


def http_reason(status: int) -> str:
    return f"http_{status}"


def reason_group(reason: str) -> str:
    """The family a reason is grouped under in reports: 4xx, 5xx, timeout, stream or the reason."""
    if reason.startswith("http_") and reason[5:].isdigit():
        return "429" if reason == "http_429" else f"{reason[5]}xx"
    if reason.endswith("_timeout"):
        return "timeout"
    if reason in (STREAM_CUT, MALFORMED_CHUNK, INBAND_ERROR):
        return "stream"
    if reason in (CONTENT_FILTER, LENGTH, EMPTY_OUTPUT, INVALID_TOOL_ARGS, NO_TOOL_CALL):
        return "output"
    return "connection"


def reason_label(reason: str) -> str:
    for key, label in REASON_LABELS:
        if key == reason:
            return label
    if reason.startswith("http_"):
        return f"HTTP {reason[5:]}"
    return reason


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request; `reason` is None for a clean outcome."""

    index: int
    sample_id: str
    stream: bool
    start_s: float
    setup_s: float | None = None  # dispatch -> request written: pool wait, connect, write
    status: int | None = None
    headers_s: float | None = None  # request written -> response headers received
    reason: str | None = None
    ok: bool = False
    detail: str = ""
    ttft_s: float | None = None
    e2e_s: float | None = None
    finish_reason: str | None = None
    output_tokens: int | None = None
    tokens_source: str | None = None  # "usage", "chunks" or "estimate"
    event_times_s: list[float] = field(default_factory=list)  # every SSE data event
    output_times_s: list[float] = field(default_factory=list)  # events carrying output
    expect_tool_call: bool | None = None  # from the sample; None when it does not say
    tool_call: bool = False  # the answer carried at least one tool call
    # The tool's own part in this request's timing (see replay/lag.py): how late it was dispatched
    # against its schedule, how long writing the request took after the clock started, and the
    # largest delay that could have entered its TTFT or E2E (write delay, or the event loop's stall
    # at the first-output read or the last read).
    dispatch_late_s: float | None = None
    write_delay_s: float | None = None
    client_delay_s: float | None = None
    timing_ok: bool = True  # False: client_delay_s beyond the limit, so left out of latency figures

    @property
    def produced_output(self) -> bool:
        """Succeeded, or was only cut off by finish_reason length: its timings are real either way."""
        return self.ok or (self.reason == LENGTH and bool(self.output_times_s))

    @property
    def tpot_excluded(self) -> str | None:
        """Why this request has no TPOT; None when it has one (or never could: not a stream)."""
        if not self.stream or self.ttft_s is None or self.e2e_s is None:
            return None
        if self.output_tokens is None or self.output_tokens < 2:
            return "fewer than two output tokens"
        if len(self.output_times_s) < 2:
            # All tokens arrived in one chunk (a tool call sent whole, a buffering proxy): the gap
            # TPOT would divide is the time from that chunk to [DONE], not generation.
            return "all output arrived in one chunk"
        return None

    @property
    def tpot_s(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1); undefined below two tokens, for a single chunk of
        output, or without a stream."""
        if not self.stream or self.ttft_s is None or self.e2e_s is None or self.tpot_excluded is not None:
            return None
        assert self.output_tokens is not None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def itl_s(self) -> list[float]:
        times = self.output_times_s
        return [later - earlier for earlier, later in pairwise(times)]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["tpot_s"] = self.tpot_s
        data["tpot_excluded"] = self.tpot_excluded
        data["event_times_s"] = [round(t, 6) for t in self.event_times_s]
        data["output_times_s"] = [round(t, 6) for t in self.output_times_s]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        fields = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**fields)
