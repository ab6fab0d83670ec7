import random

import pytest

from gateway.core.chunks import Chunk, ToolCallDelta
from gateway.core.route_log import RouteLog
from gateway.errors import (
    NoDeploymentAvailable,
    RateLimited,
    StreamInterrupted,
    UpstreamConnectError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from gateway.routing.deployment import Availability, Deployment
from gateway.routing.router import ModelGroup, Router
from gateway.routing.strategies import STRATEGIES
from gateway.settings import Continuation, DeploymentSettings, RoutingSettings, Strategy
from tests.doubles import Script, ScriptedBackend

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def make_router(
    *backends: ScriptedBackend,
    strategy: Strategy = Strategy.PRIORITY,
    continuation: Continuation = Continuation.NONE,
    **routing: object,
) -> Router:
    settings = RoutingSettings.model_validate({"retry": {"backoff_base_s": 0.001}, **routing})
    deployments = [
        Deployment(
            DeploymentSettings(
                name=b.name,
                api_base="http://127.0.0.1:1/v1",
                model=f"{b.name}-model",
                priority=i,
                continuation=continuation,
            ),
            b,
            settings,
        )
        for i, b in enumerate(backends)
    ]
    group = ModelGroup("m", deployments, STRATEGIES[strategy], settings)
    return Router({"m": group}, settings, rng=random.Random(7))


async def collect(router: Router, log: RouteLog | None = None) -> list[Chunk]:
    return [c async for c in router.stream("m", BODY, log or RouteLog())]


def text(chunks: list[Chunk]) -> str:
    return "".join(c.content or "" for c in chunks)


async def test_request_is_addressed_to_the_deployments_own_model_name() -> None:
    a = ScriptedBackend("a", Script())
    await collect(make_router(a))
    assert a.requests[0].body["model"] == "a-model"
    assert a.requests[0].body["messages"] == BODY["messages"]


async def test_connect_error_fails_over_to_the_next_deployment() -> None:
    a = ScriptedBackend("a", Script(error=UpstreamConnectError("refused")))
    b = ScriptedBackend("b", Script(tokens=["fine"]))
    log = RouteLog()
    chunks = await collect(make_router(a, b), log)
    assert text(chunks) == "fine"
    assert [(x.deployment, x.error) for x in log.attempts] == [("a", "connect_error"), ("b", None)]


async def test_failure_after_first_token_without_a_continuable_fallback_is_interrupted() -> None:
    a = ScriptedBackend("a", Script(tokens=["one", "two"], error=UpstreamProtocolError("cut"), fail_after=1))
    b = ScriptedBackend("b", Script())
    seen: list[Chunk] = []

    async def consume() -> None:
        async for chunk in make_router(a, b).stream("m", BODY, RouteLog()):
            seen.append(chunk)

    with pytest.raises(NoDeploymentAvailable, match="continue"):
        await consume()
    assert text(seen) == "one"
    assert b.requests == []


async def test_failure_mid_stream_continues_on_the_next_deployment() -> None:
    a = ScriptedBackend("a", Script(tokens=["one", " two"], error=UpstreamProtocolError("cut"), fail_after=1))
    b = ScriptedBackend("b", Script(tokens=[" two", " three"]))
    body = {**BODY, "max_tokens": 3}
    log = RouteLog()
    chunks = [c async for c in make_router(a, b, continuation=Continuation.VLLM).stream("m", body, log)]
    assert text(chunks) == "one two three"
    assert sum(1 for c in chunks if c.role) == 1, "the continuation's role chunk is not repeated"
    sent = b.requests[0].body
    assert sent["messages"][-1] == {"role": "assistant", "content": "one"}
    assert sent["continue_final_message"] is True
    assert sent["add_generation_prompt"] is False
    assert sent["max_tokens"] == 2
    assert log.failovers == 1


async def test_continuation_budget_and_usage_count_the_tokens_the_upstream_reported() -> None:
    # vLLM merges tokens into one chunk when its reader lags; asked for continuous usage stats,
    # every chunk says how many tokens the answer has so far. Counting chunks would give the
    # continuation too large a max_tokens (a longer answer than an uninterrupted run) and
    # under-charge the tokens of the failed attempt.
    a = ScriptedBackend("a", Script(tokens=[], error=UpstreamProtocolError("cut"), fail_after=0))
    a.prelude = [Chunk(content="one", tokens=1), Chunk(content=" two three", tokens=3)]
    b = ScriptedBackend("b", Script(tokens=[" four"]))
    body = {**BODY, "max_tokens": 5}
    chunks = [c async for c in make_router(a, b, continuation=Continuation.VLLM).stream("m", body, RouteLog())]
    assert text(chunks) == "one two three four"
    assert b.requests[0].body["max_tokens"] == 2
    assert next(c.usage.completion_tokens for c in chunks if c.usage) == 3  # the failed attempt's share


async def test_failovers_stop_at_max_failovers() -> None:
    cut = Script(tokens=["x", "y"], error=UpstreamProtocolError("cut"), fail_after=1)
    a, b = ScriptedBackend("a", cut), ScriptedBackend("b", cut)
    router = make_router(a, b, continuation=Continuation.VLLM, max_failovers=1)
    with pytest.raises(StreamInterrupted):
        await collect(router)


async def test_half_streamed_tool_call_is_never_sent_and_is_restarted() -> None:
    call_start = Chunk(tool_calls=[ToolCallDelta(0, "call_1", "get_weather", '{"ci')])
    broken = ScriptedBackend("a", Script(tokens=[]))
    broken.prelude = [call_start]
    broken_script_error = UpstreamProtocolError("cut inside the call")
    broken._scripts = [Script(tokens=[], error=broken_script_error, fail_after=0)]
    whole = ScriptedBackend("b", Script(tokens=[]))
    whole.prelude = [
        Chunk(tool_calls=[ToolCallDelta(0, "call_2", "get_weather", '{"city":')]),
        Chunk(tool_calls=[ToolCallDelta(0, None, None, ' "Paris"}')]),
    ]
    chunks = [c async for c in make_router(broken, whole).stream("m", BODY, RouteLog())]
    calls = [t for c in chunks for t in c.tool_calls]
    assert len(calls) == 1
    assert (calls[0].id, calls[0].name, calls[0].arguments) == ("call_2", "get_weather", '{"city": "Paris"}')


async def test_role_only_chunk_does_not_commit_the_attempt() -> None:
    a = ScriptedBackend("a", Script(tokens=["x"], error=UpstreamConnectError("reset"), fail_after=0))
    b = ScriptedBackend("b", Script(tokens=["ok"]))
    chunks = await collect(make_router(a, b))
    assert text(chunks) == "ok"
    assert sum(1 for c in chunks if c.role == "assistant") == 1, "the failed attempt's role chunk was held back"


async def test_client_error_from_upstream_is_returned_with_its_status_and_not_retried() -> None:
    a = ScriptedBackend("a", Script(error=UpstreamStatusError("context too long", upstream_status=400)))
    b = ScriptedBackend("b", Script())
    with pytest.raises(UpstreamStatusError) as raised:
        await collect(make_router(a, b))
    assert raised.value.status == 400
    assert b.requests == []


async def test_429_everywhere_becomes_rate_limited_with_retry_after() -> None:
    err = UpstreamStatusError("slow down", upstream_status=429, retry_after_s=3)
    a = ScriptedBackend("a", Script(error=err))
    b = ScriptedBackend("b", Script(error=err))
    with pytest.raises(RateLimited) as raised:
        await collect(make_router(a, b))
    assert raised.value.headers() == {"Retry-After": "3"}


async def test_429_with_retry_after_cools_the_deployment_down() -> None:
    a = ScriptedBackend("a", Script(error=UpstreamStatusError("busy", upstream_status=429, retry_after_s=30)))
    b = ScriptedBackend("b", Script())
    router = make_router(a, b)
    await collect(router)
    assert router.groups["m"].deployments[0].availability() is Availability.COOLING
    log = RouteLog()
    await collect(router, log)
    assert [x.deployment for x in log.attempts] == ["b"], "a cooling deployment goes behind the others"


async def test_breaker_opens_and_then_no_deployment_is_available() -> None:
    a = ScriptedBackend("a", Script(error=UpstreamStatusError("down", upstream_status=503)))
    router = make_router(a, breaker={"failure_threshold": 2, "cooldown_s": 60}, retry={"max_attempts": 1})
    for _ in range(2):
        with pytest.raises(UpstreamStatusError):
            await collect(router)
    with pytest.raises(NoDeploymentAvailable):
        await collect(router)
    assert a.requests.__len__() == 2


async def test_full_deployments_answer_429() -> None:
    a = ScriptedBackend("a", Script())
    router = make_router(a)
    router.groups["m"].deployments[0].inflight = 256
    with pytest.raises(RateLimited):
        await collect(router)


async def test_full_deployment_fails_over_to_one_with_room() -> None:
    a, b = ScriptedBackend("a", Script()), ScriptedBackend("b", Script())
    router = make_router(a, b)
    router.groups["m"].deployments[0].inflight = 256
    log = RouteLog()
    await collect(router, log)
    assert [x.deployment for x in log.attempts] == ["b"]


async def test_abandoned_stream_releases_its_inflight_slot() -> None:
    a = ScriptedBackend("a", Script(tokens=["a", "b", "c"]))
    router = make_router(a)
    stream = router.stream("m", BODY, RouteLog())
    await anext(stream)
    assert router.groups["m"].deployments[0].inflight == 1
    await stream.aclose()
    assert router.groups["m"].deployments[0].inflight == 0


async def test_priority_prefers_lower_priority_number() -> None:
    a, b = ScriptedBackend("a", Script()), ScriptedBackend("b", Script())
    router = make_router(a, b)
    for _ in range(5):
        await collect(router)
    assert len(a.requests) == 5
    assert b.requests == []


async def test_weighted_spreads_traffic_over_deployments() -> None:
    a, b = ScriptedBackend("a", Script()), ScriptedBackend("b", Script())
    router = make_router(a, b, strategy=Strategy.WEIGHTED)
    for _ in range(40):
        await collect(router)
    assert len(a.requests) > 5
    assert len(b.requests) > 5


async def test_failure_after_the_last_allowed_token_ends_with_length_not_a_fallback() -> None:
    a = ScriptedBackend("a", Script(tokens=["one", " two"], error=UpstreamProtocolError("cut"), fail_after=2))
    b = ScriptedBackend("b", Script(tokens=[" three"]))
    body = {**BODY, "max_tokens": 2}
    chunks = [c async for c in make_router(a, b, continuation=Continuation.VLLM).stream("m", body, RouteLog())]
    assert text(chunks) == "one two"
    assert [c.finish_reason for c in chunks if c.finish_reason] == ["length"]
    assert b.requests == []


@pytest.mark.parametrize("own_limit", [True, False])
async def test_only_a_deployments_own_timeout_opens_its_breaker_at_once(own_limit: bool) -> None:
    timeout = UpstreamTimeout("silent", phase="stall", deployment_limit=own_limit)
    a = ScriptedBackend("a", Script(tokens=["x", "y"], error=timeout, fail_after=1))
    b = ScriptedBackend("b", Script(tokens=["y"]))
    router = make_router(a, b, continuation=Continuation.VLLM, breaker={"failure_threshold": 5})
    assert text(await collect(router)) == "xy"
    # A request's deadline share running out is the request's budget, not the deployment's fault.
    expected = Availability.OPEN if own_limit else Availability.READY
    assert router.groups["m"].deployments[0].availability() is expected
