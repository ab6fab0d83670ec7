"""Small commands answer fast because the CLI imports lazily: what a command does not use, it
does not import (timings are in bench/cli_startup.py; which modules load is deterministic)."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from gateway.cli.main import cli

SERVICE_MODULES = ["fastapi", "starlette", "uvicorn", "redis", "litellm", "torch"]

_PROBE = """
import runpy, sys
sys.argv = ["gateway", *sys.argv[1:]]
try:
    runpy.run_module("gateway", run_name="__main__")
except SystemExit:
    pass
print("\\n".join(sorted(sys.modules)), file=sys.stderr)
"""


def imported_by(*args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=60, check=True)
    return set(done.stderr.split())


@pytest.mark.parametrize(
    "args",
    [["--help"], ["--version"], ["sim", "--help"], ["keys", "--help"], ["serve", "--help"], ["demo", "--help"]],
    ids=" ".join,
)
def test_help_imports_no_service_module(args: list[str]) -> None:
    loaded = imported_by(*args)
    assert [m for m in SERVICE_MODULES if m in loaded] == []


def test_the_command_list_shows_each_commands_own_short_help() -> None:
    """`gateway --help` lists commands without importing them: what it shows must be theirs."""
    ctx = click.Context(cli)
    for name in cli.list_commands(ctx):
        listed = cli.listed_help(name)
        command = cli.get_command(ctx, name)
        assert command is not None
        assert listed == command.get_short_help_str(limit=10_000), name
