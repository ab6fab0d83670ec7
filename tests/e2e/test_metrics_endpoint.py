"""`GET /metrics` on a gateway process: Prometheus text, no key needed, the request counted."""

from __future__ import annotations

from pathlib import Path

import httpx

from common.processes import Announced
from testkit.procs import deployment, gateway_config, running_gateway


def metric_lines(url: str) -> list[str]:
    reply = httpx.get(f"{url}/metrics", timeout=10)  # no Authorization header: scrapers carry no key
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain; version=")
    return reply.text.splitlines()


def test_a_served_gateway_exposes_the_request_counter_after_a_request(tmp_path: Path, sims: list[Announced]) -> None:
    config = gateway_config(deployment("a", sims[0]), deployment("b", sims[1], priority=1))
    with running_gateway(tmp_path, config) as gateway:
        assert not [line for line in metric_lines(gateway.url) if line.startswith("gateway_requests_total{")]
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "Count me"}], "stream": True}
        reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(), timeout=10)
        assert reply.status_code == 200

        lines = metric_lines(gateway.url)
        a, b = (f'gateway_deployment="{name}",gen_ai_request_model="sim-model"' for name in "ab")
        requests = 'gateway_deployment="a",gateway_surface="chat.completions",gen_ai_request_model="sim-model"'
        assert f'gateway_requests_total{{{requests},http_response_status_code="200"}} 1.0' in lines
        assert f"gateway_upstream_time_to_first_token_seconds_count{{{a}}} 1.0" in lines
        assert f"gateway_deployment_inflight{{{a}}} 0.0" in lines
        assert f"gateway_deployment_breaker_state{{{b}}} 0.0" in lines
        assert "Count me" not in "\n".join(lines)
