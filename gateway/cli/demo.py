"""`gateway demo`: the gateway on its embedded defaults plus two simulated backends, on loopback."""

from __future__ import annotations

import click

from gateway.cli.processes import Announced, start_announcing
from gateway.cli.serving import base_url, bind, serve
from gateway.settings import parse_settings

_SNIPPET = """
Ready. Paste this into Python (pip install openai):

    from openai import OpenAI
    client = OpenAI(base_url="{url}/v1", api_key="{key}")
    stream = client.chat.completions.create(
        model="sim-model",
        messages=[{{"role": "user", "content": "Hello!"}}],
        stream=True,
    )
    for chunk in stream:
        print(chunk.choices[0].delta.content or "", end="", flush=True)

Or: curl {url}/v1/chat/completions -H 'authorization: Bearer {key}' \\
      -d '{{"model": "sim-model", "messages": [{{"role": "user", "content": "Hello!"}}]}}'

The key above belongs to tenant "demo" (600 requests/min). State (keys, audit log): {data}
Health: {url}/readyz    Stop: Ctrl-C
"""


def demo_settings(sim_urls: list[str]) -> dict[str, object]:
    deployments = [
        {
            "name": f"sim-{i + 1}",
            "api_base": f"{url}/v1",
            "model": "sim-model",
            "priority": i,
            "continuation": "vllm",
        }
        for i, url in enumerate(sim_urls)
    ]
    return {"models": [{"name": "sim-model", "deployments": deployments}]}


@click.command("demo")
@click.option("--port", type=int, default=8080, show_default=True, help="the gateway's port; 0 picks one")
@click.option("--sim-ports", default="9101,9102", show_default=True, help="ports of the two simulated backends")
def demo_command(port: int, sim_ports: str) -> None:
    """Run the gateway with two simulated backends and print a ready-to-paste SDK snippet."""
    from gateway.app import create_app

    sims: list[Announced] = []
    try:
        for sim_port in sim_ports.split(","):
            sims.append(start_announcing(["gateway.sim", "--host", "127.0.0.1", "--port", sim_port.strip()]))
            click.echo(f"simulated backend on {sims[-1].url}")
        settings = parse_settings(demo_settings([s.url for s in sims]))
        sock = bind("127.0.0.1", port)
        url = base_url(sock)
        serve(
            create_app(settings),
            sock,
            lambda: click.echo(f"gateway listening on {url}/v1\n{_SNIPPET.format(url=url)}"),
        )
    finally:
        for sim in sims:
            sim.stop()
