"""A run exported in the load generator's result format (so the same tools read both, and
``imports.import_run`` reads it back), plus a ``panel`` part with where it ran and with
what; and its request log as CSV."""

from __future__ import annotations

from django.utils import timezone
from django.utils.text import slugify

from benchmarks import records as request_records
from benchmarks.evidence import usable_as_evidence
from benchmarks.loadgen import __version__ as LOADGEN_VERSION
from benchmarks.loadgen.profile import build_spec
from benchmarks.loadgen.spec import SpecError
from benchmarks.metrics import RECORDED
from benchmarks.models import BenchmarkRun, RunPoint
from benchmarks.services.shards import shard_health
from controlpanel.choices import OperationStatus
from hosts.engines.redaction import masked

EXPORT_FORMAT = "llm-control-panel/run"
EXPORT_VERSION = 1


def export_spec(run: BenchmarkRun) -> dict | None:
    """The load generator spec the run applied: as recorded when it ran, else rebuilt from
    its profile version (aimed at its deployment)."""
    recorded = (run.environment or {}).get("spec")
    if isinstance(recorded, dict):
        return recorded
    if run.load_profile is None or run.load_profile.spec.get("replay"):
        return None
    try:
        return build_spec(run.profile_spec, run.deployment.engine_url, run.model_name).to_dict()
    except SpecError:
        return None


def export_document(run: BenchmarkRun) -> dict:
    """The run as the load generator's CLI writes a result (so the same tools read both),
    plus a ``panel`` part with where it ran and with what; ``import_run`` reads it back."""
    spec = export_spec(run)
    return {
        **summary(run, spec),
        "stages": run.stages or {},
        "timeline": _timeline(run),
        "server": run.server or {},
        "cancelled": run.status == OperationStatus.CANCELLED,
        "stopped_early": run.stopped_early or None,
        "notes": list(run.notes or []),
        "client_health": run.client_health or None,
        "spec": spec,
        "panel": _panel(run),
    }


def summary(run: BenchmarkRun, spec: dict | None) -> dict:
    """The run's summary, completed from its columns and with the header a CLI result has
    (date, backend, model, endpoint, request count, the first stage's load)."""
    summary = dict(run.summary or {})
    for metric in RECORDED:
        value = getattr(run, metric.key)
        if summary.get(metric.summary_key) is None and value is not None:
            summary[metric.summary_key] = value
    endpoint = summary.get("endpoint") or (spec or {}).get("endpoint") or "/v1/completions"
    stages = (spec or {}).get("stages") or [{}]
    head = {
        "date": (run.started_at or run.created_at).isoformat(timespec="seconds"),
        "backend": "openai-chat" if "chat" in endpoint else "openai",
        "model_id": run.model_name,
        "endpoint": endpoint,
        "num_prompts": (run.completed or 0) + (run.failed or 0),
        "request_rate": stages[0].get("request_rate") or "inf",
        "burstiness": stages[0].get("burstiness", 1.0),
        "max_concurrency": stages[0].get("max_concurrency") or stages[0].get("concurrency"),
    }
    for key, value in head.items():
        summary.setdefault(key, value)
    return summary


def _timeline(run: BenchmarkRun) -> list[dict]:
    timeline = []
    for point in RunPoint.objects.filter(run=run).order_by("t").values_list("data", flat=True):
        point.pop("ttfts", None)  # live-view samples; the CLI's timeline has none either
        timeline.append(point)
    return timeline


def _iso(moment) -> str | None:
    return moment.isoformat(timespec="seconds") if moment else None


def _panel(run: BenchmarkRun) -> dict:
    """What the exporting panel knows beyond the CLI's result: where, with what, by whom."""
    config, profile = run.engine_config, run.load_profile
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_at": _iso(timezone.now()),
        "run_id": run.pk,
        "label": run.label,
        "status": run.status,
        "source": run.source,
        "deployment": str(run.deployment),
        "host": run.deployment.host.name,
        "engine": run.engine,
        "engine_version": run.engine_version,
        "model": run.model_name,
        "gpu_model": run.gpu_model,
        "gpu_count": run.gpu_count,
        "loadgen_version": run.loadgen_version or LOADGEN_VERSION,
        "requested_by": run.requested_by.get_username() if run.requested_by else None,
        "created_at": _iso(run.created_at),
        "finished_at": _iso(run.finished_at),
        "config": {
            "version": config.version,
            "settings": masked(config.settings),
            "env": masked(config.env),
            "placement": config.placement,
        }
        if config
        else None,
        "profile": {"name": profile.name, "version": profile.version, "spec": profile.spec}
        if profile
        else None,
        "hourly_price": str(run.hourly_price) if run.hourly_price is not None else None,
        "currency": run.currency,
        "cost_per_million_output": run.cost_per_million_output,
        "distributions": run.distributions or {},
        "shards": run.shards,
        "shard_health": shard_health(run) if run.shards > 1 else [],
        "client_limited": usable_as_evidence(run).to_dict(),
        "environment": {k: v for k, v in (run.environment or {}).items() if k != "spec"},
    }


def export_filename(run: BenchmarkRun, suffix: str) -> str:
    label = slugify(run.label)[:40]
    return f"run-{run.pk}{'-' + label if label else ''}{suffix}"


def request_csv(blob: bytes):
    """The run's request log as CSV lines, for a streaming download."""
    return request_records.csv_lines(blob)
