"""What the scaling pages show, arranged from the scaling state (``scaling.services.state``):
the fleet table with its filter, sort and headline counts, and one deployment's blocks
(evidence links, thresholds with the series they apply to, exports, what-ifs)."""

from __future__ import annotations

from django.urls import reverse

from benchmarks.models import BenchmarkRun
from hosts.models import Deployment
from scaling import figures
from scaling.choices import CapacityStatus, ProvisioningStatus, badge
from scaling.models import WhatIfPlan
from scaling.planning import series
from scaling.services import exports

# Worst first: what needs a person's attention leads the fleet table.
STATUS_ORDER = {"under": 0, "over": 1, "unknown": 2, "ok": 3}
SORTS = {
    "status": ("Status", lambda r: (STATUS_ORDER.get(r["status"]["value"], 9), r["name"])),
    "name": ("Deployment", lambda r: r["name"]),
    "gap": ("Replicas missing", lambda r: (-(r["desired"] - r["current"]), r["name"])),
    "waiting": ("Waiting", lambda r: (-(r["waiting"] or 0), r["name"])),
    "ttft": ("p95 TTFT vs SLO", lambda r: (-(r["ttft_share"] or 0), r["name"])),
}
THRESHOLDS = (
    ("requests_waiting", "Requests waiting per replica", "requests_waiting", ""),
    ("activation_requests_waiting", "Activation: requests waiting", "requests_waiting", ""),
    ("pending_prompt_tokens", "Pending prompt tokens per replica", "pending_prompt_tokens", ""),
    ("requests_per_s", "Requests/s per replica", "arrival_requests_per_second", "req/s"),
    ("kv_cache_usage_ratio", "KV-cache usage", "kv_cache_usage_ratio", "ratio"),
    ("ttft_p95_seconds", "p95 TTFT", "ttft_p95_seconds", "s"),
    ("itl_p95_seconds", "p95 ITL", "itl_p95_seconds", "s"),
)
EXPORTS = (
    (
        "keda.yaml",
        "KEDA ScaledObject (YAML)",
        "kubectl apply -f it in the namespace of the engine's Deployment; KEDA must reach "
        "the Prometheus that scrapes the panel.",
    ),
    (
        "alerts.yaml",
        "Prometheus alert rules (YAML)",
        "Add it to rule_files in prometheus.yml (or a PrometheusRule's spec) and reload.",
    ),
    (
        "grafana.json",
        "Grafana dashboard (JSON)",
        "Dashboards → New → Import, upload the file and pick the Prometheus data source.",
    ),
)


# The "now" tiles: (path in the stored signals, label, digits); units from figures.CHARTS.
NOW = (
    ("requests_waiting", "waiting", 0),
    ("requests_running", "running", 0),
    ("pending_prompt_tokens", "pending prompt tokens", 0),
    ("kv_cache_usage_ratio", "KV cache", 0),
    ("ttft.1m.p95", "p95 TTFT 1m", 0),
    ("itl.1m.p95", "p95 ITL 1m", 1),
    ("output_tokens_per_s", "output tokens/s", 0),
    ("preemptions_per_s", "preemptions/s", 2),
)


def now_tiles(signals) -> list[dict]:
    """The newest signals as tiles; each names its path, scale and unit so the live script
    updates it from a ``deployment.signals`` event the same way."""
    lines = {line.path: (line, chart) for chart in figures.CHARTS for line in chart.lines}
    stored = signals.as_dict() if signals is not None else {}
    tiles = []
    for path, label, digits in NOW:
        line, chart = lines[path]
        value = figures.value(stored, line)
        unit = "" if chart.unit in ("requests", "tokens", "tokens/s", "/s") else " " + chart.unit
        tiles.append(
            {
                "path": path,
                "label": label,
                "scale": line.scale,
                "digits": digits,
                "unit": unit,
                "text": "—" if value is None else f"{value:,.{digits}f}{unit}",
            }
        )
    return tiles


def _ms(window) -> float | None:
    return None if window is None or window.p95 is None else window.p95 * 1000.0


