"""Workflows of the benchmarks app, one module per concern. Each verb writes the audit log.

- ``runs``: start, cancel, execute and fail a run (and sweep runs whose worker is gone);
  ``points`` (its live per-second points), ``environment`` (what it records about where it
  ran) and ``results`` (storing what the load generator measured) serve it; ``shards``
  coordinates a run split over load generators on the ``loadgen`` queue, ``shard_worker``
  is one of them.
- ``history``: the filtered, sorted list; ``compare`` (with its charts in ``figures``);
  ``export`` and ``imports``.
- ``profiles``: load profiles; ``prices``: prices and the cost page.

The numbers a run reports are listed once, in ``benchmarks.metrics``.
"""
