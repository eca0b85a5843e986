"""The measurements the pipeline judges a change by: the panel's own health check of the
engine after a restart, and the baseline and verification benchmarks, run inline on the
pipeline's worker as ordinary runs (their pages stream live and they join the history)."""

from __future__ import annotations

import time

import httpx
from django.conf import settings as conf
from django.urls import reverse

from benchmarks.models import BenchmarkRun
from benchmarks.services import runs as benchmark_runs
from changes.models import ChangeRequest
from hosts.engines.metrics import endpoints
from hosts.models import Deployment


def health_problem(deployment: Deployment) -> str | None:
    """None when the engine answers /health and lists a model on /v1/models (within
    CHANGE_HEALTH_TIMEOUT), else what is wrong."""
    urls = endpoints(deployment.engine)
    key = deployment.api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    deadline = time.monotonic() + conf.CHANGE_HEALTH_TIMEOUT
    problem = "no answer"
    with httpx.Client(base_url=deployment.engine_url, headers=headers, timeout=5) as client:
        while True:
            try:
                health = client.get(urls.health)
                if health.status_code != 200:
                    problem = f"{urls.health} answered {health.status_code}"
                else:
                    models = client.get(urls.models)
                    if models.status_code != 200:
                        problem = f"{urls.models} answered {models.status_code}"
                    elif not models.json().get("data"):
                        problem = f"{urls.models} lists no model"
                    else:
                        return None
            except (httpx.HTTPError, ValueError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                return problem
            time.sleep(1)


BENCHMARK_FIELDS = {"baseline": "baseline_run", "verification": "verification_run"}


def run_benchmark(change: ChangeRequest, purpose: str) -> tuple[BenchmarkRun | None, str]:
    """Run the change's verification profile on the engine now, inline on this worker (the
    run is an ordinary run: its page streams live and it joins the history). The run is on
    the change before it starts, so a rollback request can cancel it. ``(run, "")``, or
    ``(None, why it could not start)``."""
    field = BENCHMARK_FIELDS[purpose]
    earlier = getattr(change, field)
    if earlier is not None and not earlier.is_finished:
        # The pipeline's previous worker died during this run: it measured for nobody.
        benchmark_runs.fail_run(earlier, "the change's pipeline stopped during the run")
    try:
        run = benchmark_runs.start_benchmark(
            change.applied_by,
            change.deployment,
            change.verify_profile,
            label=f"change #{change.pk} {purpose}",
            enqueue=False,
        )
    except benchmark_runs.RunRefused as exc:
        return None, f"the {purpose} benchmark could not start: {exc}"
    setattr(change, field, run)
    change.save(update_fields=[field])
    try:
        benchmark_runs.execute_run(
            BenchmarkRun.objects.select_related(
                "deployment__host", "deployment__active_config", "engine_config", "load_profile"
            ).get(pk=run.pk)
        )
    except Exception as exc:  # noqa: BLE001 - recorded on the run, judged by the pipeline
        benchmark_runs.fail_run(run, f"{type(exc).__name__}: {exc}")
    run.refresh_from_db()
    return run, ""


NUMBERS = ("error_rate", "ttft_p95_ms", "itl_p95_ms", "output_tokens_per_s")


def numbers(run: BenchmarkRun | None) -> dict:
    return {key: getattr(run, key) for key in NUMBERS} if run is not None else {}


def run_numbers(run: BenchmarkRun) -> str:
    def ms(value):
        return "—" if value is None else f"{value:.0f} ms"

    rate = "—" if run.error_rate is None else f"{run.error_rate:.1%}"
    tput = "—" if run.output_tokens_per_s is None else f"{run.output_tokens_per_s:.0f} tok/s"
    return f"TTFT p95 {ms(run.ttft_p95_ms)}, ITL p95 {ms(run.itl_p95_ms)}, {tput}, errors {rate}"


def verdict_text(result: dict) -> str:
    parts = []
    for check in result["checks"]:
        if check.get("change") is not None and check["metric"] != "error_rate":
            parts.append(f"{check['label']} {check['change']:+.0%}")
    if result.get("throughput_change") is not None:
        parts.append(f"output tok/s {result['throughput_change']:+.0%}")
    return "within limits: " + ", ".join(parts) if parts else "within limits"


def link(run: BenchmarkRun | None) -> str:
    return run.get_absolute_url() if run is not None else ""


def compare_link(a: BenchmarkRun | None, b: BenchmarkRun) -> str:
    if a is None or not a.pk or not b.pk:
        return ""
    return f"{reverse('benchmarks:compare')}?runs={a.pk}&runs={b.pk}"
