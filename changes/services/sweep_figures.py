"""The sweep page's two Pareto charts as plotly figures (plain dicts the page puts in a
``json_script`` for ``static/controlpanel/charts.js``): the server builds them so the page
needs no charting logic and no CDN.

(a) output tok/s per GPU against tok/s per user: what a deployment serves against what each
user feels; (b) output tok/s against p95 TTFT, the SLO's limit drawn. Predicted points are
hollow, measured ones filled, one colour per trial; the line joins the measured points no
other measured point beats on both axes (``benchmarks.sweep.pareto_front``)."""

from __future__ import annotations

from benchmarks.sweep import pareto_front

# Every number the sweep page shows, as one quantity with its unit: an axis, a column or a
# sentence names one of these, never a load beside a throughput per GPU as if they were one.
# key → (what it is, its unit).
QUANTITIES = {
    "load_rate": ("max load at the SLO", "req/s"),
    "load_concurrency": ("max load at the SLO", "concurrent users"),
    "output_tps": ("output throughput", "tok/s"),
    "output_tps_per_gpu": ("output throughput per GPU", "tok/s per GPU"),
    "output_tps_per_user": ("output speed per user", "tok/s per user"),
    "ttft_p95_ms": ("p95 TTFT", "ms"),
    "cost_per_million": ("cost per 1M output tokens", ""),
}


def load_key(mode: str) -> str:
    """The quantity a sweep's load is in: a request rate or a number of users."""
    return "load_rate" if mode == "rate" else "load_concurrency"


def axis_title(key: str) -> str:
    """ "output throughput per GPU (tok/s per GPU)": the quantity, then its unit."""
    name, unit = QUANTITIES[key]
    return f"{name} ({unit})" if unit else name


def quantity_text(key: str, value, unit: str = "") -> str:
    """One number with its quantity's unit ("503 req/s", "1,141 tok/s per GPU")."""
    if value is None:
        return "—"
    unit = unit or QUANTITIES[key][1]
    digits = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{digits} {unit}".strip()


COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
LAYOUT = {
    "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
    "height": 360,
    "legend": {"orientation": "h", "y": -0.25},
    "hovermode": "closest",
}


def _num(value) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _colour(trial) -> str:
    return COLOURS[(trial.index - 1) % len(COLOURS)]


def _marker(colour: str, predicted: bool) -> dict:
    if predicted:
        return {"color": "rgba(0,0,0,0)", "line": {"color": colour, "width": 2}, "size": 10}
    return {"color": colour, "size": 11}


def _frontier(items: list[dict], x: str, y: str, name: str = "measured frontier") -> dict | None:
    front = sorted((items[i] for i in pareto_front(items, x, y)), key=lambda p: p["plot_x"])
    if len(front) < 2:
        return None
    return {
        "type": "scatter",
        "mode": "lines",
        "name": name,
        "x": [p["plot_x"] for p in front],
        "y": [p["plot_y"] for p in front],
        "line": {"color": "#444", "dash": "dot"},
        "hoverinfo": "skip",
    }


def per_gpu_vs_per_user(sweep, trials) -> dict:
    """(a): each trial's predicted and measured point at its max load."""
    data, measured = [], []
    for trial in trials:
        colour = _colour(trial)
        predicted = (trial.predicted or {}).get("numbers") or {}
        px, py = (
            _num(predicted.get("output_tps_per_user")),
            _num(predicted.get("output_tps_per_gpu")),
        )
        if px is not None and py is not None:
            data.append(_point(f"#{trial.index} predicted", px, py, colour, True, trial.label))
        numbers = trial.numbers or {}
        mx, my = _num(numbers.get("output_tps_per_user")), _num(numbers.get("output_tps_per_gpu"))
        if mx is not None and my is not None and trial.met_slo:
            data.append(_point(f"#{trial.index} measured", mx, my, colour, False, trial.label))
            measured.append({"x": mx, "y": my, "plot_x": mx, "plot_y": my})
    line = _frontier(measured, "x", "y")
    if line:
        data.append(line)
    layout = {
        **LAYOUT,
        "title": {"text": "Per GPU against per user, each trial at its max load at the SLO"},
        "xaxis": {"title": {"text": axis_title("output_tps_per_user")}},
        "yaxis": {"title": {"text": axis_title("output_tps_per_gpu")}},
    }
    _hover_units(data, "output_tps_per_user", "output_tps_per_gpu")
    return {"data": data, "layout": layout}


