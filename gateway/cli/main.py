"""The `gateway` console script: one group, one module per command group.

A command's module is imported when that command runs or shows its own help, not before:
`gateway --help` lists the commands from the table below, so it answers without importing the
service (FastAPI, uvicorn, the store clients, the policy engine). tests/cli/test_startup.py checks
that the table's help lines are the commands' own.
"""

from __future__ import annotations

from types import MappingProxyType

import click
from click.utils import make_default_short_help

# name -> ("module:attribute", the command's short help)
_COMMANDS = MappingProxyType(
    {
        "serve": ("gateway.cli.serve:serve_command", "Serve the gateway described by a config file."),
        "config": ("gateway.cli.serve:config_group", "Inspect configuration files."),
        "demo": (
            "gateway.cli.demo:demo_command",
            "Run the gateway with two simulated backends and print a ready-to-paste SDK snippet.",
        ),
        "sim": (
            "sim.cli:sim_command",
            "Run the simulated OpenAI-compatible backend (prints its URL once ready).",
        ),
        "keys": ("gateway.cli.keys:keys_group", "Manage API keys (secrets are shown once, stored only as SHA-256)."),
        "audit": ("gateway.cli.audit:audit_group", "Verify, export and archive the hash-chained audit log."),
        "approvals": ("gateway.cli.approvals:approvals_group", "Decide tool calls held for human approval."),
        "plan": (
            "gateway.cli.plan:plan_command",
            "Memory, KV-cache and concurrency arithmetic for serving a model with vLLM behind the gateway, "
            "and checkpoint size, failure odds and checkpoint interval for training it.",
        ),
        "replay": (
            "gateway.cli.replay:replay_group",
            "Replay request samples against an OpenAI-compatible endpoint; compare runs.",
        ),
        "checkpoints": (
            "gateway.cli.checkpoints:checkpoints_group",
            "Register and verify versioned training checkpoints.",
        ),
        # `gateway eval ...`: a subcommand, not a console script
        "eval": (
            "gateway.cli.evals:evals_group",
            "Run eval sets a model release must pass before promotion; show a set's digest; compare runs.",
        ),
        "releases": (
            "gateway.cli.releases:releases_group",
            "Model releases: create, promote with a preflight, roll back in one command.",
        ),
    }
)


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*_COMMANDS, *super().list_commands(ctx)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMANDS:
            return super().get_command(ctx, cmd_name)
        import importlib

        module, attribute = _COMMANDS[cmd_name][0].split(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        return command

    def listed_help(self, cmd_name: str) -> str:
        return _COMMANDS[cmd_name][1]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        with formatter.section("Commands"):
            formatter.write_dl([(name, make_default_short_help(self.listed_help(name), limit)) for name in names])

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # Ctrl-C before a server took over its signals: quiet, 130
            ctx.exit(130)


@click.group(cls=LazyGroup)
@click.version_option(package_name="agent-gateway")
def cli() -> None:
    """agent-gateway: reliability middleware between AI agents and model servers."""
