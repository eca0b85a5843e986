"""Celery tasks of the benchmarks app. Each takes a primary key; ``controlpanel.jobs.run_job``
loads the row and records a failure or a time limit on it. A run's limit is sent per call from
its profile (``controlpanel.timelimits.benchmark``); the decorator's covers the longest run."""

from celery import shared_task
from django.conf import settings

from benchmarks.models import BenchmarkRun, ImportJob
from benchmarks.services import imports, runs
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
    from benchmarks.models import ProbeRun
    from benchmarks.services import probes

    run_job(
        ProbeRun.objects.select_related("deployment__host", "probe_set"),
        run_pk,
        probes.execute_probe,
        probes.fail_probe,
        what="the quality probe",
    )
