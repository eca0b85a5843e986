"""The scaling page's live signal charts as plotly figure dicts, built from stored engine
samples (``EngineSample.signals``, the ``Signals.as_dict()`` format).

One table, ``CHARTS``, says which signal each line draws: the server builds the initial
figures and the ``signals_json`` columns from it, and every trace carries its ``meta``
(the signal's path in the stored dict and the unit scale), so static/scaling/scaling_live.js
extends the lines from live events without a mapping of its own."""

from __future__ import annotations

from dataclasses import dataclass

# Fifteen minutes at the poller's one-second interval; older points scroll off.
WINDOW_S = 15 * 60
MAX_POINTS = 900
PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea")
SLO_COLOUR = "#c0392b"


@dataclass(frozen=True)
class Line:
    """One trace: ``path`` into the stored signals (dots for nesting), times ``scale``."""

    label: str
    path: str
    scale: float = 1.0


@dataclass(frozen=True)
class Chart:
    key: str
    title: str
    unit: str
    lines: tuple[Line, ...]
    # Which SLO draws a horizontal line on this chart ("ttft", "itl" or "").
    slo: str = ""
    percent: bool = False


CHARTS: tuple[Chart, ...] = (
    Chart(
        "queue",
        "Requests waiting and running",
        "requests",
        (Line("waiting", "requests_waiting"), Line("running", "requests_running")),
    ),
    Chart(
        "pending",
        "Pending prompt tokens (estimated)",
        "tokens",
        (Line("pending prompt tokens", "pending_prompt_tokens"),),
    ),
    Chart(
        "kv",
        "KV-cache usage",
        "%",
        (Line("KV cache in use", "kv_cache_usage_ratio", 100.0),),
        percent=True,
    ),
    Chart(
        "ttft",
        "p95 time to first token",
        "ms",
        (Line("p95 TTFT 1m", "ttft.1m.p95", 1000.0), Line("p95 TTFT 5m", "ttft.5m.p95", 1000.0)),
        slo="ttft",
    ),
    Chart(
        "itl",
        "p95 inter-token latency",
        "ms",
        (Line("p95 ITL 1m", "itl.1m.p95", 1000.0), Line("p95 ITL 5m", "itl.5m.p95", 1000.0)),
        slo="itl",
    ),
    Chart(
        "output",
        "Output tokens per second",
        "tokens/s",
        (Line("output tokens/s", "output_tokens_per_s"),),
    ),
    Chart(
        "preemptions",
        "Preemptions per second",
        "/s",
        (Line("preemptions/s", "preemptions_per_s"),),
    ),
)
PATHS: tuple[str, ...] = tuple(line.path for chart in CHARTS for line in chart.lines)


def value(signals: dict, line: Line) -> float | None:
    """The value ``line`` draws from one stored signals dict (None: not measured)."""
    current = signals
    for part in line.path.split("."):
        if not isinstance(current, dict):
            return None
        current = current.get(part)
    if current is None or isinstance(current, bool) or not isinstance(current, int | float):
        return None
    return round(current * line.scale, 4)


def columns(rows: list[tuple[float, dict]]) -> dict:
    """``{"t": [epoch ms], "values": {path: [...]}}`` of rows ``(epoch seconds, signals)``
    oldest first: what the charts draw and what ``signals_json`` serves."""
    lines = [line for chart in CHARTS for line in chart.lines]
    return {
        "t": [int(at * 1000) for at, _ in rows],
        "values": {line.path: [value(signals, line) for _, signals in rows] for line in lines},
    }


def _slo_shape(ms: float) -> dict:
    return {
        "type": "line",
        "xref": "paper",
        "x0": 0,
        "x1": 1,
        "y0": ms,
        "y1": ms,
        "line": {"color": SLO_COLOUR, "dash": "dash", "width": 1.5},
    }


def signal_figures(data: dict, slo_ttft_ms: float, slo_itl_ms: float | None) -> list[dict]:
    """One figure per chart from ``columns()``; each is ``{"key", "title", "figure"}``. The
    SLO is a dashed line on the latency chart it applies to (with its value in the title)."""
    slos = {"ttft": slo_ttft_ms, "itl": slo_itl_ms}
    out = []
    for chart in CHARTS:
        traces = [
            {
                "type": "scatter",
                "mode": "lines",
                "name": line.label,
                "x": data["t"],
                "y": data["values"][line.path],
                "line": {"color": PALETTE[number % len(PALETTE)], "width": 1.5},
                "meta": {"path": line.path, "scale": line.scale},
                "connectgaps": False,
            }
            for number, line in enumerate(chart.lines)
        ]
        slo = slos.get(chart.slo) if chart.slo else None
        title = chart.title + (f" · SLO {slo:g} ms" if slo else "")
        yaxis = {"title": {"text": chart.unit}, "rangemode": "tozero"}
        if chart.percent:
            yaxis["range"] = [0, 100]
        layout = {
            "title": {"text": title, "font": {"size": 13}},
            "xaxis": {"type": "date"},
            "yaxis": yaxis,
            "margin": {"l": 55, "r": 10, "t": 34, "b": 30},
            "height": 240,
            "showlegend": len(traces) > 1,
            "legend": {"orientation": "h", "y": 1.12, "x": 1, "xanchor": "right"},
            "shapes": [_slo_shape(slo)] if slo else [],
        }
        out.append({"key": chart.key, "title": title, "figure": {"data": traces, "layout": layout}})
    return out
