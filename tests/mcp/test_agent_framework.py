"""A real agent framework end to end: the OpenAI Agents SDK runs an agent whose model is the
gateway (chat completions, the sim behind it) and whose tools come from the gateway's MCP
endpoint. Nothing in the agent code knows about approvals: a person decides, and the agent either
gets the tool's result or is told the call was not approved."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from openai import AsyncOpenAI

from testkit.procs import Gateway
from tests.e2e.test_tool_policy import approve_when_pending
from tests.mcp.client import wait_for_mcp_servers
from tests.mcp.test_endpoint import reject_when_pending


async def run_agent(gateway: Gateway, key: str, task: str) -> str:
    # Imported here: the SDK takes seconds to import, in every process that collects the tests.
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from agents.mcp import MCPServerStreamableHttp

    set_tracing_disabled(True)  # the SDK would otherwise export traces to OpenAI
    model = OpenAIChatCompletionsModel(
        model="sim-model", openai_client=AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
    )
    params = {"url": f"{gateway.url}/mcp", "headers": {"Authorization": f"Bearer {key}"}, "timeout": 10}
    async with MCPServerStreamableHttp(params, client_session_timeout_seconds=60) as tools:  # type: ignore[arg-type]
        agent = Agent(name="operator", instructions="Do what the user asks.", model=model, mcp_servers=[tools])
        result = await Runner.run(agent, task, max_turns=4)
    return str(result.final_output)


async def test_an_agent_gets_the_approved_tools_result_in_its_final_answer(gateway: Gateway) -> None:
    wait_for_mcp_servers(gateway)
    _, key = gateway.create_key(tenant="opsco")
    _, approver = gateway.create_key(tenant="opsco", scopes=["approver"])
    decided: list[Any] = []
    human = threading.Thread(target=approve_when_pending, args=(gateway, approver, "files__delete_file", decided))
    human.start()
    answer = await run_agent(gateway, key, "Clean up the old log file.")
    await asyncio.to_thread(human.join, 30)
    assert decided[0]["status"] == "approved"
    assert answer.startswith("The tool said: deleted ")
    assert answer.endswith(f"[approval {decided[0]['id']} verified]")


async def test_an_agent_whose_call_is_rejected_is_told_so(gateway: Gateway) -> None:
    wait_for_mcp_servers(gateway)
    _, key = gateway.create_key(tenant="opsco")
    _, approver = gateway.create_key(tenant="opsco", scopes=["approver"])
    decided: list[Any] = []
    human = threading.Thread(target=reject_when_pending, args=(gateway, approver, "files__delete_file", decided))
    human.start()
    answer = await run_agent(gateway, key, "Clean up the old log file.")
    await asyncio.to_thread(human.join, 30)
    assert answer == "The tool said: The call to 'files__delete_file' was not approved (rejected: not today)."
