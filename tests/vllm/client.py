"""What the `vllm` tests send through the gateway, and how they read the answers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from testkit.procs import Gateway
from tests.vllm.servers import VllmServer

MODEL = "tiny"
ZEN_PROMPT = "Recite the zen."


def vllm_deployment(name: str, server: VllmServer, via: str | None = None, **overrides: Any) -> dict[str, Any]:
    """A gateway deployment for one vLLM engine (reached `via` a tap's URL if given): continuation
    on, vLLM's /health probed."""
    return {
        "name": name,
        "api_base": f"{via or server.url}/v1",
        "model": MODEL,
        "continuation": "vllm",
        "health_path": f"{server.url}/health",
        # A loaded 2-core machine: a first token can take seconds; a silent stream 5 s is dead.
        "timeouts": {"connect_s": 2, "first_token_s": 60, "stall_s": 5},
        **overrides,
    }


def vllm_gateway_config(*deployments: dict[str, Any], **sections: Any) -> dict[str, Any]:
    routing = {"retry": {"backoff_base_s": 0.01}, "health": {"interval_s": 30}, **sections.pop("routing", {})}
    return {"routing": routing, "models": [{"name": MODEL, "deployments": list(deployments)}], **sections}


def admin(gateway: Gateway, path: str, body: dict[str, Any]) -> httpx.Response:
    """POST to the release admin API of the test model (`releases`, `promote`, `rollback`)."""
    return httpx.post(
        f"{gateway.url}/admin/models/{MODEL}/{path}", json=body, headers=gateway.headers(gateway.admin_key), timeout=120
    )


def chat_body(prompt: str = ZEN_PROMPT, max_tokens: int = 380, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


def direct_answer(server: VllmServer, body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's own non-streamed answer to `body`: the reference an interrupted stream must equal."""
    reply = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={**body, "stream": False, "stream_options": None},
        timeout=120,
    )
    reply.raise_for_status()
    return dict(reply.json())


@dataclass
class StreamResult:
    events: list[Any] = field(default_factory=list)
    text: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def usage(self) -> dict[str, Any]:
        with_usage = [e for e in self.events if isinstance(e, dict) and e.get("usage")]
        return dict(with_usage[-1]["usage"]) if with_usage else {}

    @property
    def errors(self) -> list[Any]:
        return [e for e in self.events if isinstance(e, dict) and "error" in e]

    @property
    def finish_reasons(self) -> list[str]:
        return [
            c["finish_reason"]
            for e in self.events
            if isinstance(e, dict)
            for c in e.get("choices", ())
            if c.get("finish_reason")
        ]

    @property
    def ids(self) -> set[str]:
        return {e["id"] for e in self.events if isinstance(e, dict) and "id" in e}

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return [
            call
            for e in self.events
            if isinstance(e, dict)
            for c in e.get("choices", ())
            for call in c["delta"].get("tool_calls") or ()
        ]


def stream_through(
    gateway: Gateway, body: dict[str, Any], key: str | None = None, timeout_s: float = 180
) -> StreamResult:
    """Stream `body` through the gateway (as `key`, default the gateway's chat key) to the end."""
    result = StreamResult()
    headers = gateway.headers(key)
    with httpx.stream(
        "POST", f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=timeout_s
    ) as reply:
        result.headers = dict(reply.headers)
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            event = "[DONE]" if line == "data: [DONE]" else orjson.loads(line[6:])
            result.events.append(event)
            if isinstance(event, dict):
                for choice in event.get("choices", ()):
                    result.text += choice["delta"].get("content") or ""
    return result


@dataclass
class ResponsesStreamResult:
    """A streamed Responses API answer, read to its end."""

    events: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""

    @property
    def final(self) -> dict[str, Any]:
        """The response its terminal event carries."""
        return dict(self.events[-1]["response"])


def respond_through(
    gateway: Gateway, body: dict[str, Any], key: str | None = None, timeout_s: float = 180, path: str = "/v1/responses"
) -> ResponsesStreamResult:
    """Stream `body` through the gateway's `/v1/responses` (or another API of typed events, `path`)
    to its end."""
    result = ResponsesStreamResult()
    with httpx.stream(
        "POST", f"{gateway.url}{path}", json=body, headers=gateway.headers(key), timeout=timeout_s
    ) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if line.startswith("data: "):
                event = orjson.loads(line[6:])
                result.events.append(event)
                if event.get("type") == "response.output_text.delta":
                    result.text += event["delta"]
    return result


def metric_total(server: VllmServer, name: str) -> float:
    """Sum of a counter's samples on vLLM's /metrics (e.g. vllm:prompt_tokens_total)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total
