"""Numbers in words for the advisor's findings, so every rule writes them the same way
("1.2 s", "31 %", "8,192 tokens", "over the last 60 s (live)"). Pure: no Django."""

from __future__ import annotations

import math

from changes.advisor.facts import EngineWindow


def pct(share: float) -> str:
    """A 0-1 share as a percentage with at most one decimal: 0.275 → "27.5 %", 0.45 → "45 %",
    0.0042 → "0.4 %"."""
    return f"{share * 100:.1f}".rstrip("0").rstrip(".") + " %"


def ms(value: float) -> str:
    """Milliseconds as a reader takes them in: 85 → "85 ms", 1234 → "1.2 s"."""
    if value >= 1000:
        return f"{value / 1000:.1f} s"
    if value >= 10:
        return f"{value:.0f} ms"
    return f"{value:.1f} ms"


def seconds(value: float) -> str:
    """A window's length: 60 → "60 s", 900 → "15 min", 7200 → "2 h"."""
    if value >= 7200:
        return f"{value / 3600:.0f} h"
    if value >= 120:
        return f"{value / 60:.0f} min"
    return f"{value:.0f} s"


def tokens(value: float) -> str:
    return f"{round(value):,} tokens"


def num(value: float) -> str:
    """A count or mean: whole numbers without decimals, others with one."""
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.1f}"


def gib(value: float) -> str:
    return f"{value / 2**30:.0f} GiB"


def window(w: EngineWindow) -> str:
    """The time a window of engine metrics covers, with where it came from."""
    if w.source == "live":
        return f"over the last {seconds(w.seconds)} (live)"
    return f"in {w.source} ({seconds(w.seconds)} of server metrics)"


def telemetry(window_s: float | None) -> str:
    """The window the GPU and host facts cover."""
    if window_s:
        return f"over the last {seconds(window_s)} of telemetry"
    return "in the latest telemetry"


def stage(run_id: int, name: str) -> str:
    return f"in run {run_id}, stage {name}"


def pow2_up(value: float) -> int:
    """The smallest power of two ≥ value (at least 1): engines batch in such sizes and a
    reviewer reads 64 faster than 57."""
    if value <= 1:
        return 1
    return 1 << math.ceil(math.log2(value))


def pow2_down(value: float) -> int:
    """The largest power of two ≤ value (at least 1)."""
    if value < 2:
        return 1
    return 1 << math.floor(math.log2(value))
