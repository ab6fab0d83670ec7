"""`gateway demo`: the gateway on its embedded defaults plus two simulated backends, on loopback."""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import signal
import socket
import tempfile
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

import click

from common.processes import Announced, ProcessStartError, start_announcing
from gateway.cli.demo_releases import prepare_releases, releases_settings
from gateway.cli.serve import LOG_LEVELS

if TYPE_CHECKING:  # imported when the demo runs, not for `gateway demo --help`
    from gateway.settings import Settings

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

A tool call that waits for a person: the simulated model calls refund_payment with arguments that
follow the tool's schema, and the demo policy holds it. Run this, then approve the call at
{url}/admin/ui/approvals (approver key {approver}); the answer arrives once you decide:

    curl {url}/v1/chat/completions -H 'authorization: Bearer {key}' \\
      -H 'content-type: application/json' -d '{tool_body}'

{releases}Keys and the audit log live in {data} ({fate})
Health: {url}/readyz    Stop: Ctrl-C
"""


# A tool schema as an agent would write it: the sim fills `pattern` and the bounds (see README,
# "Simulated backend"), so the call meets the demo policy's argument rules.
_REFUND_REQUEST = {
    "model": "sim-model",
    "messages": [{"role": "user", "content": "Please refund order ord_4711, it arrived broken."}],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "refund_payment",
                "description": "Refund all or part of the payment for an order.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "order_id": {"type": "string", "pattern": "^ord_[0-9]+$"},
                        "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000},
                    },
                    "required": ["order_id", "amount"],
                },
            },
        }
    ],
}


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
    from gateway.audit.writer import AuditWriter
    from gateway.auth.api_keys import KeyService, NewKey
    from gateway.auth.tenancy import ModelTenancy
    from gateway.cli.context import operator_principal
    from gateway.core.principal import Limits
    from gateway.store.factory import open_store

    store = open_store(settings.store)
    audit = AuditWriter(store, queue_size=10, batch_size=10, flush_interval_s=0.01)
    try:
        keys = KeyService(store, audit, ModelTenancy({m.name: m.tenants for m in settings.models}))
        agent = await keys.create(operator_principal(), NewKey("demo", "demo", limits=Limits(rpm=600, tpm=200_000)))
        person = await keys.create(operator_principal(), NewKey("demo-approver", "demo", scopes=("approver",)))
        await audit.flush()
    finally:
        await store.aclose()
    return agent.secret, person.secret


def _data_folder(given: Path | None) -> Path:
    if given is None:
        return Path(tempfile.mkdtemp(prefix="agw-demo-"))
    if given.exists() and any(given.iterdir()):
        raise click.BadParameter(f"{given} is not empty: remove it or name another folder", param_hint="--data-dir")
    given.mkdir(parents=True, exist_ok=True)
    return given.absolute()


def _start_sims(ports: list[str], started: list[Announced]) -> None:
    """Start a sim per port, appending each to `started` (the caller stops them)."""
    from gateway.cli.uvicorn_runner import port_in_use

    for port in ports:
        if port != "0":  # checked here so the message names the demo's flag, not the sim's
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("127.0.0.1", int(port)))
                except OSError:
                    raise port_in_use("127.0.0.1", int(port), "--sim-ports", "0,0") from None
        try:
            started.append(start_announcing(["sim", "--host", "127.0.0.1", "--port", port]))
        except ProcessStartError as error:
            raise click.ClickException(f"a simulated backend did not start: {error}") from None
        click.echo(f"simulated backend on {started[-1].url}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@click.command("demo")
@click.option("--port", type=int, default=8080, show_default=True, help="the gateway's port; 0 picks one")
@click.option("--sim-ports", default="9101,9102", show_default=True, help="ports of the two simulated backends")
# One JSON line per request would bury the snippet this command prints; `info` shows them.
@click.option("--log-level", type=LOG_LEVELS, default="warning", show_default=True, help="JSON logs on stderr")
@click.option("--keep-data", is_flag=True, help="keep the keys and audit log folder after the demo stops")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="an empty or new folder for the demo's data, kept on exit (default: a temporary one)",
)
@click.option("--releases", is_flag=True, help="also prepare README's releases walkthrough in the data folder")
def demo_command(
    port: int, sim_ports: str, log_level: str, keep_data: bool, data_dir: Path | None, releases: bool
) -> None:
    """Run the gateway with two simulated backends and print a ready-to-paste SDK snippet.

    Ctrl-C (or SIGTERM, SIGHUP) stops the gateway and both backends and removes the demo's data
    folder unless --keep-data or --data-dir is given."""
    from gateway.app import create_app
    from gateway.cli.uvicorn_runner import base_url, bind, serve
    from gateway.logging_setup import configure_logging
    from gateway.settings import parse_settings

    configure_logging(log_level)
    # Until the server takes over signal handling (and after it hands it back), a termination
    # signal unwinds like Ctrl-C, so the `finally` below always stops the sims.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    sock = bind("127.0.0.1", port)  # first: a busy port is reported before anything starts
    url = base_url(sock)
    sims: list[Announced] = []
    keep_data = keep_data or data_dir is not None
    data_dir = _data_folder(data_dir)
    try:
        _start_sims([p.strip() for p in sim_ports.split(",")], sims)
        raw = demo_settings([s.url for s in sims], data_dir)
        if releases:
            raw["releases"] = releases_settings(data_dir)
        settings = parse_settings(raw)
        key, approver_key = asyncio.run(_demo_keys(settings))
        releases_note = prepare_releases(data_dir, raw) + "\n\n" if releases else ""
        snippet = _SNIPPET.format(
            url=url,
            key=key,
            approver=approver_key,
            data=data_dir,
            policy=settings.tools.policy_file,
            tool_body=json.dumps(_REFUND_REQUEST),
            releases=releases_note,
            fate="kept on exit" if keep_data else "removed on exit unless --keep-data",
        )
        serve(
            create_app(settings),
            sock,
            lambda: click.echo(f"gateway listening on {url}/v1\n{snippet}"),
            settings.server,
        )
    except KeyboardInterrupt:
        pass  # a stop before the server ran: as quiet as one while it ran
    finally:
        sock.close()
        for sim in sims:
            sim.stop()
        if keep_data:
            click.echo(f"demo data kept in {data_dir}", err=True)
        else:
            try:
                shutil.rmtree(data_dir)
            except OSError as error:
                click.echo(f"could not remove the demo data folder: {error}", err=True)
