"""The shared history of runs: the filtered, sorted list; the side-by-side comparison of 2-4
runs (deltas, CDFs, throughput against latency, timelines, what differs in their configs);
a run exported in the load generator's format."""

from __future__ import annotations

import json
import math
from datetime import datetime, time

from django.db.models import F, Q, QuerySet
from django.utils import timezone

from benchmarks import records as request_records
from benchmarks.loadgen import __version__ as LOADGEN_VERSION
from benchmarks.loadgen.profile import build_spec
from benchmarks.loadgen.spec import SpecError
from benchmarks.models import GPU_SEPARATOR, BenchmarkRun, RunPoint
from benchmarks.services.runs import COLUMNS
from controlpanel.choices import OperationStatus

EXPORT_FORMAT = "llm-control-panel/run"
EXPORT_VERSION = 1

# What the list reads of each run: headline columns and the names of what it points at,
# never the JSON parts (summary, stages, server, distributions, environment), which are
# kilobytes a run and would make a page of 100 runs megabytes.
LIST_FIELDS = (
    "id",
    "label",
    "status",
    "source",
    "created_at",
    "started_at",
    "engine",
    "engine_version",
    "model_name",
    "gpu_model",
    "gpu_count",
    "currency",
    "completed",
    "failed",
    "error_rate",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p95_ms",
    "itl_p99_ms",
    "output_tokens_per_s",
    "goodput_share",
    "goodput_rps",
    "cost_per_million_output",
    "deployment__name",
    "deployment__host__name",
    "engine_config__version",
    "load_profile__name",
    "load_profile__version",
    "requested_by__username",
)
# Sort key in the URL → (column, label). "-key" sorts descending; runs without the number
# sort last either way.
SORTS = {
    "date": ("created_at", "Date"),
    "ttft_p50_ms": ("ttft_p50_ms", "TTFT p50"),
    "ttft_p95_ms": ("ttft_p95_ms", "TTFT p95"),
    "ttft_p99_ms": ("ttft_p99_ms", "TTFT p99"),
    "itl_p50_ms": ("itl_p50_ms", "ITL p50"),
    "itl_p95_ms": ("itl_p95_ms", "ITL p95"),
    "itl_p99_ms": ("itl_p99_ms", "ITL p99"),
    "output_tokens_per_s": ("output_tokens_per_s", "Output tok/s"),
    "error_rate": ("error_rate", "Errors"),
    "goodput_share": ("goodput_share", "Goodput"),
    "cost_per_million_output": ("cost_per_million_output", "Per 1M output"),
}
DEFAULT_SORT = "-date"
PAGE_SIZES = (25, 50, 100)


# --- the list -------------------------------------------------------------------------------
def filtered_runs(criteria: dict) -> QuerySet:
    """Runs matching the history form's cleaned data, in its sort order."""
    runs = BenchmarkRun.objects.select_related(
        "deployment__host", "engine_config", "load_profile", "requested_by"
    ).only(*LIST_FIELDS)
    exact = {
        "host": "deployment__host",
        "engine": "engine",
        "model": "model_name",
        "config": "engine_config__version",
        "profile": "load_profile__name",
        "status": "status",
        "requested_by": "requested_by",
        "source": "source",
    }
    for key, lookup in exact.items():
        value = criteria.get(key)
        if value not in (None, ""):
            runs = runs.filter(**{lookup: value})
    if criteria.get("gpu"):
        runs = runs.filter(used_gpu(criteria["gpu"]))
    if criteria.get("q"):
        runs = runs.filter(label__icontains=criteria["q"])
    tz = timezone.get_current_timezone()
    if criteria.get("date_from"):
        runs = runs.filter(created_at__gte=datetime.combine(criteria["date_from"], time.min, tz))
    if criteria.get("date_to"):
        runs = runs.filter(created_at__lte=datetime.combine(criteria["date_to"], time.max, tz))
    return runs.order_by(*ordering(criteria.get("sort") or DEFAULT_SORT))


