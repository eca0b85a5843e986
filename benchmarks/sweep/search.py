"""The highest load that still meets an SLO, found with as few measurements as possible.

``measure(load)`` returns the numbers ``Slo.check`` reads; it may be the simulator (cheap:
``bisect_max_load`` brackets the whole range and halves it) or a real benchmark (minutes
each: ``step_search`` starts at the predicted answer and walks from there). Both assume that
more load never makes latency better, which holds for inference engines up to noise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from benchmarks.sweep.slo import Slo

Measure = Callable[[float], Mapping]


@dataclass
class Probe:
    """One measurement at one load, judged against the SLO."""

    load: float
    numbers: dict
    ok: bool
    violations: list[str] = field(default_factory=list)
    margin: float | None = None

    def to_dict(self) -> dict:
        return {
            "load": self.load,
            "numbers": self.numbers,
            "ok": self.ok,
            "violations": list(self.violations),
            "margin": self.margin,
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> Probe:
        return cls(
            load=data["load"],
            numbers=dict(data.get("numbers") or {}),
            ok=bool(data["ok"]),
            violations=list(data.get("violations") or []),
            margin=data.get("margin"),
        )


@dataclass
class SearchResult:
    """``best``: the highest load that met the SLO; ``closest``: when none did, the probe
    with the largest margin; ``probes`` in the order measured; ``note``: how it ended."""

    best: Probe | None
    probes: list[Probe]
    closest: Probe | None
    note: str


def _fmt(load: float) -> str:
    return f"{load:.3g}" if isinstance(load, float) else str(load)


class _Prober:
    """Measures, judges and remembers; never measures one load twice."""

    def __init__(self, measure: Measure, slo: Slo, integer: bool):
        self.measure, self.slo, self.integer = measure, slo, integer
        self.probes: list[Probe] = []
        self.seen: dict[float, Probe] = {}

    def norm(self, load: float) -> float:
        return max(1, round(load)) if self.integer else float(load)

    def __call__(self, load: float) -> Probe:
        load = self.norm(load)
        if load in self.seen:
            return self.seen[load]
        numbers = dict(self.measure(load))
        check = self.slo.check(numbers)
        probe = Probe(load, numbers, check.ok, list(check.violations), check.margin)
        self.probes.append(probe)
        self.seen[load] = probe
        return probe

    def result(self, best: Probe | None, note: str) -> SearchResult:
        closest = None
        if best is None and self.probes:
            closest = max(
                self.probes,
                key=lambda p: (p.margin if p.margin is not None else float("-inf"), -p.load),
            )
        return SearchResult(best, list(self.probes), closest, note)


def _converged(low: float, high: float, rel_tol: float, integer: bool) -> bool:
    if integer:
        return high - low <= 1 or (high - low) / high <= rel_tol
    return (high - low) / high <= rel_tol


def _mid(low: float, high: float, integer: bool) -> float:
    return (low + high) // 2 if integer else (low + high) / 2


def _bisect(probe: _Prober, best: Probe, fail: Probe, rel_tol: float, steps_left: int) -> Probe:
    """Narrow ``[best, fail]`` (met, missed) while measurements remain; the best that met."""
    low, high = best.load, fail.load
    while steps_left > 0 and not _converged(low, high, rel_tol, probe.integer):
        mid = probe(_mid(low, high, probe.integer))
        steps_left -= 1
        if mid.ok:
            best, low = mid, mid.load
        else:
            high = mid.load
    return best


def bisect_max_load(
    measure: Measure,
    slo: Slo,
    *,
    low: float,
    high: float,
    integer: bool = False,
    rel_tol: float = 0.03,
    max_steps: int = 12,
) -> SearchResult:
    """Measure ``high`` (met: the limit is at or above it), then the middle of the range, and
    ``low`` only when the middle missed too (missed at ``low``: nothing in the range meets);
    then halve the bracket until it is within ``rel_tol`` of its top or ``max_steps``
    measurements were made in all. The light loads are the slow ones to simulate (one
    sequence at a time, step after step), so ``low`` is measured only when needed."""
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high, got low={low!r}, high={high!r}")
    probe = _Prober(measure, slo, integer)
    top = probe(high)
    if top.ok:
        return probe.result(
            top, f"met the SLO at the highest load tried ({_fmt(top.load)}); the limit is above it"
        )
    fail = top
    if max_steps >= 3 and not _converged(probe.norm(low), top.load, rel_tol, integer):
        mid = probe(_mid(probe.norm(low), top.load, integer))
        if mid.ok:
            best = _bisect(probe, mid, top, rel_tol, max_steps - len(probe.probes))
            return probe.result(best, _bracket_note(probe, best, rel_tol))
        fail = mid
    if max_steps < len(probe.probes) + 1:
        return probe.result(
            None, f"stopped after {len(probe.probes)} measurement(s): {_fmt(fail.load)} missed"
        )
    bottom = probe(low)
    if not bottom.ok:
        return probe.result(
            None, f"no load from {_fmt(bottom.load)} to {_fmt(top.load)} meets the SLO"
        )
    best = _bisect(probe, bottom, fail, rel_tol, max_steps - len(probe.probes))
    return probe.result(best, _bracket_note(probe, best, rel_tol))


def _bracket_note(probe: _Prober, best: Probe, rel_tol: float) -> str:
    above = [p.load for p in probe.probes if not p.ok and p.load > best.load]
    if not above:
        return f"highest load meeting the SLO: {_fmt(best.load)}"
    nearest = min(above)
    how = (
        "within tolerance"
        if _converged(best.load, nearest, rel_tol, probe.integer)
        else f"stopped after {len(probe.probes)} measurements"
    )
    return f"highest load meeting the SLO: {_fmt(best.load)} ({_fmt(nearest)} missed; {how})"


def step_search(
    measure: Measure,
    slo: Slo,
    *,
    start: float,
    integer: bool = False,
    factor: float = 1.25,
    rel_tol: float = 0.05,
    max_steps: int = 6,
    min_load: float,
    max_load: float,
) -> SearchResult:
    """For expensive measurements: start at ``start`` (the predicted limit), step up by
    ``factor`` while the SLO holds or down while it does not, then halve the bracket found.

    Never more than ``max_steps`` measurements; loads stay within ``[min_load, max_load]``.
    Exceptions from ``measure`` propagate (a cancelled run stops the search).
    """
    if not 0 < min_load <= max_load:
        raise ValueError(f"need 0 < min_load <= max_load, got {min_load!r}, {max_load!r}")
    if factor <= 1:
        raise ValueError(f"factor must be above 1, got {factor!r}")
    if max_steps < 1:
        raise ValueError("max_steps must be at least 1")
    probe = _Prober(measure, slo, integer)
    lo_bound, hi_bound = probe.norm(min_load), probe.norm(max_load)

    def clamp(load: float) -> float:
        return min(hi_bound, max(lo_bound, probe.norm(load)))

    current = probe(clamp(start))
    best: Probe | None = current if current.ok else None
    fail: Probe | None = None if current.ok else current
    while len(probe.probes) < max_steps:
        if current.ok:
            if current.load >= hi_bound:
                return probe.result(
                    current,
                    f"met the SLO at the highest load allowed ({_fmt(current.load)}); "
                    "the limit is above it",
                )
            nxt = clamp(current.load * factor)
            if integer and nxt <= current.load:
                nxt = clamp(current.load + 1)
        else:
            if current.load <= lo_bound:
                return probe.result(
                    None, f"no load down to the lowest allowed ({_fmt(current.load)}) meets the SLO"
                )
            nxt = clamp(current.load / factor)
            if integer and nxt >= current.load:
                nxt = clamp(current.load - 1)
        current = probe(nxt)
        if current.ok:
            best = current if best is None or current.load > best.load else best
        else:
            fail = current if fail is None or current.load < fail.load else fail
        if best is not None and fail is not None:
            break
    if best is None:
        return probe.result(
            None,
            f"stopped after {len(probe.probes)} measurements: no load down to "
            f"{_fmt(min(p.load for p in probe.probes))} met the SLO",
        )
    if fail is None:
        return probe.result(
            best,
            f"stopped after {len(probe.probes)} measurements: met the SLO up to "
            f"{_fmt(best.load)} without finding its limit",
        )
    best = _bisect(probe, best, fail, rel_tol, max_steps - len(probe.probes))
    return probe.result(best, _bracket_note(probe, best, rel_tol))
