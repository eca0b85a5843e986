"""Celery tasks of the benchmarks app. Each takes a primary key; ``controlpanel.jobs.run_job``
loads the row and records a failure or a time limit on it. A run's limit is sent per call from
its profile (``controlpanel.timelimits.benchmark``); the decorator's covers the longest run."""

from celery import shared_task
from django.conf import settings

from benchmarks.models import BenchmarkRun, ImportJob, RunShard
from benchmarks.services import imports, runs, shard_worker, shards
from controlpanel import timelimits
from controlpanel.jobs import run_job


@shared_task(**timelimits.benchmark(int(settings.BENCHMARK_MAX_SECONDS)).options())
def run_benchmark(run_pk: int) -> None:
    run_job(
        BenchmarkRun.objects.select_related(
            "deployment__host", "deployment__active_config", "engine_config", "load_profile"
        ),
        run_pk,
        runs.execute_run,
        runs.fail_run,
        what="the run",
    )


# Routed to the loadgen queue (controlpanel/celery.py); its limit is sent per call, the run's.
@shared_task(bind=True, **timelimits.benchmark(int(settings.BENCHMARK_MAX_SECONDS)).options())
def run_shard(self, shard_pk: int) -> None:
    """One load generator shard of a sharded run (``benchmarks.services.shard_worker``)."""
    run_job(
        RunShard.objects.select_related(
            "run__deployment__host", "run__engine_config", "run__load_profile"
        ),
        shard_pk,
        lambda shard: shard_worker.execute_shard(shard, self.request.hostname or ""),
        shard_worker.fail_shard,
        what="the load generator shard",
        finished=lambda shard: shard.status in shards.DONE,
    )


@shared_task(ignore_result=True, **timelimits.FAIL_STALE_RUNS.options())
def fail_stale_runs() -> int:
    return len(runs.fail_stale_runs()) + len(imports.fail_stale_imports())


@shared_task(**timelimits.IMPORT_RESULT.options())
def import_result(job_pk: int) -> None:
    """Read an uploaded result file into a run (``benchmarks.services.imports``)."""
    run_job(
        ImportJob.objects.select_related("deployment__host", "engine_config", "requested_by"),
        job_pk,
        imports.execute_import,
        imports.fail_import,
        what="the import",
    )


# The limit is sent per call from the probe's size (probes.time_limit_for).
@shared_task(**timelimits.benchmark(int(settings.BENCHMARK_MAX_SECONDS)).options())
def run_probe(run_pk: int) -> None:
    """Ask a deployment a probe set's questions (``benchmarks.services.probes``)."""
    # Imported as the task runs: a web process queueing it loads this module, not the work's.
    from benchmarks.models import ProbeRun
    from benchmarks.services import probes

    run_job(
        ProbeRun.objects.select_related("deployment__host", "probe_set"),
        run_pk,
        probes.execute_probe,
        probes.fail_probe,
        what="the quality probe",
    )