def used_gpu(name: str) -> Q:
    """Runs that used a GPU named ``name``. A host with mixed GPUs records their names joined
    (``gpu_model`` is "A, B"), so the name matches one whole item of that list: the whole
    value, its first, its last or a middle item, never the start of a longer name ("NVIDIA
    A100" does not find "NVIDIA A100-SXM4-80GB"). Case-insensitive, as the box is free text
    (and SQLite's LIKE is anyway)."""
    sep = GPU_SEPARATOR
    return (
        Q(gpu_model__iexact=name)
        | Q(gpu_model__istartswith=name + sep)
        | Q(gpu_model__iendswith=sep + name)
        | Q(gpu_model__icontains=sep + name + sep)
    )


def ordering(sort: str) -> list:
    key = sort.removeprefix("-")
    column = SORTS[key][0]
    descending = sort.startswith("-")
    if key == "date":  # never null: a plain order the created_at index serves
        return ["-created_at", "-pk"] if descending else ["created_at", "pk"]
    first = F(column).desc(nulls_last=True) if descending else F(column).asc(nulls_last=True)
    return [first, "-pk" if descending else "pk"]


def sort_links(current: str, query) -> dict[str, dict]:
    """For each sortable column: the URL that sorts by it (flipping the direction when it
    is the current sort) and the arrow to show."""
    base = query.copy()
    for name in ("sort", "page"):
        base.pop(name, None)
    links = {}
    for key in SORTS:
        active = current.removeprefix("-") == key
        descending = current.startswith("-")
        # Latencies, errors and cost read best ascending first; throughput, goodput and
        # dates descending first.
        first = "-" if key in ("date", "output_tokens_per_s", "goodput_share") else ""
        if active:
            target = key if descending else f"-{key}"
        else:
            target = f"{first}{key}"
        base["sort"] = target
        links[key] = {
            "url": "?" + base.urlencode(),
            "arrow": ("▼" if descending else "▲") if active else "",
        }
    return links


# --- compare --------------------------------------------------------------------------------
# (column, label, unit, better, kind): better is "lower", "higher" or None (no verdict);
# kind "pct" shows a fraction as a percentage and its delta in percentage points.
METRICS = (
    ("ttft_p50_ms", "TTFT p50", "ms", "lower", 0),
    ("ttft_p95_ms", "TTFT p95", "ms", "lower", 0),
    ("ttft_p99_ms", "TTFT p99", "ms", "lower", 0),
    ("itl_p50_ms", "ITL p50", "ms", "lower", 1),
    ("itl_p95_ms", "ITL p95", "ms", "lower", 1),
    ("itl_p99_ms", "ITL p99", "ms", "lower", 1),
    ("tpot_p50_ms", "TPOT p50", "ms", "lower", 1),
    ("e2el_p99_ms", "End-to-end p99", "ms", "lower", 0),
    ("output_tokens_per_s", "Output tokens/s", "tok/s", "higher", 0),
    ("request_throughput", "Successful requests/s", "req/s", "higher", 2),
    ("goodput_rps", "Goodput", "req/s", "higher", 2),
    ("goodput_share", "Requests meeting the SLO", "", "higher", "pct"),
    ("error_rate", "Error rate", "", "lower", "pct"),
    ("cost_per_million_output", "Cost per 1M output tokens", "currency", "lower", 3),
    ("completed", "Succeeded", "", None, 0),
    ("failed", "Failed", "", "lower", 0),
    ("duration_s", "Duration", "s", None, 1),
)
# Changes smaller than this share of the baseline are shown as "same": run-to-run noise.
SAME_WITHIN = 0.01
MAX_TIMELINE_POINTS = 1500
PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea")  # one colour per run, on every chart
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
COMPARE_SELECT = ("deployment__host", "engine_config", "load_profile", "requested_by")


class CompareRefused(ValueError):
    """A comparison that cannot be made; the message says why."""


