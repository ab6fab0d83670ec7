"""The benchmarks: one module each, run from the repository root as `python -m bench.<name>`.

`bench.support` holds what they share (starting and measuring processes, the load generator, the
fast upstream, the report and results-file helpers) and the parts of the larger benchmarks.
"""
