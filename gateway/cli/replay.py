"""`gateway replay run | compare`: the replay tool lives in the `replay` package, which talks to the
gateway only over HTTP; this module just gives its commands a place in the gateway CLI."""

from __future__ import annotations

import click

from replay.cli import compare_command, run_command


@click.group("replay")
def replay_group() -> None:
    """Replay request samples against an OpenAI-compatible endpoint; compare runs."""


replay_group.add_command(run_command)
replay_group.add_command(compare_command)