def runs_to_compare(ids: list[str]) -> list[BenchmarkRun]:
    """2-4 runs, in the order given (the first is the baseline)."""
    wanted = []
    for value in ids:
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            if not part.isdigit():
                raise CompareRefused(f"{part!r} is not a run number.")
            if int(part) not in wanted:
                wanted.append(int(part))
    if not 2 <= len(wanted) <= 4:
        raise CompareRefused(
            f"Pick 2 to 4 runs to compare ({len(wanted)} given): tick them in the history."
        )
    found = {
        r.pk: r for r in BenchmarkRun.objects.select_related(*COMPARE_SELECT).filter(pk__in=wanted)
    }
    missing = [str(pk) for pk in wanted if pk not in found]
    if missing:
        raise CompareRefused(f"No run #{', #'.join(missing)}.")
    return [found[pk] for pk in wanted]


def run_name(run: BenchmarkRun) -> str:
    return f"#{run.pk} {run.label}".strip() if run.label else f"#{run.pk}"


def compare(runs: list[BenchmarkRun]) -> dict:
    """Everything the compare page shows, the first run as the baseline."""
    diff = config_diff(runs)
    return {
        "runs": runs,
        "names": [run_name(r) for r in runs],
        "rows": metric_rows(runs),
        "warnings": warnings(runs),
        "diff": diff,
        "figures": {
            "ttft_cdf": cdf_figure(runs, "ttft_ms", "TTFT"),
            "itl_cdf": cdf_figure(runs, "itl_ms", "Inter-token latency"),
            "throughput_latency": throughput_latency_figure(runs),
            **timeline_figures(runs),
        },
    }


def _format(value, kind) -> str:
    if value is None:
        return "—"
    if kind == "pct":
        return f"{value * 100:.1f} %"
    return f"{value:,.{kind}f}"


def delta(value, base, better, kind) -> dict:
    """The change from the baseline, its words, and whether it is better or worse."""
    if value is None or base is None:
        return {"text": "", "verdict": ""}
    change = value - base
    relative = change / abs(base) if base else None
    if kind == "pct":
        text = f"{change * 100:+.1f} pp"  # a share's change reads in points, not per cent
    else:
        text = f"{change:+,.{kind}f}"
        if relative is not None:
            text += f" ({relative * 100:+.1f} %)"
    if better is None:
        verdict = ""
    elif change == 0 or (relative is not None and abs(relative) < SAME_WITHIN):
        verdict = "same"
    elif (change < 0) == (better == "lower"):
        verdict = "better"
    else:
        verdict = "worse"
    return {"text": text, "verdict": verdict}


def metric_rows(runs: list[BenchmarkRun]) -> list[dict]:
    base = runs[0]
    currencies = {r.currency for r in runs if r.cost_per_million_output is not None}
    rows = []
    for column, label, unit, better, kind in METRICS:
        values = [getattr(r, column) for r in runs]
        if all(v is None for v in values):
            continue
        if unit == "currency":
            unit = ", ".join(sorted(c for c in currencies if c)) or ""
            if len(currencies) > 1:
                better = None  # no verdict across currencies
        base_value = getattr(base, column)
        cells = []
        for number, value in enumerate(values):
            cell = {"text": _format(value, kind), "value": value, "delta": "", "verdict": ""}
            if number:
                change = delta(value, base_value, better, kind)
                cell.update(delta=change["text"], verdict=change["verdict"])
            cells.append(cell)
        rows.append({"key": column, "label": label, "unit": unit, "cells": cells})
    return rows


