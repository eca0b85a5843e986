"""Celery tasks of the benchmarks app. Each takes a primary key and records its outcome on
the row; the time limit of a run is set per call from its profile (services.time_limit_for)."""

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from benchmarks.models import BenchmarkRun
from benchmarks.services import runs


@shared_task(
    time_limit=int(settings.BENCHMARK_MAX_SECONDS) + 120,
    soft_time_limit=int(settings.BENCHMARK_MAX_SECONDS) + 60,
)
def run_benchmark(run_pk: int) -> None:
    run = (
        BenchmarkRun.objects.select_related(
            "deployment__host", "deployment__active_config", "engine_config", "load_profile"
        )
        .filter(pk=run_pk)
        .first()
    )
    if run is None or run.is_finished:
        return  # deleted, cancelled while queued, or a redelivery of a finished run
    try:
        runs.execute_run(run)
    except SoftTimeLimitExceeded:
        runs.fail_run(run, "the run ran out of time")
    except Exception as exc:
        runs.fail_run(run, f"{type(exc).__name__}: {exc}")
        raise


@shared_task(time_limit=120, soft_time_limit=100, ignore_result=True)
def fail_stale_runs() -> int:
    return len(runs.fail_stale_runs())
