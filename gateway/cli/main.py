"""The `gateway` console script: one group, one module per command group."""

from __future__ import annotations

import click

from gateway.cli.approvals import approvals_group
from gateway.cli.audit import audit_group
from gateway.cli.checkpoints import checkpoints_group
from gateway.cli.demo import demo_command
from gateway.cli.evals import evals_group
from gateway.cli.keys import keys_group
from gateway.cli.plan import plan_command
from gateway.cli.releases import releases_group
from gateway.cli.replay import replay_group
from gateway.cli.serve import config_group, serve_command
from gateway.sim.cli import sim_command


@click.group()
@click.version_option(package_name="agent-gateway")
def cli() -> None:
    """agent-gateway: reliability middleware between AI agents and model servers."""


cli.add_command(serve_command)
cli.add_command(config_group)
cli.add_command(demo_command)
cli.add_command(sim_command)
cli.add_command(keys_group)
cli.add_command(audit_group)
cli.add_command(approvals_group)
cli.add_command(plan_command)
cli.add_command(replay_group)
cli.add_command(checkpoints_group)
cli.add_command(evals_group)  # `gateway eval ...`: a subcommand, not a console script
cli.add_command(releases_group)
