"""When requests start: open-loop schedules on absolute offsets (no drift)."""

from __future__ import annotations

import math
import random


def open_loop_offsets(n: int, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """``n`` arrival offsets (seconds from the stage start) for a mean ``rate``.

    Gaps are gamma-distributed with shape ``burstiness`` (1 = Poisson) and rescaled so the n
    requests span exactly n / rate seconds: the achieved rate is the asked rate, not a random
    walk around it (vLLM #21104). Offsets are absolute, so a late wake-up never shifts the rest.
    """
    if math.isinf(rate):
        return [0.0] * n
    gaps = [rng.gammavariate(burstiness, 1.0 / (burstiness * rate)) for _ in range(n)]
    scale = (n / rate) / sum(gaps)
    offsets, t = [], 0.0
    for gap in gaps:
        offsets.append(t)
        t += gap * scale
    return offsets


def open_loop_stream(rate: float, burstiness: float, rng: random.Random):
    """Endless offsets for duration-bound stages (no rescaling possible: the mean is the rate)."""
    t = 0.0
    while True:
        yield t
        t += 0.0 if math.isinf(rate) else rng.gammavariate(burstiness, 1.0 / (burstiness * rate))
