"""What store-backed CLI commands share: the config's store, an audit writer, the operator."""

from __future__ import annotations

import asyncio
import getpass
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click

from gateway.core.principal import Limits, Principal, Scope
from gateway.errors import GatewayError
from gateway.store.base import Store

if TYPE_CHECKING:  # imported when a command runs: `gateway <group> --help` needs none of them
    from gateway.audit.writer import AuditWriter
    from gateway.settings import Settings

T = TypeVar("T")

config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="the gateway config whose store to use",
)


@dataclass
class CliContext:
    settings: Settings
    store: Store
    audit: AuditWriter
    operator: Principal


def operator_principal() -> Principal:
    """Whoever can read the config and reach its store is the operator, with every scope."""
    return Principal(
        key_id=f"cli:{getpass.getuser()}",
        tenant="*",
        scopes=frozenset(s.value for s in Scope),
        models=frozenset(),
        limits=Limits(),
        all_tenants=True,
    )


@asynccontextmanager
async def cli_context(config_path: Path) -> AsyncIterator[CliContext]:
    from gateway.audit.writer import AuditWriter
    from gateway.cli.serve import load_or_exit
    from gateway.store.factory import open_store

    settings = load_or_exit(config_path)
    store = open_store(settings.store)
    audit = AuditWriter(
        store, queue_size=1000, batch_size=100, flush_interval_s=0.01, hmac_key=settings.audit.hmac_key.encode()
    )
    try:
        yield CliContext(settings, store, audit, operator_principal())
        await audit.flush()
    finally:
        await store.aclose()


def run(config_path: Path, work: Callable[[CliContext], Awaitable[T]]) -> T:
    """Run one store-backed command; gateway errors become a message and exit status 1."""

    async def main() -> T:
        async with cli_context(config_path) as ctx:
            return await work(ctx)

    try:
        return asyncio.run(main())
    except GatewayError as error:
        raise click.ClickException(error.message) from None
