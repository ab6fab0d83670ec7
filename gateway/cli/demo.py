"""`gateway demo`: the gateway on its embedded defaults plus two simulated backends, on loopback."""

from __future__ import annotations

import asyncio
import secrets
import tempfile
from importlib.resources import files
from pathlib import Path

import click

from gateway.audit import AuditWriter
from gateway.cli.context import operator_principal
from gateway.cli.processes import Announced, start_announcing
from gateway.cli.serve import LOG_LEVELS
from gateway.cli.serving import base_url, bind, serve
from gateway.keys import KeyService, NewKey
from gateway.settings import Settings, parse_settings
from gateway.store.base import Limits
from gateway.store.factory import open_store

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
      -H 'content-type: application/json' \\
      -d '{{"model": "sim-model", "messages": [{{"role": "user", "content": "Hello!"}}]}}'

The key belongs to tenant "demo" (600 requests/min), whose tool policy is {policy}
(get_weather and lookup_order are allowed; refund_payment waits for a person's approval).
Approve held calls at {url}/admin/ui/approvals with the approver key {approver}
Keys and the audit log live in {data}
Health: {url}/readyz    Stop: Ctrl-C
"""


def demo_settings(sim_urls: list[str], data_dir: Path) -> dict[str, object]:
    deployments = [
        {
            "name": f"sim-{i + 1}",
            "api_base": f"{url}/v1",
            "model": "sim-model",
            "priority": i,
            "continuation": "vllm",
            "health_path": f"{url}/health",
        }
        for i, url in enumerate(sim_urls)
    ]
    demo_policy = files("policies.examples").joinpath("demo.yaml")
    return {
        "store": {"kind": "embedded", "path": str(data_dir)},
        "tools": {"policy_file": str(demo_policy), "approval_secret": secrets.token_urlsafe(32)},
        "models": [{"name": "sim-model", "deployments": deployments}],
    }


async def _demo_keys(settings: Settings) -> tuple[str, str]:
    """A chat key for the agent and an approver key for the person, both of tenant "demo"."""
    store = open_store(settings.store)
    audit = AuditWriter(store, queue_size=10, batch_size=10, flush_interval_s=0.01)
    try:
        keys = KeyService(store, audit)
        agent = await keys.create(operator_principal(), NewKey("demo", "demo", limits=Limits(rpm=600, tpm=200_000)))
        person = await keys.create(operator_principal(), NewKey("demo-approver", "demo", scopes=("approver",)))
        await audit.flush()
    finally:
        await store.aclose()
    return agent.secret, person.secret


@click.command("demo")
@click.option("--port", type=int, default=8080, show_default=True, help="the gateway's port; 0 picks one")
@click.option("--sim-ports", default="9101,9102", show_default=True, help="ports of the two simulated backends")
# One JSON line per request would bury the snippet this command prints; `info` shows them.
@click.option("--log-level", type=LOG_LEVELS, default="warning", show_default=True, help="JSON logs on stderr")
def demo_command(port: int, sim_ports: str, log_level: str) -> None:
    """Run the gateway with two simulated backends and print a ready-to-paste SDK snippet."""
    from gateway.app import create_app
    from gateway.logging_setup import configure_logging

    configure_logging(log_level)
    sims: list[Announced] = []
    try:
        for sim_port in sim_ports.split(","):
            sims.append(start_announcing(["gateway.sim", "--host", "127.0.0.1", "--port", sim_port.strip()]))
            click.echo(f"simulated backend on {sims[-1].url}")
        data_dir = Path(tempfile.mkdtemp(prefix="agw-demo-"))
        settings = parse_settings(demo_settings([s.url for s in sims], data_dir))
        key, approver_key = asyncio.run(_demo_keys(settings))
        sock = bind("127.0.0.1", port)
        url = base_url(sock)
        snippet = _SNIPPET.format(
            url=url, key=key, approver=approver_key, data=data_dir, policy=settings.tools.policy_file
        )
        serve(
            create_app(settings),
            sock,
            lambda: click.echo(f"gateway listening on {url}/v1\n{snippet}"),
            settings.server,
        )
    finally:
        for sim in sims:
            sim.stop()
