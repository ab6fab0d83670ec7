"""The OpenAI Agents SDK with its default model provider, which speaks the Responses API: the
agent is configured by `OPENAI_BASE_URL` and `OPENAI_API_KEY` alone (issue 31). Each run takes a
new instance of the SDK's default provider (`MultiProvider`, what `Runner` uses when given none),
so that it reads the environment these tests set; the tests share one event loop, because the
provider's HTTP client is one per process and holds the loop it was first used in."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

import pytest

from testkit.procs import Gateway
from tests.e2e.test_tool_policy import approve_when_pending

if TYPE_CHECKING:
    from agents import RunConfig

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture
def default_provider(gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> RunConfig:
    # Imported here: the SDK takes seconds to import, in every process that collects the tests.
    from agents import MultiProvider, RunConfig, set_tracing_disabled

    monkeypatch.setenv("OPENAI_BASE_URL", f"{gateway.url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", gateway.key)
    set_tracing_disabled(True)  # the SDK would otherwise export traces to OpenAI
    return RunConfig(model_provider=MultiProvider())


async def test_an_agent_on_the_default_provider_runs_its_tool_and_answers(default_provider: RunConfig) -> None:
    from agents import Agent, Runner, function_tool

    calls: list[tuple[str, int]] = []

    @function_tool
    def get_weather(city: str, days: int) -> str:
        """Current weather."""
        calls.append((city, days))
        return f"sunny in {city}"

    agent = Agent(name="forecaster", instructions="Answer with the weather.", model="sim-model", tools=[get_weather])
    result = await Runner.run(agent, "What is the weather?", max_turns=4, run_config=default_provider)
    assert len(calls) == 1
    assert str(result.final_output).startswith(f"The tool said: sunny in {calls[0][0]}")


async def test_a_streamed_agent_run_on_the_default_provider_ends_the_same(default_provider: RunConfig) -> None:
    from agents import Agent, Runner, function_tool

    @function_tool
    def get_weather(city: str, days: int) -> str:
        """Current weather."""
        return f"rain in {city} for {days} days"

    agent = Agent(name="forecaster", instructions="Answer with the weather.", model="sim-model", tools=[get_weather])
    run = Runner.run_streamed(agent, "What is the weather?", max_turns=4, run_config=default_provider)
    kinds = [event.type async for event in run.stream_events()]
    assert "raw_response_event" in kinds
    assert str(run.final_output).startswith("The tool said: rain in ")


async def test_an_agents_risky_call_waits_for_a_persons_approval_and_then_runs(
    gateway: Gateway, default_provider: RunConfig
) -> None:
    """Nothing in the agent knows about approvals: its model call waits while a person decides."""
    from agents import Agent, Runner, function_tool

    refunded: list[str] = []

    @function_tool
    def refund_payment(order_id: str) -> str:
        """Refund an order."""
        refunded.append(order_id)
        return f"refunded {order_id}"

    _, approver = gateway.create_key(scopes=["approver"])
    decided: list[Any] = []
    human = threading.Thread(target=approve_when_pending, args=(gateway, approver, "refund_payment", decided))
    human.start()
    agent = Agent(name="clerk", instructions="Refund what is asked.", model="sim-model", tools=[refund_payment])
    result = await Runner.run(agent, "Refund my last order.", max_turns=4, run_config=default_provider)
    await asyncio.to_thread(human.join, 30)
    assert decided[0]["status"] == "approved"
    assert len(refunded) == 1
    assert str(result.final_output).startswith(f"The tool said: refunded {refunded[0]}")
