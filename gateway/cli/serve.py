"""`gateway serve` and `gateway config check`."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:  # imported when a command runs: `--help` needs neither the config models nor uvicorn
    from gateway.settings import Settings

LOG_LEVELS = click.Choice(["debug", "info", "warning", "error"], case_sensitive=False)


def load_or_exit(path: Path) -> Settings:
    from gateway.settings import ConfigError, load_settings

    try:
        return load_settings(path)
    except ConfigError as error:
        for problem in error.problems:
            click.echo(f"{path}: {problem}", err=True)
        sys.exit(2)


@click.command("serve")
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False), required=True)
@click.option("--host", default=None, help="overrides server.host")
@click.option("--port", type=int, default=None, help="overrides server.port; 0 picks a free port")
@click.option("--log-level", type=LOG_LEVELS, default="info", show_default=True, help="JSON logs on stderr")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="processes sharing the port, restarted when they die (more than 1 needs the redis store)",
)
def serve_command(config_path: Path, host: str | None, port: int | None, log_level: str, workers: int) -> None:
    """Serve the gateway described by a config file."""
    from gateway.app import create_app  # the service's imports are paid only by commands that serve
    from gateway.cli.uvicorn_runner import base_url, bind, serve
    from gateway.logging_setup import configure_logging

    settings = load_or_exit(config_path)
    _check_bootstrap_key(settings)
    if workers > 1 and settings.store.kind == "embedded":
        from gateway.cli.workers import embedded_refusal

        click.echo(embedded_refusal(workers), err=True)
        sys.exit(2)
    configure_logging(log_level)
    sock = bind(host or settings.server.host, settings.server.port if port is None else port)
    url = base_url(sock)

    def announce() -> None:
        click.echo(f"gateway listening on {url}/v1", nl=True)

    if workers == 1:
        serve(create_app(settings), sock, announce, settings.server)
        return
    from gateway.cli.workers import Supervisor

    # Each worker builds its app after the fork: event loops, threads and connections are per process.
    supervisor = Supervisor(
        sock, workers, lambda worker_sock, ready: serve(create_app(settings), worker_sock, ready, settings.server)
    )
    sys.exit(supervisor.run(announce))


def _check_bootstrap_key(settings: Settings) -> None:
    """A malformed bootstrap key would start a gateway on which every admin call is a 401."""
    from gateway.auth.stage import KEY_SHAPE, secret_problem

    source = "auth.admin_key" if settings.auth.admin_key else "GATEWAY_ADMIN_KEY"
    secret = settings.auth.admin_key or os.environ.get("GATEWAY_ADMIN_KEY", "")
    problem = secret_problem(secret) if secret else None
    if problem:
        click.echo(
            f"{source} is not a valid key: {problem}. A valid key is {KEY_SHAPE}; "
            "print a fresh one with `gateway keys generate`.",
            err=True,
        )
        sys.exit(2)


@click.group("config")
def config_group() -> None:
    """Inspect configuration files."""


@config_group.command("check")
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False))
def check_command(path: Path) -> None:
    """Validate a config file; print every problem with its key path."""
    settings = load_or_exit(path)
    deployments = sum(len(m.deployments) for m in settings.models)
    click.echo(f"{path}: ok ({len(settings.models)} models, {deployments} deployments, store {settings.store.kind})")
