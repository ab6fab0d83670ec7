"""`python -m sim` runs the sim command without the rest of the CLI."""

if __name__ == "__main__":
    from common.processes import exit_with_parent

    exit_with_parent()  # first: a parent that died meanwhile ends us before we bind a port

    from sim.cli import sim_command

    sim_command(prog_name="python -m sim")
