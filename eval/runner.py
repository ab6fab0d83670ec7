"""Running an eval set against an OpenAI-compatible endpoint with non-streaming chat completions.

Every request is bounded twice: httpx's connect/read/write timeouts catch a silent peer, and an
overall asyncio deadline catches a server that trickles bytes just fast enough to dodge the read
timeout. A case that got no usable reply is an error, not a failure: errors say the endpoint is
broken, failures say the model is wrong, and the gate counts them separately.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx
import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from eval.assertions import Reply, ReplyToolCall, check
from eval.sets import EvalCase, EvalSet

_DETAIL_CHARS = 200
_CONNECT_TIMEOUT_CAP_S = 10.0


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AssertionFailure(_Frozen):
    index: int
    kind: str
    message: str


class CaseResult(_Frozen):
    case_id: str
    tags: tuple[str, ...] = ()
    weight: float = Field(default=1.0, gt=0)
    passed: bool
    failures: tuple[AssertionFailure, ...] = ()
    latency_s: float | None = None
    error: str | None = None
    content: str | None = None


class Summary(_Frozen):
    cases: int
    passed: int
    failed: int
    errors: int
    pass_rate: float
    # The weighted share of passed cases (errored cases count as not passed); the gate's measure.
    score: float
    # Over cases that got a reply: a timeout's latency is the timeout, not the model's speed.
    mean_latency_s: float | None
    p50_latency_s: float | None

    @model_validator(mode="before")
    @classmethod
    def _score_of_older_results(cls, data: Any) -> Any:
        # Results written before weights existed were unweighted, so their pass rate is their score.
        if isinstance(data, dict) and "score" not in data and "pass_rate" in data:
            return {**data, "score": data["pass_rate"]}
        return data


class EvalResult(_Frozen):
    set_id: str
    set_version: str
    set_digest: str
    # The set's own gate threshold on `summary.score`; a command-line minimum may override it.
    set_threshold: float = Field(default=1.0, ge=0, le=1)
    model: str
    cases: tuple[CaseResult, ...]
    summary: Summary


class _CaseError(Exception):
    """No usable reply; the message is what the report shows."""


def summarize(cases: tuple[CaseResult, ...]) -> Summary:
    passed = sum(case.passed for case in cases)
    errors = sum(case.error is not None for case in cases)
    latencies = [case.latency_s for case in cases if case.error is None and case.latency_s is not None]
    total_weight = sum(case.weight for case in cases)
    return Summary(
        cases=len(cases),
        passed=passed,
        failed=len(cases) - passed - errors,
        errors=errors,
        pass_rate=passed / len(cases) if cases else 0.0,
        score=sum(case.weight for case in cases if case.passed) / total_weight if total_weight else 0.0,
        mean_latency_s=statistics.fmean(latencies) if latencies else None,
        p50_latency_s=statistics.median(latencies) if latencies else None,
    )


def request_body(case: EvalCase, model: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": list(case.messages), "stream": False}
    if case.tools is not None:
        body["tools"] = list(case.tools)
    body.update(case.request.model_dump(exclude_none=True))
    return body


def _http_error(response: httpx.Response) -> str:
    try:
        error = orjson.loads(response.content).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        error = None
    if isinstance(error, dict):
        code = error.get("code") or error.get("type") or ""
        message = str(error.get("message") or "")[:_DETAIL_CHARS]
        return f"HTTP {response.status_code} {code}: {message}".replace(" :", ":")
    return f"HTTP {response.status_code}: {response.text[:_DETAIL_CHARS]}"


def parse_reply(payload: object) -> Reply:
    """The assertion view of a chat completion body; raises `_CaseError` on a malformed one."""
    if not isinstance(payload, dict):
        raise _CaseError("malformed completion: not a JSON object")
    try:
        choice = payload["choices"][0]
        message = choice["message"]
        calls = tuple(
            ReplyToolCall(name=str(call["function"]["name"]), arguments=str(call["function"].get("arguments") or ""))
            for call in message.get("tool_calls") or ()
        )
        content = message.get("content")
        return Reply(
            content=content if isinstance(content, str) else "",
            tool_calls=calls,
            finish_reason=choice.get("finish_reason"),
        )
    except (KeyError, IndexError, TypeError, AttributeError) as error:
        raise _CaseError(f"malformed completion: {type(error).__name__}: {error}") from error


async def _complete(client: httpx.AsyncClient, case: EvalCase, model: str, timeout_s: float) -> Reply:
    try:
        async with asyncio.timeout(timeout_s):
            response = await client.post("chat/completions", json=request_body(case, model))
    except (TimeoutError, httpx.TimeoutException) as error:
        raise _CaseError(f"timeout after {timeout_s:g}s ({type(error).__name__})") from error
    except httpx.HTTPError as error:
        raise _CaseError(f"transport error: {type(error).__name__}: {error}") from error
    if response.status_code != 200:
        raise _CaseError(_http_error(response))
    try:
        payload = orjson.loads(response.content)
    except orjson.JSONDecodeError as error:
        raise _CaseError(f"response is not JSON: {response.text[:_DETAIL_CHARS]!r}") from error
    return parse_reply(payload)


async def run_case(client: httpx.AsyncClient, case: EvalCase, model: str, timeout_s: float) -> CaseResult:
    started = time.perf_counter()
    try:
        reply = await _complete(client, case, model, timeout_s)
    except _CaseError as error:
        latency = time.perf_counter() - started
        return CaseResult(
            case_id=case.id, tags=case.tags, weight=case.weight, passed=False, latency_s=latency, error=str(error)
        )
    latency = time.perf_counter() - started
    failures = []
    for index, assertion in enumerate(case.assertions):
        passed, message = check(assertion, reply)
        if not passed:
            failures.append(AssertionFailure(index=index, kind=assertion.kind, message=message))
    return CaseResult(
        case_id=case.id,
        tags=case.tags,
        weight=case.weight,
        passed=not failures,
        failures=tuple(failures),
        latency_s=latency,
        content=reply.content,
    )


async def run_eval(
    eval_set: EvalSet,
    base_url: str,
    api_key: str | None,
    model: str,
    concurrency: int = 4,
    timeout_s: float = 60.0,
    transport: httpx.AsyncBaseTransport | None = None,
) -> EvalResult:
    """Send every case once (at most `concurrency` at a time) and check its assertions."""
    if concurrency < 1 or timeout_s <= 0:
        raise ValueError("concurrency must be >= 1 and timeout_s > 0")
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, _CONNECT_TIMEOUT_CAP_S))
    limits = httpx.Limits(max_connections=concurrency)
    gate = asyncio.Semaphore(concurrency)

    async def bounded(client: httpx.AsyncClient, case: EvalCase) -> CaseResult:
        async with gate:
            return await run_case(client, case, model, timeout_s)

    # The trailing slash makes "chat/completions" resolve under the base path (…/v1/chat/completions).
    root = base_url.rstrip("/") + "/"
    async with httpx.AsyncClient(
        base_url=root, headers=headers, timeout=timeout, limits=limits, transport=transport
    ) as client:
        results = await asyncio.gather(*(bounded(client, case) for case in eval_set.cases))
    cases = tuple(results)
    return EvalResult(
        set_id=eval_set.id,
        set_version=eval_set.version,
        set_digest=eval_set.digest,
        set_threshold=eval_set.threshold,
        model=model,
        cases=cases,
        summary=summarize(cases),
    )
