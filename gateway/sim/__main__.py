"""`python -m gateway.sim` runs the sim command without the rest of the CLI."""

from gateway.sim.cli import sim_command

if __name__ == "__main__":
    sim_command(prog_name="python -m gateway.sim")
