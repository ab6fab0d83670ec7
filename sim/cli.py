"""The `gateway sim` command; the main CLI attaches `sim_command` to its group."""

from __future__ import annotations

import errno
from pathlib import Path

import click


@click.command("sim")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8100, show_default=True, type=int, help="Port; 0 picks a free one.")
@click.option(
    "--profile",
    "profile_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML sim profile; the options below override its values.",
)
@click.option("--ttft-ms", type=float, help="Time to first token in ms.")
@click.option("--tpot-ms", type=float, help="Time per output token in ms.")
@click.option("--jitter", type=float, help="Uniform +/- fraction applied to each delay.")
@click.option("--seed", type=int, help="Seed for jitter and error-rate draws.")
@click.option("--slow", type=float, help="Multiplier on TTFT and TPOT (a fault field).")
@click.option(
    "--echo-tool-results",
    is_flag=True,
    default=None,
    help="Answer a tool result by quoting it, so an agent's final answer shows what its tool returned.",
)
@click.option(
    "--fault",
    "fault_spec",
    help='Process faults in X-Sim-Fault syntax, e.g. "status=503" or "cut_after=5,slow=2".',
)
@click.option("--served-root", help="What /v1/models reports as `root` (the checkpoint path vLLM would).")
def sim_command(
    host: str,
    port: int,
    profile_path: Path | None,
    ttft_ms: float | None,
    tpot_ms: float | None,
    jitter: float | None,
    seed: int | None,
    slow: float | None,
    echo_tool_results: bool | None,
    fault_spec: str | None,
    served_root: str | None,
) -> None:
    """Run the simulated OpenAI-compatible backend (prints its URL once ready)."""
    # Imported here: `gateway sim --help` needs neither the fault models nor the server.
    from sim.faults import FaultError, parse_fault_fields
    from sim.profile import ProfileError
    from sim.server import load_profile, run_sim

    try:
        faults: dict[str, str | float | None] = dict(parse_fault_fields(fault_spec or ""))
    except FaultError as exc:
        raise click.BadParameter(str(exc), param_hint="--fault") from exc
    if slow is not None:
        faults["slow"] = slow
    try:
        profile = load_profile(
            profile_path,
            ttft_ms=ttft_ms,
            tpot_ms=tpot_ms,
            jitter=jitter,
            seed=seed,
            echo_tool_results=echo_tool_results,
            faults=faults or None,
            served_root=served_root,
        )
    except ProfileError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        run_sim(host, port, profile)
    except OSError as error:
        if error.errno != errno.EADDRINUSE:
            raise
        raise click.ClickException(
            f"port {port} on {host} is already in use: stop what is listening there, "
            "or pass --port 0 to pick a free port"
        ) from None
