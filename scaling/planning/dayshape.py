"""A day's 24 hourly request rates from a traffic sample (pure).

The sample is read by the project's one traffic-sample reader,
``benchmarks.loadgen.traffic.parse`` (JSONL or CSV, epoch seconds or ISO-8601 times, which it
turns into epoch seconds); this module only places its requests on the clock.

Each request falls in its UTC hour of the day. The sample covers the time from its first
request to its last; a sample from 09:10 to 11:40 covers 50 minutes of hour 9, 60 of hour 10
and 40 of hour 11, and a sample of several days adds up the seconds of each hour of the day.
An hour's rate is the requests that fell in it over the seconds of it the sample covers. An
hour covered for less than ``MIN_COVERAGE_S`` is not measured (a handful of requests in two
minutes says little about an hour): it takes the fallback rate (the form's), and the shape
says which hours came from where.

Times that are not epoch-like (all before 2001, i.e. seconds from some start, as a replay's
rows are) cannot be put on a clock: they are placed from 00:00, and the shape says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from benchmarks.loadgen.traffic import TrafficRow

HOUR = 3600.0
DAY = 24 * HOUR
MIN_COVERAGE_S = 300.0
# 10^9 s is 2001-09-09: a log's epoch times are later, relative times far smaller.
EPOCH_FROM = 1e9
# Past the year 5000 in seconds: almost surely epoch milliseconds, which would read as a
# sample spanning centuries.
EPOCH_UNTIL = 1e11
UTC_CLOCK = "UTC clock"
FROM_MIDNIGHT = "from 00:00"


class DayShapeError(ValueError):
    """A sample that cannot give a day's rates; the message says why."""


@dataclass(frozen=True)
class DayShape:
    """The day's 24 rates (requests/s) and where each came from: ``covered_hours`` from the
    sample (``covered_s`` seconds of each hour of the day it spans), ``fallback_hours`` from
    the fallback. ``placement`` is ``UTC_CLOCK`` or ``FROM_MIDNIGHT``; the mean sizes are the
    sample's own."""

    hourly: list[float]
    covered_hours: list[int]
    fallback_hours: list[int]
    placement: str
    requests: int
    covered_s: list[float]
    mean_input_tokens: float
    mean_output_tokens: float

    def as_dict(self) -> dict:
        return asdict(self)


def _seconds_in_hour(t: float, hour: int) -> float:
    """Seconds of hour-of-day ``hour`` in [0, t): whole days, then the part of t's day."""
    days, into_day = divmod(t, DAY)
    return days * HOUR + min(HOUR, max(0.0, into_day - hour * HOUR))


def coverage(start: float, end: float) -> list[float]:
    """Seconds of each hour of the day (UTC, 0–23) within [start, end]."""
    return [_seconds_in_hour(end, h) - _seconds_in_hour(start, h) for h in range(24)]


def hour_ranges(hours: Sequence[int]) -> str:
    """``[8, 9, 10, 14]`` → ``"08–10, 14"``."""
    spans: list[list[int]] = []
    for hour in sorted(hours):
        if spans and hour == spans[-1][1] + 1:
            spans[-1][1] = hour
        else:
            spans.append([hour, hour])
    return ", ".join(f"{a:02d}" if a == b else f"{a:02d}–{b:02d}" for a, b in spans)


def hourly_from_sample(
    rows: list[TrafficRow],
    fallback: Sequence[float] | None,
    *,
    min_coverage_s: float = MIN_COVERAGE_S,
) -> DayShape:
    """The day's hourly rates from ``rows`` (as ``traffic.parse`` returns them), the hours the
    sample does not measure taken from ``fallback`` (24 rates). Raises ``DayShapeError`` when
    the sample has no times, measures no hour, or leaves hours without a fallback."""
    if not rows:
        raise DayShapeError("the sample has no requests")
    if fallback is not None and len(fallback) != 24:
        raise DayShapeError(f"the fallback day needs 24 hourly rates, got {len(fallback)}")
    times = [r.timestamp for r in rows]
    if any(t is None for t in times):
        raise DayShapeError(
            "the sample has no arrival times: it gives request sizes, not a day's rates"
        )
    first, last = min(times), max(times)
    if first >= EPOCH_UNTIL:
        raise DayShapeError(
            f"the sample's times ({first:.0f}) are past the year 5000 as seconds: "
            "epoch milliseconds? Give seconds or ISO-8601 times"
        )
    if first >= EPOCH_FROM:
        placement, origin = UTC_CLOCK, 0.0
    else:
        placement, origin = FROM_MIDNIGHT, first
    covered = coverage(first - origin, last - origin)
    counts = [0] * 24
    for t in times:
        counts[int((t - origin) % DAY // HOUR)] += 1
    measured = [h for h in range(24) if covered[h] >= min_coverage_s]
    if not measured:
        raise DayShapeError(
            f"the sample spans {last - first:.0f} s: no hour of the day is covered for "
            f"{min_coverage_s / 60:g} minutes or more, so it measures no hour's rate"
        )
    rest = [h for h in range(24) if h not in measured]
    if rest and fallback is None:
        raise DayShapeError(
            f"the sample does not cover hours {hour_ranges(rest)} (UTC) for "
            f"{min_coverage_s / 60:g} minutes or more: give rates for them"
        )
    # Significant digits, not places: a quiet hour's 0.0083 req/s keeps its precision.
    hourly = [
        float(f"{counts[h] / covered[h]:.6g}") if h in measured else float(fallback[h])
        for h in range(24)
    ]
    return DayShape(
        hourly=hourly,
        covered_hours=measured,
        fallback_hours=rest,
        placement=placement,
        requests=len(rows),
        covered_s=[round(c, 3) for c in covered],
        mean_input_tokens=round(sum(r.input_tokens for r in rows) / len(rows), 1),
        mean_output_tokens=round(sum(r.output_tokens for r in rows) / len(rows), 1),
    )


def rows_from_replay(replay: dict) -> list[TrafficRow]:
    """A replay profile's rows (``[t, input, output, prefix]``, ``t`` seconds from the first
    request) as sample rows, at the replay's ``time_scale`` (0.5 = twice as fast)."""
    scale = float(replay.get("time_scale") or 1.0)
    out = []
    for line, row in enumerate(replay.get("rows") or [], start=1):
        prefix = row[3] if len(row) > 3 else None
        out.append(
            TrafficRow(
                timestamp=float(row[0]) * scale,
                input_tokens=int(row[1]),
                output_tokens=int(row[2]),
                prefix_id=None if prefix is None else str(prefix),
                line=line,
            )
        )
    return out