def fleet_row(state) -> dict:
    signals = state.signals
    ttft = _ms(signals.ttft.get("1m")) if signals else None
    slo = state.slo.ttft_p95_ms
    return {
        "id": state.deployment_id,
        "name": f"{state.host}/{state.deployment}",
        "model": state.model,
        "engine": state.engine,
        "url": reverse("scaling:deployment", args=[state.deployment_id]),
        "status": badge(ProvisioningStatus, state.decision.status),
        "current": state.decision.current,
        "desired": state.decision.desired,
        "waiting": signals.requests_waiting if signals else None,
        "ttft_ms": ttft,
        "ttft_share": ttft / slo if ttft is not None and slo else None,
        "slo_ms": slo,
        "kv_pct": signals.kv_cache_usage_ratio * 100
        if signals and signals.kv_cache_usage_ratio is not None
        else None,
        "capacity": badge(CapacityStatus, state.capacity.status),
        "capacity_rps": state.capacity.rps,
        "signals_note": state.signals_note,
    }


def fleet_table(states, status: str | None, sort: str | None) -> dict:
    """The fleet page's context: rows filtered by ``status`` (one of ProvisioningStatus,
    else all) and ordered by ``sort`` (a key of SORTS, else worst first), with counts of
    every status over the whole fleet."""
    rows = [fleet_row(state) for state in states]
    counts = {choice.value: 0 for choice in ProvisioningStatus}
    for row in rows:
        counts[row["status"]["value"]] = counts.get(row["status"]["value"], 0) + 1
    status = status if status in counts else ""
    sort = sort if sort in SORTS else "status"
    shown = sorted(
        (r for r in rows if not status or r["status"]["value"] == status), key=SORTS[sort][1]
    )
    return {
        "rows": shown,
        "total": len(rows),
        "counts": counts,
        "statuses": [
            {**badge(ProvisioningStatus, c.value), "count": counts[c.value]}
            for c in ProvisioningStatus
        ],
        "status": status,
        "sort": sort,
        "sorts": [(key, label) for key, (label, _) in SORTS.items()],
    }


def _evidence(point) -> dict | None:
    """A capacity evidence point with the link to where it was measured."""
    if point is None:
        return None
    url = None
    if point.run_id:
        url = reverse("benchmarks:detail", args=[point.run_id])
    elif point.sweep_id:
        url = reverse("changes:sweep", args=[point.sweep_id])
    return {"point": point, "url": url}


def thresholds_rows(thresholds) -> list[dict]:
    return [
        {
            "key": key,
            "label": label,
            "value": getattr(thresholds, key),
            "unit": unit,
            "series": series.name(key_series),
        }
        for key, label, key_series, unit in THRESHOLDS
    ]


def deployment_context(item: Deployment, state, base_url: str) -> dict:
    """Everything the deployment's scaling page shows except the charts and the form."""
    group = list(
        Deployment.objects.filter(pk__in=list(state.group) or [item.pk])
        .select_related("host")
        .order_by("host__name", "name")
    )
    capacity = state.capacity
    run_ids = {p.run_id for p in (capacity.best, capacity.breach) if p is not None and p.run_id}
    return {
        "deployment": item,
        "state": state,
        "now": now_tiles(state.signals),
        "group": group,
        "decision_badge": badge(ProvisioningStatus, state.decision.status),
        "capacity_badge": badge(CapacityStatus, capacity.status),
        "best": _evidence(capacity.best),
        "breach": _evidence(capacity.breach),
        "evidence_runs": BenchmarkRun.objects.filter(pk__in=run_ids).order_by("-pk"),
        "thresholds": thresholds_rows(state.decision.thresholds),
        "threshold_evidence": state.decision.thresholds.evidence,
        "exports": [
            {
                "kind": kind,
                "label": label,
                "how": how,
                "url": reverse("scaling:export", args=[item.pk, kind]),
            }
            for kind, label, how in EXPORTS
        ],
        "scrape_config": exports.scrape_config(base_url.rstrip("/")),
        "benchmark_url": reverse("benchmarks:new") + f"?deployment={item.pk}",
        "sweep_url": reverse("changes:sweep_new") + f"?deployment={item.pk}",
        "whatif_new_url": reverse("scaling:whatif_new", args=[item.pk]),
        "whatifs": WhatIfPlan.objects.filter(deployment=item).order_by("-created_at")[:5],
    }
