"""Workflows of the benchmarks app, one module per feature: runs (start, cancel, execute and
record a run), profiles, prices, imports. Each verb writes the audit log."""
