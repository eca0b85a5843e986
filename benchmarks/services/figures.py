"""The compare page's charts as plotly figure dicts (drawn by static/controlpanel/charts.js):
latency CDFs, throughput against latency, and each run's timeline. One colour per run, the
same on every chart."""

from __future__ import annotations

import math

from benchmarks.metrics import ITL, TTFT
from benchmarks.models import BenchmarkRun, RunPoint

MAX_TIMELINE_POINTS = 1500
PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea")  # one colour per run, on every chart


def compare_figures(runs: list[BenchmarkRun]) -> dict:
    """Every chart of the compare page; a chart without data is None."""
    return {
        "ttft_cdf": cdf_figure(runs, TTFT.distribution, TTFT.title),
        "itl_cdf": cdf_figure(runs, ITL.distribution, ITL.title),
        "throughput_latency": throughput_latency_figure(runs),
        **timeline_figures(runs),
    }


def _colour(number: int) -> str:
    return PALETTE[number % len(PALETTE)]


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
    requests at or below x. ``metric`` is a key of the runs' distributions (see
    ``Latency.distribution``). None when no run has per-request data."""
    traces = []
    for number, run in enumerate(runs):
        dist = run.distributions or {}
        values, q = dist.get(metric), dist.get("q")
        if not values or not q or len(values) != len(q):
            continue
        name = run.numbered_name
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": name,
                "x": values,
                "y": [round(p / 100, 5) for p in q],
                "line": {"color": _colour(number)},
                "hovertemplate": "%{x:.1f} ms: %{y:.1%}<extra>" + name + "</extra>",
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
        group = f"run-{run.pk}"
        stages = _stage_trace(run, number, group)
        if stages is not None:
            traces.append(stages)
        if run.ttft_p95_ms is not None and run.output_tokens_per_s is not None:
            traces.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": run.numbered_name,
                    "legendgroup": group,
                    "x": [run.ttft_p95_ms],
                    "y": [run.output_tokens_per_s],
                    "marker": {"color": _colour(number), "size": 14, "symbol": "diamond"},
                }
            )
    if not traces:
        return None
    return {
        "data": traces,
        "layout": _layout("Throughput against latency", "TTFT p95 (ms)", "output tokens/s"),
    }


def _stage_trace(run: BenchmarkRun, number: int, group: str) -> dict | None:
    """The run's stages as a line of (p95 TTFT, tokens/s) points; None under two stages."""
    stage_x, stage_y, stage_names = [], [], []
    for name, stage in (run.stages or {}).items():
        x, y = stage.get(TTFT.summary_key(95)), stage.get("output_throughput")
        if isinstance(x, int | float) and isinstance(y, int | float):
            stage_x.append(x)
            stage_y.append(y)
            stage_names.append(name)
    if len(stage_x) <= 1:
        return None
    return {
        "type": "scatter",
        "mode": "lines+markers+text",
        "name": f"{run.numbered_name} stages",
        "legendgroup": group,
        "showlegend": False,  # the run's own entry toggles both
        "x": stage_x,
        "y": stage_y,
        "text": stage_names,
        "textposition": "top center",
        "marker": {"color": _colour(number), "size": 8},
        "line": {"color": _colour(number), "dash": "dot"},
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
        t = [p[0] for p in points]
        ttft_traces.append(_timeline_trace(run, number, t, [p[1] for p in points]))
        token_traces.append(_timeline_trace(run, number, t, [p[2] for p in points]))
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


def _timeline_trace(run: BenchmarkRun, number: int, t: list, values: list) -> dict:
    return {
        "type": "scatter",
        "mode": "lines",
        "name": run.numbered_name,
        "x": t,
        "y": values,
        "line": {"color": _colour(number)},
        "connectgaps": False,
    }