def warnings(runs: list[BenchmarkRun]) -> list[str]:
    """What makes the comparison unfair or partial."""
    out = []
    profiles = {(r.load_profile.name, r.load_profile.version) for r in runs if r.load_profile}
    names = {name for name, _ in profiles}
    without = [run_name(r) for r in runs if r.load_profile is None]
    if len(names) > 1:
        out.append(
            "The runs used different load profiles ("
            + ", ".join(f"{n} v{v}" for n, v in sorted(profiles))
            + "): their numbers measure different loads."
        )
    elif len(profiles) > 1:
        versions = ", ".join(f"v{v}" for _, v in sorted(profiles))
        out.append(
            f"The runs used different versions of the load profile {next(iter(names))!r} "
            f"({versions}): check what changed between them before reading the deltas."
        )
    if without and (profiles or len(without) > 1):
        out.append(
            f"{', '.join(without)} recorded no load profile (imported): "
            "the load may not be the same."
        )
    for attribute, words in (
        ("gpu_model", "GPU models"),
        ("gpu_count", "GPU counts"),
        ("engine", "engines"),
        ("model_name", "models"),
    ):
        values = {getattr(r, attribute) for r in runs if getattr(r, attribute) not in ("", None)}
        if len(values) > 1:
            out.append(f"Different {words}: {', '.join(str(v) for v in sorted(values, key=str))}.")
    currencies = {r.currency for r in runs if r.currency}
    if len(currencies) > 1:
        out.append(f"Costs are in different currencies ({', '.join(sorted(currencies))}).")
    for run in runs:
        if run.status != OperationStatus.SUCCEEDED:
            out.append(
                f"{run_name(run)} {run.get_status_display().lower()}: its numbers are partial."
            )
    return out


def _shown(key: str, value) -> str:
    if value is None:
        return "—"
    if any(word in key.upper() for word in SECRET_WORDS) and value not in ("", "***"):
        return "•••"  # compared, never shown
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _settings(run: BenchmarkRun) -> dict | None:
    if run.engine_config is not None:
        return run.engine_config.flat()
    recorded = (run.environment or {}).get("config")
    if isinstance(recorded, dict):
        flat = dict(recorded.get("settings") or {})
        flat.update({f"env.{k}": v for k, v in (recorded.get("env") or {}).items()})
        flat.update(
            {
                f"placement.{k}": v
                for k, v in (recorded.get("placement") or {}).items()
                if v is not None
            }
        )
        return flat
    return None


def config_diff(runs: list[BenchmarkRun]) -> dict:
    """What was set up differently: the facts every run has (deployment, engine, GPUs,
    model, profile, config version) and every engine setting whose value is not the same in
    all runs. Cells that differ from the baseline are marked ``changed``."""
    facts = [
        ("Deployment", [str(r.deployment) for r in runs]),
        ("Engine", [f"{r.engine} {r.engine_version}".strip() or None for r in runs]),
        ("Model", [r.model_name or None for r in runs]),
        ("GPUs", [f"{r.gpu_count or '?'} × {r.gpu_model}" if r.gpu_model else None for r in runs]),
        ("Load profile", [str(r.load_profile) if r.load_profile else None for r in runs]),
        (
            "Config version",
            [f"v{r.engine_config.version}" if r.engine_config else None for r in runs],
        ),
    ]
    settings = [_settings(r) for r in runs]
    keys = sorted({k for s in settings if s for k in s})
    differing = [
        k
        for k in keys
        if len({json.dumps((s or {}).get(k), sort_keys=True, default=str) for s in settings}) > 1
    ]

    def row(label: str, raw: list, key: str = "") -> dict:
        texts = [_shown(key, v) for v in raw]
        # Compare the values, not their display (two different secrets both show •••).
        marks = [json.dumps(v, sort_keys=True, default=str) for v in raw]
        return {
            "label": label,
            "cells": [
                {"text": t, "changed": n > 0 and m != marks[0]}
                for n, (t, m) in enumerate(zip(texts, marks, strict=True))
            ],
            "changed": len(set(marks)) > 1,
        }

    fact_rows = [row(label, values) for label, values in facts]
    setting_rows = [row(k, [(s or {}).get(k) for s in settings], k) for k in differing]
    changed = sum(1 for r in fact_rows if r["changed"] and r["label"] != "Config version")
    return {
        "facts": fact_rows,
        "settings": setting_rows,
        "same_settings": len(keys) - len(differing),
        "unknown": [run_name(r) for r, s in zip(runs, settings, strict=True) if s is None],
        # Config version always moves with the settings; count the settings themselves.
        "changes": changed + len(setting_rows),
    }


