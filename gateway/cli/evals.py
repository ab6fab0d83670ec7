"""`gateway eval run | show | compare`.

The eval sets live in the `eval` package, which talks to the model endpoint only over HTTP; this
module just gives its commands a place in the gateway CLI."""

from __future__ import annotations

import click

from eval.cli import compare_command, run_command, show_command


@click.group("eval")
def evals_group() -> None:
    """Run eval sets a model release must pass before promotion; show a set's digest; compare runs."""


evals_group.add_command(run_command)
evals_group.add_command(show_command)
evals_group.add_command(compare_command)
