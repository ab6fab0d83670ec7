"""`gateway replay`: replay request samples against an OpenAI-compatible endpoint and measure it.

This package is an HTTP client of whatever it measures (the gateway or a backend directly), so it
never imports from `gateway`: the measurement must not depend on the code being measured.
"""

RESULT_SCHEMA = "gateway-replay/1"