# --- figures (plotly dicts, drawn by static/controlpanel/charts.js) -------------------------
def _layout(title: str, x: str, y: str, **extra) -> dict:
    layout = {
        "title": {"text": title},
        "xaxis": {"title": {"text": x}},
        "yaxis": {"title": {"text": y}},
        "margin": {"l": 60, "r": 20, "t": 40, "b": 90},
        "legend": {"orientation": "h", "y": -0.3},
        "height": 340,
    }
    for axis, options in extra.items():
        layout[axis] = {**layout.get(axis, {}), **options}
    return layout


def cdf_figure(runs: list[BenchmarkRun], metric: str, title: str) -> dict | None:
    """One cumulative curve per run from its stored quantiles: x = ms, y = share of
    requests at or below x. None when no run has per-request data."""
    traces = []
    for number, run in enumerate(runs):
        dist = run.distributions or {}
        values, q = dist.get(metric), dist.get("q")
        if not values or not q or len(values) != len(q):
            continue
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": run_name(run),
                "x": values,
                "y": [round(p / 100, 5) for p in q],
                "line": {"color": PALETTE[number % len(PALETTE)]},
                "hovertemplate": "%{x:.1f} ms: %{y:.1%}<extra>" + run_name(run) + "</extra>",
            }
        )
    if not traces:
        return None
    return {
        "data": traces,
        "layout": _layout(
            f"{title} CDF",
            f"{title} (ms)",
            "share of requests ≤ x",
            yaxis={"range": [0, 1.02], "tickformat": ".0%"},
        ),
    }


def throughput_latency_figure(runs: list[BenchmarkRun]) -> dict | None:
    """Output tokens/s against p95 TTFT: the whole run as a diamond, each stage as a point
    on a line (low → peak), so a config that buys throughput with latency shows its price."""
    traces = []
    for number, run in enumerate(runs):
        stage_x, stage_y, stage_names = [], [], []
        for name, stage in (run.stages or {}).items():
            x, y = stage.get("p95_ttft_ms"), stage.get("output_throughput")
            if isinstance(x, int | float) and isinstance(y, int | float):
                stage_x.append(x)
                stage_y.append(y)
                stage_names.append(name)
        group = f"run-{run.pk}"
        if len(stage_x) > 1:
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers+text",
                    "name": f"{run_name(run)} stages",
                    "legendgroup": group,
                    "showlegend": False,  # the run's own entry toggles both
                    "x": stage_x,
                    "y": stage_y,
                    "text": stage_names,
                    "textposition": "top center",
                    "marker": {"color": PALETTE[number % len(PALETTE)], "size": 8},
                    "line": {"color": PALETTE[number % len(PALETTE)], "dash": "dot"},
                }
            )
        if run.ttft_p95_ms is not None and run.output_tokens_per_s is not None:
            traces.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": run_name(run),
                    "legendgroup": group,
                    "x": [run.ttft_p95_ms],
                    "y": [run.output_tokens_per_s],
                    "marker": {
                        "color": PALETTE[number % len(PALETTE)],
                        "size": 14,
                        "symbol": "diamond",
                    },
                }
            )
    if not traces:
        return None
    return {
        "data": traces,
        "layout": _layout("Throughput against latency", "TTFT p95 (ms)", "output tokens/s"),
    }


