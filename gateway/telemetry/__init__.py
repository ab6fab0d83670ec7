"""Traces and metrics: the per-app providers and instruments, a request's trace, the `TraceRequests` stage."""
