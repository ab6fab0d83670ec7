"""What the tests and the benchmarks both use: gateways and sims in process or as processes, and
the replay cross-check's reference client and stamping sim. A package of the checkout, not of the
distribution, so that `bench/` never imports `tests/`."""
