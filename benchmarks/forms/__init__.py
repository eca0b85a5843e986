"""Forms of the benchmarks app, one module per feature (runs, profiles, cost, history)."""
