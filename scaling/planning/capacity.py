"""How much load one replica carries within the SLO, read off measured load levels (pure).

The caller hands in the points of ONE config and ONE load profile (stages of benchmark runs,
sweep trials' measured limits); this module never mixes profiles, it cannot see them.

Open-loop ("rate") and closed-loop ("concurrency") points are ordered by the throughput they
achieved, the one unit both have: a closed loop's clients are not requests/s, and an open loop
that overloads the engine achieves less than it offers. When every point has the same mode,
the offered load orders them instead (an overloaded open-loop stage offers more than it
achieves, and it is "above" the best one even when it achieved less), and achieved req/s still
names the capacity. Points without an achieved rate or a p95 TTFT cannot be judged and are
left out (the explanation says how many).
"""

from __future__ import annotations

from scaling.planning.types import SLO, Capacity, LoadPoint


def meets(point: LoadPoint, slo: SLO) -> bool:
    """Whether ``point`` was served within ``slo`` (ITL only when the SLO sets one and the
    point measured it)."""
    if point.ttft_p95_ms is None or point.ttft_p95_ms > slo.ttft_p95_ms:
        return False
    if slo.itl_p95_ms is not None and point.itl_p95_ms is not None:
        if point.itl_p95_ms > slo.itl_p95_ms:
            return False
    return (point.error_rate or 0.0) <= slo.max_error_rate


def capacity_at_slo(points: list[LoadPoint], slo: SLO) -> Capacity:
    """The highest achieved req/s among ``points`` meeting ``slo``, the lightest heavier
    point that broke it, and the engine's queue, KV use and pending prompt tokens where p95
    TTFT crossed the SLO (linear in p95 TTFT between the two)."""
    usable = [p for p in points if p.achieved_rps is not None and p.ttft_p95_ms is not None]
    skipped = len(points) - len(usable)
    if not usable:
        text = "No finished benchmark of this config and profile to measure a replica by."
        if skipped:
            text += f" ({skipped} load level(s) had no throughput or p95 TTFT to judge.)"
        return Capacity(status="no_evidence", slo=slo, explanation=text)
    same_mode = len({p.mode for p in usable}) == 1

    def load(p: LoadPoint) -> float:
        if same_mode and p.offered:
            return float(p.offered)
        return float(p.achieved_rps)

    usable.sort(key=lambda p: (load(p), p.achieved_rps))
    good = [p for p in usable if meets(p, slo)]
    notes = []
    if not same_mode:
        notes.append("open- and closed-loop levels compared by achieved req/s")
    if skipped:
        notes.append(f"{skipped} level(s) without throughput or p95 TTFT left out")
    note = f" ({'; '.join(notes)})" if notes else ""

    if not good:
        lightest = usable[0]
        return Capacity(
            status="none_meets",
            slo=slo,
            breach=lightest,
            explanation=(
                f"Even the lightest load broke the SLO: {_name(lightest)} {_offered(lightest)}: "
                f"{_broke(lightest, slo)}.{note}"
            ),
        )
    best = max(good, key=lambda p: (p.achieved_rps, load(p)))
    heavier = [p for p in usable if load(p) > load(best) and not meets(p, slo)]
    concurrency = best.offered if best.mode == "concurrency" else best.running_mean
    head = (
        f"{_name(best)} {_offered(best)}: {best.achieved_rps:.1f} req/s at p95 TTFT "
        f"{best.ttft_p95_ms:.0f} ms ≤ {slo.ttft_p95_ms:.0f} ms"
    )
    if not heavier:
        # Nothing tested broke the SLO: the heaviest level's own queue is a safe (low) bound.
        return Capacity(
            status="above_tested",
            slo=slo,
            rps=best.achieved_rps,
            concurrency=concurrency,
            best=best,
            queue_at_breach=_waiting(best),
            kv_at_breach=best.kv_usage_max,
            pending_tokens_at_breach=_pending(best),
            explanation=(
                f"{head}; no tested load broke the SLO, so a replica carries at least this "
                f"(queue and KV at this level used as the limit).{note}"
            ),
        )
    breach = heavier[0]
    share = _share(best.ttft_p95_ms, breach.ttft_p95_ms, slo.ttft_p95_ms)
    queue = _between(_waiting(best), _waiting(breach), share)
    crossing = (
        f"; about {queue:.1f} waiting where p95 TTFT crossed the SLO (interpolated)"
        if queue is not None
        else ""
    )
    return Capacity(
        status="measured",
        slo=slo,
        rps=best.achieved_rps,
        concurrency=concurrency,
        best=best,
        breach=breach,
        queue_at_breach=queue,
        kv_at_breach=_between(best.kv_usage_max, breach.kv_usage_max, share),
        pending_tokens_at_breach=_between(_pending(best), _pending(breach), share),
        explanation=(
            f"{head}; {_name(breach, after=best)} {_offered(breach)} broke it: "
            f"{_broke(breach, slo)}" + crossing + f".{note}"
        ),
    )


def _share(good_ms: float, bad_ms: float, slo_ms: float) -> float:
    """Where the SLO lies between the two points' p95 TTFT, 0 (good) to 1 (breach)."""
    if bad_ms <= good_ms:
        return 1.0
    return min(1.0, max(0.0, (slo_ms - good_ms) / (bad_ms - good_ms)))


def _between(good: float | None, bad: float | None, share: float) -> float | None:
    if good is None or bad is None:
        return None
    return good + (bad - good) * share


def _waiting(p: LoadPoint) -> float | None:
    return p.waiting_mean if p.waiting_mean is not None else p.waiting_max


def _pending(p: LoadPoint) -> float | None:
    waiting = _waiting(p)
    if waiting is None or p.mean_prompt_tokens is None:
        return None
    return waiting * p.mean_prompt_tokens


def _name(p: LoadPoint, after: LoadPoint | None = None) -> str:
    if p.source == "sweep":
        return p.run_name or f"sweep #{p.sweep_id}"
    stage = f"stage '{p.stage}'" if p.stage else ""
    if after is not None and after.source == "run" and after.run_id == p.run_id and stage:
        return stage
    run = p.run_name or f"run #{p.run_id}"
    return f"{run} {stage}".strip()


def _offered(p: LoadPoint) -> str:
    if p.mode == "concurrency":
        return f"({p.offered:g} clients)"
    return f"({p.offered:.3g} req/s offered)"


def _broke(p: LoadPoint, slo: SLO) -> str:
    parts = []
    if p.ttft_p95_ms is not None and p.ttft_p95_ms > slo.ttft_p95_ms:
        parts.append(f"p95 TTFT {p.ttft_p95_ms:.0f} ms")
    if slo.itl_p95_ms is not None and p.itl_p95_ms is not None and p.itl_p95_ms > slo.itl_p95_ms:
        parts.append(f"p95 ITL {p.itl_p95_ms:.0f} ms > {slo.itl_p95_ms:.0f} ms")
    if (p.error_rate or 0.0) > slo.max_error_rate:
        parts.append(f"{p.error_rate:.1%} errors")
    text = ", ".join(parts) or "out of the SLO"
    waiting = _waiting(p)
    if waiting is not None:
        text += f" with {waiting:.0f} waiting"
    return text