def throughput_vs_ttft(sweep, trials) -> dict:
    """(b): every load each trial was predicted or measured at, with the SLO's TTFT limit."""
    data, measured = [], []
    gpus = (sweep.target or {}).get("num_gpus") or 1
    for trial in trials:
        colour = _colour(trial)
        curve = (trial.predicted or {}).get("curve") or []
        used = (trial.predicted or {}).get("gpus_used") or gpus
        xs, ys = [], []
        for point in curve:
            ttft, per_gpu = _num(point.get("ttft_p95_ms")), _num(point.get("output_tps_per_gpu"))
            if ttft is not None and per_gpu is not None:
                xs.append(ttft)
                ys.append(per_gpu * used)
        if xs:
            data.append(_series(f"#{trial.index} predicted", xs, ys, colour, True, trial.label))
        xs, ys = [], []
        for probe in trial.probes or []:
            numbers = probe.get("numbers") or {}
            ttft, tps = _num(numbers.get("ttft_p95_ms")), _num(numbers.get("output_tps"))
            if ttft is None or tps is None:
                continue
            xs.append(ttft)
            ys.append(tps)
            if probe.get("ok"):
                measured.append({"neg_ttft": -ttft, "tps": tps, "plot_x": ttft, "plot_y": tps})
        if xs:
            data.append(_series(f"#{trial.index} measured", xs, ys, colour, False, trial.label))
    line = _frontier(measured, "neg_ttft", "tps")
    if line:
        data.append(line)
    layout = {
        **LAYOUT,
        "title": {"text": "Output throughput of the config against p95 TTFT, every load tried"},
        "xaxis": {"title": {"text": axis_title("ttft_p95_ms")}},
        "yaxis": {"title": {"text": axis_title("output_tps") + ", all the config's GPUs"}},
    }
    _hover_units(data, "ttft_p95_ms", "output_tps")
    limit = _num((sweep.slo or {}).get("ttft_p95_ms"))
    if limit is not None:
        layout["shapes"] = [
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": limit,
                "x1": limit,
                "y0": 0,
                "y1": 1,
                "line": {"color": "#c0392b", "dash": "dash"},
            }
        ]
        layout["annotations"] = [
            {
                "x": limit,
                "xref": "x",
                "y": 1,
                "yref": "paper",
                "text": f"SLO {limit:g} ms",
                "showarrow": False,
                "xanchor": "left",
            }
        ]
    return {"data": data, "layout": layout}


def _hover_units(data: list[dict], x: str, y: str) -> None:
    """Each point's hover names both quantities with their units, not two bare numbers."""
    (x_name, x_unit), (y_name, y_unit) = QUANTITIES[x], QUANTITIES[y]
    for trace in data:
        if "hovertemplate" in trace:
            trace["hovertemplate"] = (
                f"%{{text}}<br>{x_name} %{{x:.4g}} {x_unit}<br>{y_name} %{{y:.4g}} {y_unit}"
                f"<extra>{trace['name']}</extra>"
            )


def _point(name, x, y, colour, predicted, label) -> dict:
    return _series(name, [x], [y], colour, predicted, label)


def _series(name, xs, ys, colour, predicted, label) -> dict:
    return {
        "type": "scatter",
        "mode": "markers" if predicted else "markers+lines",
        "name": name,
        "x": xs,
        "y": ys,
        "marker": _marker(colour, predicted),
        "line": {"color": colour, "width": 1},
        "text": [label] * len(xs),
        "hovertemplate": "%{text}<br>%{x:.4g}, %{y:.4g}<extra>" + name + "</extra>",
    }


def figures(sweep, trials) -> dict:
    """Both charts, or an empty dict before any trial has a number to draw."""
    out = {
        "per_user": per_gpu_vs_per_user(sweep, trials),
        "ttft": throughput_vs_ttft(sweep, trials),
    }
    return {k: v for k, v in out.items() if v["data"]}