def timeline_figures(runs: list[BenchmarkRun]) -> dict:
    """p95 TTFT and output tokens/s over each run's own clock, one trace per run. Only the
    two numbers are read from each point (not its per-request samples)."""
    rows = (
        RunPoint.objects.filter(run__in=[r.pk for r in runs])
        .order_by("run", "t")
        .values_list("run_id", "t", "data__ttft_p95_ms", "data__output_tokens_per_s")
    )
    series: dict[int, list] = {r.pk: [] for r in runs}
    for run_id, t, ttft, tokens in rows:
        series[run_id].append((t, ttft, tokens))
    ttft_traces, token_traces = [], []
    for number, run in enumerate(runs):
        points = series[run.pk]
        if not points:
            continue
        step = max(1, math.ceil(len(points) / MAX_TIMELINE_POINTS))
        points = points[::step]
        colour = PALETTE[number % len(PALETTE)]
        t = [p[0] for p in points]
        for traces, values in (
            (ttft_traces, [p[1] for p in points]),
            (token_traces, [p[2] for p in points]),
        ):
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": run_name(run),
                    "x": t,
                    "y": values,
                    "line": {"color": colour},
                    "connectgaps": False,
                }
            )
    return {
        "timeline_ttft": {
            "data": ttft_traces,
            "layout": _layout("TTFT p95 over the run (10 s window)", "seconds", "ms"),
        }
        if ttft_traces
        else None,
        "timeline_tokens": {
            "data": token_traces,
            "layout": _layout("Output tokens/s over the run", "seconds", "tokens/s"),
        }
        if token_traces
        else None,
    }


# --- export -----------------------------------------------------------------------------------
def _masked(values: dict) -> dict:
    return {
        k: ("***" if any(w in k.upper() for w in SECRET_WORDS) else v)
        for k, v in (values or {}).items()
    }


def export_spec(run: BenchmarkRun) -> dict | None:
    """The load generator spec the run applied: as recorded when it ran, else rebuilt from
    its profile version (aimed at its deployment)."""
    recorded = (run.environment or {}).get("spec")
    if isinstance(recorded, dict):
        return recorded
    if run.load_profile is None or run.load_profile.spec.get("replay"):
        return None
    try:
        return build_spec(
            run.load_profile.spec, run.deployment.engine_url, run.model_name
        ).to_dict()
    except SpecError:
        return None


def export_document(run: BenchmarkRun) -> dict:
    """The run as the load generator's CLI writes a result (so the same tools read both),
    plus a ``panel`` part with where it ran and with what; ``import_run`` reads it back."""
    summary = dict(run.summary or {})
    for column, key in COLUMNS.items():
        value = getattr(run, column)
        if summary.get(key) is None and value is not None:
            summary[key] = value
    spec = export_spec(run)
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
    timeline = []
    for point in RunPoint.objects.filter(run=run).order_by("t").values_list("data", flat=True):
        point.pop("ttfts", None)  # live-view samples; the CLI's timeline has none either
        timeline.append(point)
    config = run.engine_config
    profile = run.load_profile
    environment = {k: v for k, v in (run.environment or {}).items() if k != "spec"}
    return {
        **summary,
        "stages": run.stages or {},
        "timeline": timeline,
        "server": run.server or {},
        "cancelled": run.status == OperationStatus.CANCELLED,
        "stopped_early": run.stopped_early or None,
        "notes": list(run.notes or []),
        "spec": spec,
        "panel": {
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "exported_at": timezone.now().isoformat(timespec="seconds"),
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
            "created_at": run.created_at.isoformat(timespec="seconds"),
            "finished_at": run.finished_at.isoformat(timespec="seconds")
            if run.finished_at
            else None,
            "config": {
                "version": config.version,
                "settings": _masked(config.settings),
                "env": _masked(config.env),
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
            "environment": environment,
        },
    }


def export_filename(run: BenchmarkRun, suffix: str) -> str:
    from django.utils.text import slugify

    label = slugify(run.label)[:40]
    return f"run-{run.pk}{'-' + label if label else ''}{suffix}"


def request_csv(blob: bytes):
    return request_records.csv_lines(blob)
