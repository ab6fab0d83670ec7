"""What the benchmarks share, and the parts of the larger ones (`checkpoint_*`, `failover_*`,
`overhead_report`): no module here is a benchmark of its own."""
