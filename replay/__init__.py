"""`gateway replay`: replay request samples against an OpenAI-compatible endpoint and measure it.

This package is an HTTP client of whatever it measures (the gateway or a backend directly), so it
never imports from `gateway`: the measurement must not depend on the code being measured.
"""

RESULT_SCHEMA = "gateway-replay/2"
# Results `compare` still reads; /1 predates the per-request client delay and the workload digest.
READABLE_SCHEMAS = ("gateway-replay/1", RESULT_SCHEMA)
