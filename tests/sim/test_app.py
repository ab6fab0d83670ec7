from __future__ import annotations

import base64
import struct
import time
from typing import Any

import httpx
import orjson
import pytest

from sim.app import create_sim_app
from sim.embeddings import vector
from sim.profile import SimProfile
from sim.respond import SimulatedCut
from sim.text import generate_tokens
from tests.sim.sse import DONE, content_tokens, sse_events, sse_payloads

MESSAGES = [{"role": "user", "content": "Say something."}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": "sim-model", "messages": MESSAGES, **extra}


async def post_chat(client: httpx.AsyncClient, fault: str | None = None, **extra: Any) -> httpx.Response:
    headers = {"X-Sim-Fault": fault} if fault is not None else {}
    return await client.post("/v1/chat/completions", json=chat_body(**extra), headers=headers)


def assert_openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str)
    return dict(error)


async def test_stream_sends_role_tokens_finish_usage_and_done(client: httpx.AsyncClient) -> None:
    response = await post_chat(client, stream=True, max_tokens=6, stream_options={"include_usage": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == DONE
    first, *token_chunks, finish, usage, _ = events
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["object"] == "chat.completion.chunk"
    assert first["id"].startswith("chatcmpl-sim-")
    assert all(e["id"] == first["id"] and e["model"] == "sim-model" for e in events[:-1])
    assert content_tokens(events) == generate_tokens("sim-model", MESSAGES, 6)
    assert len(token_chunks) == 6
    assert finish["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}


async def test_stream_without_include_usage_has_no_usage_chunk(client: httpx.AsyncClient) -> None:
    events = sse_events((await post_chat(client, stream=True)).text)
    assert all("usage" not in e for e in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert len(content_tokens(events)) == len(generate_tokens("sim-model", MESSAGES))


async def test_non_stream_returns_the_same_text_with_usage(client: httpx.AsyncClient) -> None:
    response = await post_chat(client, model="any-model-name", max_completion_tokens=9)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == "any-model-name"
    assert body["id"].startswith("chatcmpl-sim-")
    choice = body["choices"][0]
    assert choice["message"] == {
        "role": "assistant",
        "content": "".join(generate_tokens("any-model-name", MESSAGES, 9)),
    }
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (b"not json", None),
        (b"[1, 2]", None),
        (b'{"model": "m"}', "messages"),
        (b'{"model": "m", "messages": []}', "messages"),
        (b'{"model": "m", "messages": ["hi"]}', "messages[0]"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": 0}', "max_tokens"),
        (b'{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}', "stream"),
    ],
)
async def test_bad_body_is_a_400_openai_error(client: httpx.AsyncClient, content: bytes, param: str | None) -> None:
    response = await client.post("/v1/chat/completions", content=content)
    error = assert_openai_error(response, 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


async def test_unknown_fields_are_ignored(client: httpx.AsyncClient) -> None:
    response = await post_chat(client, temperature=0.3, seed=5, logit_bias={}, frobnicate=True)
    assert response.status_code == 200


async def test_bad_fault_header_is_a_400(client: httpx.AsyncClient) -> None:
    error = assert_openai_error(await post_chat(client, fault="explode=yes"), 400)
    assert error["param"] == "X-Sim-Fault"


async def test_status_fault_returns_that_status_with_an_openai_error(client: httpx.AsyncClient) -> None:
    error = assert_openai_error(await post_chat(client, fault="status=503"), 503)
    assert error["type"] == "server_error"


async def test_rate_limit_fault_sends_retry_after(client: httpx.AsyncClient) -> None:
    response = await post_chat(client, fault="status=429,retry_after=1")
    assert assert_openai_error(response, 429)["type"] == "rate_limit_error"
    assert response.headers["retry-after"] == "1"
    assert response.headers["retry-after-ms"] == "1000"


async def test_stream_inband_error_arrives_after_k_tokens(client: httpx.AsyncClient) -> None:
    response = await post_chat(client, fault="inband_error_after=3", stream=True, max_tokens=8)
    assert response.status_code == 200
    events = sse_events(response.text)
    assert len(content_tokens(events)) == 3
    assert events[-2]["error"]["code"] == "sim_inband_error"
    assert events[-1] == DONE


async def test_non_stream_inband_error_is_a_200_with_an_error_body(client: httpx.AsyncClient) -> None:
    response = await post_chat(client, fault="inband_error_after=2", max_tokens=5)
    assert response.status_code == 200
    assert response.json()["error"]["code"] == "sim_inband_error"


async def test_malformed_chunk_arrives_after_k_tokens_and_the_stream_goes_on(
    client: httpx.AsyncClient,
) -> None:
    response = await post_chat(client, fault="malformed_after=2", stream=True, max_tokens=5)
    payloads = sse_payloads(response.text)
    bad = [i for i, p in enumerate(payloads) if p != DONE and not _is_json(p)]
    # role chunk, two tokens, then the broken line
    assert bad == [3]
    good = [orjson.loads(p) for p in payloads if p != DONE and _is_json(p)]
    assert content_tokens(good) == generate_tokens("sim-model", MESSAGES, 5)
    assert payloads[-1] == DONE


async def test_non_stream_malformed_fault_truncates_the_json(client: httpx.AsyncClient) -> None:
    response = await post_chat(client, fault="malformed_after=1", max_tokens=5)
    assert response.status_code == 200
    assert not _is_json(response.text)


async def test_cut_fault_raises_out_of_the_app_so_the_server_drops_the_connection(
    client: httpx.AsyncClient,
) -> None:
    with pytest.raises(SimulatedCut):
        await post_chat(client, fault="cut_after=2", stream=True, max_tokens=5)


async def test_fault_past_the_end_of_the_reply_never_fires(client: httpx.AsyncClient) -> None:
    response = await post_chat(client, fault="cut_after=50", stream=True, max_tokens=5)
    assert sse_events(response.text)[-1] == DONE


async def test_error_rate_one_fails_every_request(fast_profile: SimProfile) -> None:
    app = create_sim_app(fast_profile.model_copy(update={"seed": 3}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as http:
        statuses = {(await post_chat(http, fault="error_rate=1")).status_code for _ in range(5)}
        assert statuses == {500}
        control = (await http.get("/sim/control")).json()
    assert control["counters"]["faults_fired"] == {"error_rate": 5}


async def test_tool_call_stream_sends_header_then_argument_fragments(client: httpx.AsyncClient) -> None:
    response = await post_chat(client, stream=True, tools=[WEATHER_TOOL], tool_choice="auto")
    events = sse_events(response.text)
    deltas = [e["choices"][0]["delta"] for e in events[1:-2]]
    header = deltas[0]["tool_calls"][0]
    assert header["index"] == 0
    assert header["type"] == "function"
    assert header["id"].startswith("call_")
    assert header["function"] == {"name": "get_weather", "arguments": ""}
    fragments = [d["tool_calls"][0]["function"]["arguments"] for d in deltas[1:]]
    assert len(fragments) > 1
    arguments = orjson.loads("".join(fragments))
    assert isinstance(arguments["city"], str)
    assert isinstance(arguments["days"], int)
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"

    whole = (await post_chat(client, tools=[WEATHER_TOOL])).json()
    message = whole["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"][0]["function"]["arguments"] == "".join(fragments)
    assert message["tool_calls"][0]["id"] == header["id"]
    assert whole["usage"]["completion_tokens"] == 1 + len(fragments)


async def test_reply_to_a_tool_result_is_text(client: httpx.AsyncClient) -> None:
    messages = [*MESSAGES, {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    body = {"model": "sim-model", "messages": messages, "tools": [WEATHER_TOOL]}
    response = await client.post("/v1/chat/completions", json=body)
    assert isinstance(response.json()["choices"][0]["message"]["content"], str)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("flag", [{"continue_final_message": True, "add_generation_prompt": False}, {}])
async def test_continuation_request_returns_only_the_missing_tokens(
    client: httpx.AsyncClient, stream: bool, flag: dict[str, Any]
) -> None:
    full = generate_tokens("sim-model", MESSAGES, 10)
    for k in (0, 4, 9):
        messages = [*MESSAGES, {"role": "assistant", "content": "".join(full[:k])}]
        # max_tokens counts only the new tokens, as vLLM does for continue_final_message
        body = {"model": "sim-model", "messages": messages, "max_tokens": 10 - k, "stream": stream, **flag}
        body["stream_options"] = {"include_usage": True}
        response = await client.post("/v1/chat/completions", json=body)
        if stream:
            events = sse_events(response.text)
            text, usage = "".join(content_tokens(events)), events[-2]["usage"]
        else:
            text, usage = response.json()["choices"][0]["message"]["content"], response.json()["usage"]
        assert text == "".join(full[k:])
        assert usage["completion_tokens"] == 10 - k


async def test_models_lists_the_profile_model_ids(client: httpx.AsyncClient) -> None:
    body = (await client.get("/v1/models")).json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["sim-model", "sim-large"]
    assert all(m["object"] == "model" for m in body["data"])


async def test_health_reports_ok_then_the_process_status_fault(client: httpx.AsyncClient) -> None:
    assert (await client.get("/health")).json() == {"status": "ok"}
    await client.put("/sim/control/faults", json={"status": 503})
    assert_openai_error(await client.get("/health"), 503)
    await client.put("/sim/control/faults", json={"status": 429})
    assert (await client.get("/health")).status_code == 200


async def test_control_faults_apply_to_requests_until_reset(client: httpx.AsyncClient) -> None:
    put = await client.put("/sim/control/faults", json={"status": 502, "slow": 2})
    assert put.json()["faults"]["status"] == 502
    assert (await post_chat(client)).status_code == 502
    # A request header replaces the process faults for that request only.
    assert (await post_chat(client, fault="slow=1")).status_code == 200
    control = (await client.get("/sim/control")).json()
    assert control["faults"]["slow"] == 2
    assert control["counters"]["requests"] == 2
    assert control["counters"]["by_status"] == {"502": 1, "200": 1}
    assert control["counters"]["in_flight"] == 0

    reset = (await client.post("/sim/control/reset")).json()
    assert reset["faults"] == reset["profile"]["faults"]
    assert reset["counters"]["requests"] == 0
    assert (await post_chat(client)).status_code == 200


@pytest.mark.parametrize("body", [b"{", b"[]", b'{"status": 200}', b'{"nonsense": 1}'])
async def test_bad_control_faults_are_rejected_and_kept(client: httpx.AsyncClient, body: bytes) -> None:
    assert_openai_error(await client.put("/sim/control/faults", content=body), 400)
    assert (await client.get("/sim/control")).json()["faults"]["status"] is None


async def test_reply_takes_ttft_plus_tokens_times_tpot_scaled_by_slow() -> None:
    app = create_sim_app(SimProfile(ttft_ms=30, tpot_ms=10, jitter=0))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as http:
        for fault, floor in (("none", 0.07), ("slow=2", 0.14)):
            for stream in (False, True):
                started = time.perf_counter()
                response = await post_chat(http, fault=fault, max_tokens=5, stream=stream)
                assert response.status_code == 200
                assert time.perf_counter() - started >= floor


def _is_json(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


async def test_unknown_route_and_wrong_method_get_openai_errors(client: httpx.AsyncClient) -> None:
    assert_openai_error(await client.get("/v1/no-such-route"), 404)
    assert_openai_error(await client.get("/v1/chat/completions"), 405)
    assert_openai_error(await client.get("/v1/embeddings"), 405)


async def test_embeddings_are_the_same_for_the_same_input_and_come_as_floats_or_base64(
    client: httpx.AsyncClient,
) -> None:
    texts = ["one two", "three"]
    body = {"model": "sim-model", "input": texts, "dimensions": 4}
    floats = (await client.post("/v1/embeddings", json=body)).json()
    packed = (await client.post("/v1/embeddings", json={**body, "encoding_format": "base64"})).json()
    assert [item["embedding"] for item in floats["data"]] == [vector("sim-model", t, 4) for t in texts]
    decoded = struct.unpack("<4f", base64.b64decode(packed["data"][0]["embedding"]))
    assert decoded == pytest.approx(floats["data"][0]["embedding"], abs=1e-6)
    assert floats["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert_openai_error(await client.post("/v1/embeddings", json={"model": "sim-model", "input": []}), 400)


async def test_length_fault_ignores_max_tokens_and_finishes_with_stop(client: httpx.AsyncClient) -> None:
    response = await post_chat(client, "length=40", stream=True, max_tokens=5)
    events = sse_events(response.text)
    assert content_tokens(events) == generate_tokens("sim-model", MESSAGES, 40)
    assert [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"]][-1] == "stop"


async def test_chunk_tokens_fault_sends_that_many_tokens_per_event(client: httpx.AsyncClient) -> None:
    response = await post_chat(client, "chunk_tokens=4", stream=True, max_tokens=10)
    payloads = [e for e in sse_events(response.text)[:-1] if e["choices"] and e["choices"][0]["delta"].get("content")]
    tokens = generate_tokens("sim-model", MESSAGES, 10)
    assert [p["choices"][0]["delta"]["content"] for p in payloads] == [
        "".join(tokens[0:4]),
        "".join(tokens[4:8]),
        "".join(tokens[8:10]),
    ]


@pytest.mark.parametrize("lie", ["0", "-1", "1.5", "18446744073709551616", "1e308"])
async def test_usage_fault_reports_every_figure_as_that_value(client: httpx.AsyncClient, lie: str) -> None:
    response = await post_chat(client, f"usage={lie}", max_tokens=3)
    usage = response.json()["usage"]
    expected = orjson.loads(lie) if lie != "1e308" else 1e308
    assert usage == {"prompt_tokens": expected, "completion_tokens": expected, "total_tokens": expected}


async def test_a_continued_answer_counts_its_prefix_but_no_new_turn_as_prompt(client: httpx.AsyncClient) -> None:
    first = (await post_chat(client, max_tokens=8)).json()
    partial = "".join(generate_tokens("sim-model", MESSAGES, 5))
    body = chat_body(max_tokens=3, messages=[*MESSAGES, {"role": "assistant", "content": partial}])
    continued = (await client.post("/v1/chat/completions", json=body)).json()
    assert continued["usage"]["prompt_tokens"] == first["usage"]["prompt_tokens"] + 5
