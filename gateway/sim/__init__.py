"""Simulated OpenAI-compatible backend for demos, tests, load tests and failure drills.

Start it with `gateway sim` (or `python -m gateway.sim`), or build the ASGI app in-process with
`create_sim_app(SimProfile(...))`.
"""

from gateway.sim.app import create_sim_app
from gateway.sim.faults import Faults, parse_faults
from gateway.sim.profile import SimProfile, load_profile

__all__ = ["Faults", "SimProfile", "create_sim_app", "load_profile", "parse_faults"]
