"""Snapshots of one engine over time → its live signals (pure).

Gauges are the newest snapshot's. Rates are counter increases over the last minute;
percentiles come from histogram bucket increases over 1 and 5 minutes, as
``histogram_quantile(q, rate(x_bucket[w]))`` would compute them. A counter that went down
means the engine restarted and began again from zero: from there on its value is all
increase (Prometheus's ``increase()`` reads resets the same way), so no rate is negative.
"""

from __future__ import annotations

from scaling.planning.expo import quantile
from scaling.planning.types import WINDOWS, Signals, Window

RATE_WINDOW_S = 60.0
PENDING_WINDOW_S = 300.0
Snapshots = list[tuple[float, dict]]


def _in_window(snapshots: Snapshots, seconds: float) -> Snapshots:
    """The snapshots of the last ``seconds`` up to the newest (all there are when fewer)."""
    newest = snapshots[-1][0]
    return [(t, s) for t, s in snapshots if t >= newest - seconds]


def counter_increase(window: Snapshots, key: str) -> float | None:
    """How much the counter ``key`` grew over the window, across engine restarts; None
    when the newest snapshot lacks it."""
    values = [s.get("counters", {}).get(key) for _, s in window]
    if values[-1] is None:
        return None
    increase, previous = 0.0, None
    for value in values:
        if value is None:
            continue
        if previous is not None:
            increase += value - previous if value >= previous else value
        previous = value
    return increase


def _grown(acc: dict, since: dict, until: dict) -> dict:
    """``acc`` plus what a histogram gained from ``since`` to ``until`` (same bounds)."""
    return {
        "counts": [
            a + u - s
            for a, u, s in zip(acc["counts"], until["counts"], since["counts"], strict=True)
        ],
        "count": acc["count"] + until["count"] - since["count"],
        "sum": acc["sum"] + until["sum"] - since["sum"],
    }


def _zero(le: list[float]) -> dict:
    return {"le": le, "counts": [0.0] * len(le), "count": 0.0, "sum": 0.0}


def histogram_increase(window: Snapshots, key: str) -> dict | None:
    """``{"le", "counts", "count", "sum"}`` observed over the window, across restarts (a
    total that went down, or bounds that changed, begin again from zero)."""
    hists = [h for _, s in window if (h := s.get("histograms", {}).get(key)) is not None]
    if not hists or window[-1][1].get("histograms", {}).get(key) is None:
        return None
    newest = hists[-1]
    acc = _zero(newest["le"])
    start = previous = hists[0]
    for hist in hists[1:]:
        if hist["le"] != previous["le"] or hist["count"] < previous["count"]:
            if previous["le"] == newest["le"]:  # the part before the restart, if comparable
                acc = _grown(acc, start, previous)
            start = _zero(hist["le"])
        previous = hist
    return {"le": newest["le"], **_grown(acc, start, newest)}


def _window(snapshots: Snapshots, key: str, seconds: float) -> Window:
    window = _in_window(snapshots, seconds)
    span = window[-1][0] - window[0][0]
    delta = histogram_increase(window, key) if len(window) > 1 else None
    if delta is None:
        return Window(seconds=span)
    args = (delta["le"], delta["counts"], delta["count"])
    return Window(
        seconds=span,
        requests=delta["count"],
        p50=quantile(0.5, *args),
        p95=quantile(0.95, *args),
    )


def _per_s(increase: float | None, span: float) -> float | None:
    return None if increase is None or span <= 0 else increase / span


def _pending(newest: dict, window: Snapshots) -> tuple[float | None, str]:
    """Waiting requests × the mean prompt length of the requests finished in the window,
    and how that was obtained."""
    waiting = newest.get("gauges", {}).get("waiting")
    if waiting is None:
        return None, "the engine exports no waiting-requests gauge"
    if waiting == 0:
        return 0.0, "no request is waiting"
    span = window[-1][0] - window[0][0]
    minutes = f"{PENDING_WINDOW_S / 60:g} min"
    covered = f"{span:.0f} s covered" if span < PENDING_WINDOW_S - 1 else ""
    # The prompt-length histogram is observed when a request finishes, so its sum over its
    # count is exactly the finished requests' mean; vLLM's prompt_tokens counter grows when
    # a request's first token comes, so over requests_finished it only approximates it.
    hist = histogram_increase(window, "prompt_len") if len(window) > 1 else None
    if hist is not None and hist["count"] > 0:
        mean, finished = hist["sum"] / hist["count"], hist["count"]
        source = "the prompt-length histogram"
    else:
        prompt = counter_increase(window, "prompt_tokens") if len(window) > 1 else None
        finished = counter_increase(window, "requests_finished") if len(window) > 1 else None
        if not prompt or not finished:
            why = f"no request finished in the last {minutes}"
            why += f" ({covered})" if covered else ""
            return None, f"{why}: no prompt length to estimate the pending tokens with"
        mean = prompt / finished
        source = "prompt tokens / requests finished counters"
    basis = (
        f"estimated: {waiting:g} waiting × {mean:,.0f} tokens, the mean prompt length of the "
        f"{finished:g} requests finished in the last {minutes} ({source}"
        + (f"; {covered})" if covered else ")")
    )
    return waiting * mean, basis


def compute(snapshots: Snapshots) -> Signals:
    """The signals of one engine from its snapshots, oldest to newest, each ``(epoch
    seconds, expo.parse_snapshot(...))``. An empty list gives empty signals."""
    if not snapshots:
        return Signals(pending_basis="no /metrics snapshot yet")
    at, newest = snapshots[-1]
    gauges = newest.get("gauges", {})
    minute = _in_window(snapshots, RATE_WINDOW_S)
    span = minute[-1][0] - minute[0][0]

    def rate(key: str) -> float | None:
        return _per_s(counter_increase(minute, key), span) if len(minute) > 1 else None

    finished = rate("requests_finished")
    arrival = None
    if finished is not None and span > 0:
        before, after = minute[0][1].get("gauges", {}), gauges
        in_engine = [(g.get("waiting"), g.get("running")) for g in (before, after)]
        if all(v is not None for pair in in_engine for v in pair):
            growth = sum(in_engine[1]) - sum(in_engine[0])
            # A queue that drains faster than the counters say (aborted requests leave
            # without finishing) cannot make demand negative.
            arrival = max(finished + growth / span, 0.0)
    pending, basis = _pending(newest, _in_window(snapshots, PENDING_WINDOW_S))
    return Signals(
        at=at,
        engine=newest.get("engine") or "",
        requests_waiting=gauges.get("waiting"),
        requests_running=gauges.get("running"),
        pending_prompt_tokens=pending,
        pending_basis=basis,
        kv_cache_usage_ratio=gauges.get("kv_cache_usage"),
        preemptions_per_s=rate("preemptions"),
        input_tokens_per_s=rate("prompt_tokens"),
        output_tokens_per_s=rate("generation_tokens"),
        finished_rps=finished,
        arrival_rps=arrival,
        ttft={name: _window(snapshots, "ttft", s) for name, s in WINDOWS.items()},
        itl={name: _window(snapshots, "itl", s) for name, s in WINDOWS.items()},
    )
