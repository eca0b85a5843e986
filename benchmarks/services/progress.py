"""How far a running benchmark is and how long it has left, from the profile's plan and the
rate at which requests are observed to finish.

The load generator's clock starts before the warm-up, which the plan leaves out, so the
measured part is counted from the first point past the warm-up. An open-loop (rate) stage
ends on its schedule, however slowly the first requests come back; a closed-loop stage
bounded by a count ends when the engine has answered that many, at the rate it answers them
now (over the last RATE_WINDOW_S), not at the run-long average that the first seconds, before
any request could finish, drag down. No Django here: a plain object the point sink feeds.
"""

from __future__ import annotations

from collections import deque

# The completion rate is read over this many recent seconds.
RATE_WINDOW_S = 10.0
# Too short a look at the rate says nothing: no count-based ETA before this many seconds.
MIN_RATE_SPAN_S = 5.0
WARMUP_STAGE = "warmup"


def estimate(
    planned_requests: int | None,
    planned_seconds: float | None,
    elapsed: float,
    done: int,
    in_flight: int = 0,
    rate: float | None = None,
) -> tuple[float, float | None]:
    """(fraction done, seconds left or None) ``elapsed`` seconds into the measured part,
    ``done`` requests finished (failures count), ``in_flight`` still open, finishing at
    ``rate`` a second (None: not yet observed). Whichever bound of the plan comes first ends
    the run: the schedule's time (plus the requests in flight draining, about one latency:
    in flight ÷ rate, Little's law) or the remaining count at the observed rate."""
    fractions = []
    if planned_requests:
        fractions.append(done / planned_requests)
    if planned_seconds:
        fractions.append(elapsed / planned_seconds)
    if not fractions:
        return 0.0, None
    fraction = round(min(max(fractions), 1.0), 4)
    known_rate = rate if rate is not None and rate > 0 else None
    etas = []
    if planned_seconds:
        drain = in_flight / known_rate if known_rate and in_flight else 0.0
        etas.append(max(planned_seconds - elapsed, 0.0) + drain)
    if planned_requests:
        left = max(planned_requests - done, 0)
        if not left:
            etas.append(0.0)
        elif known_rate:
            etas.append(left / known_rate)
    if not etas:
        return fraction, None
    return fraction, round(min(etas), 1)


class Progress:
    """Follows a run's points (``t`` on the load generator's clock, ``stage``, ``completed``,
    ``failed``, ``in_flight``) and says for each how far the run is and how long it has left."""

    def __init__(self, planned_requests: int | None, planned_seconds: float | None):
        self.planned_requests = planned_requests
        self.planned_seconds = planned_seconds
        self.measure_start: float | None = None  # t where the warm-up ended
        self.warmup_until = 0.0  # t of the last warm-up point seen
        self.history: deque[tuple[float, int]] = deque()  # (elapsed, done) of recent points

    def update(self, point: dict) -> tuple[float, float | None]:
        t = float(point["t"])
        done = int(point.get("completed") or 0) + int(point.get("failed") or 0)
        if self.measure_start is None:
            if point.get("stage") == WARMUP_STAGE:
                # The plan starts after the warm-up, whose length nobody planned.
                self.warmup_until = t
                return 0.0, None
            # The warm-up ended between its last point and this one.
            self.measure_start = self.warmup_until
        elapsed = max(t - self.measure_start, 0.0)
        self.history.append((elapsed, done))
        return estimate(
            self.planned_requests,
            self.planned_seconds,
            elapsed,
            done,
            int(point.get("in_flight") or 0),
            self.rate(),
        )

    def rate(self) -> float | None:
        """Requests finished per second over the last RATE_WINDOW_S (since the warm-up when
        the run is younger), or None while less than MIN_RATE_SPAN_S has been seen."""
        now, done = self.history[-1]
        while len(self.history) > 2 and self.history[1][0] <= now - RATE_WINDOW_S:
            self.history.popleft()
        then, before = self.history[0]
        if now - then < MIN_RATE_SPAN_S:
            # Nothing older to compare with: the average since the warm-up, if long enough.
            if now < MIN_RATE_SPAN_S:
                return None
            then, before = 0.0, 0
        return (done - before) / (now - then)
