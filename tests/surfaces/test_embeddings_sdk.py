"""Embeddings (`POST /v1/embeddings`) through the official `openai` SDK (issue 32): routed over the
deployments that serve them, past one that is down, audited and charged as any request."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest
from openai import AsyncOpenAI, BadRequestError

from common.processes import Announced
from gateway.settings import DeploymentSettings
from sim.embeddings import vector
from testkit.procs import Gateway, audit_records, deployment, gateway_config, running_gateway


@pytest.fixture(scope="module")
def gateway(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with socket.socket() as probe:  # a port nothing listens on: every attempt there is refused
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    embedders = [
        deployment("down", sim_pair[0], api_base=dead, serves=["embeddings"], priority=0),
        deployment("up", sim_pair[0], serves=["embeddings"], priority=1),
    ]
    models = [
        {"name": "sim-model", "deployments": [deployment("chat", sim_pair[0])]},
        {"name": "sim-embed", "strategy": "priority", "deployments": embedders},
    ]
    with running_gateway(tmp_path_factory.mktemp("embeddings"), gateway_config(models=models)) as running:
        yield running


def client(gateway: Gateway) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key, max_retries=0, timeout=20)


async def test_embeddings_come_from_a_deployment_that_serves_them_past_one_that_is_down(gateway: Gateway) -> None:
    texts = ["circuit breakers trip", "a second input"]
    async with client(gateway) as sdk:
        # The SDK asks for base64 unless told otherwise, and decodes it: both encodings are exercised.
        packed = await sdk.embeddings.create(model="sim-embed", input=texts)
        floats = await sdk.embeddings.create(model="sim-embed", input=texts, encoding_format="float", dimensions=16)
    assert [item.index for item in packed.data] == [0, 1]
    for item, text in zip(packed.data, texts, strict=True):
        assert item.embedding == pytest.approx(vector("sim-model", text, 8), abs=1e-6)
    assert [len(item.embedding) for item in floats.data] == [16, 16]
    assert floats.data[0].embedding == pytest.approx(vector("sim-model", texts[0], 16))
    assert packed.usage.prompt_tokens == 6
    assert packed.model == "sim-embed"


async def test_every_embeddings_request_is_audited_with_its_input_tokens(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        raw = await sdk.embeddings.with_raw_response.create(model="sim-embed", input="three words here")
    request_id = raw.headers["x-request-id"]
    records = audit_records(gateway, "request", lambda rs: any(r.get("request_id") == request_id for r in rs))
    (record,) = [r for r in records if r.get("request_id") == request_id]
    assert record["surface"] == "embeddings"
    assert record["prompt_tokens"] == 3
    assert record["completion_tokens"] == 0
    assert record["deployments"] == ["down", "up"]  # the refused one first, then the one that answered


async def test_a_model_that_serves_no_embeddings_says_so(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        with pytest.raises(BadRequestError) as raised:
            await sdk.embeddings.create(model="sim-model", input="x")
    assert raised.value.param == "model"
    assert "serves no embeddings" in raised.value.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "sim-embed"}, "input"),
        ({"model": "sim-embed", "input": []}, "input"),
        ({"model": "sim-embed", "input": [1, "a"]}, "input"),
        ({"model": "sim-embed", "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "sim-embed", "input": "x", "dimensions": 0}, "dimensions"),
        ({"model": "sim-embed", "input": "x", "stream": True}, "stream"),
    ],
)
async def test_a_bad_embeddings_request_is_a_400_naming_the_field(
    gateway: Gateway, body: dict[str, object], param: str
) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.post(f"{gateway.url}/v1/embeddings", json=body, headers=gateway.headers())
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_a_deployment_of_a_provider_without_embeddings_cannot_say_it_serves_them() -> None:
    with pytest.raises(ValueError, match="serves: embeddings needs kind: openai"):
        DeploymentSettings.model_validate(
            {
                "name": "x",
                "kind": "litellm",
                "api_base": "http://127.0.0.1:9/v1",
                "model": "m",
                "serves": ["embeddings"],
            }
        )
