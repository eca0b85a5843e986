"""Scaling planning, pure (no Django, Celery or Channels; import-linter "pure").

- ``expo``: an engine's /metrics text → a snapshot (gauges, counters, histogram buckets).
- ``signals``: snapshots over time → the live signals (queue, pending prompt tokens, KV use,
  tokens/s, p50/p95 TTFT and ITL over 1 and 5 minutes from bucket deltas).
- ``capacity``: benchmark stages (and sweep trials) → the most load one replica carries
  within an SLO, and the queue depth / KV use at which p95 TTFT crossed it.
- ``policy``: signals + capacity → desired replicas (hysteresis, warm minimum) and the
  thresholds a scaler should use.
- ``whatif``: a day of traffic through a replica model calibrated by the simulator, under
  several scaling policies.
- ``exports``: KEDA ScaledObject, Prometheus alerting rules, Grafana dashboard.

The shared value types are in ``types``; ``python -m scaling.planning`` is the CLI.
"""
