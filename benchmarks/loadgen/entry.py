"""Running a load spec to the end: in this process, or shared by ``spec.workers`` processes
(``shard``). Above both, so neither imports the other to dispatch."""

from __future__ import annotations

from benchmarks.loadgen.runner import Result, run_in_process
from benchmarks.loadgen.shard import ShardedRun
from benchmarks.loadgen.spec import LoadSpec


def run(spec: LoadSpec, on_progress=None) -> Result:
    """Run ``spec`` to the end (blocking), e.g. from a Celery task or a script."""
    if spec.workers > 1:
        return ShardedRun(spec, on_progress).execute()
    return run_in_process(spec, on_progress)
