"""CPU lists (``0-15,32-47``, the kernel's cpulist spelling that numactl, taskset, Docker's
--cpuset-cpus and systemd's CPUAffinity accept): one bounded parser for the panel, the launch
rules and the host agent (pure: no Django).

Bounded before anything is expanded: a range is checked by its ends, so ``0-999999999`` is an
error in microseconds instead of a set of a billion CPUs (16 GB of panel memory in about a
minute, issue 38). The limits are Linux's: CPU numbers below 8192 (the largest NR_CPUS a
kernel can be built with) and a list of at most 8192 CPUs, written in at most 4096
characters."""

from __future__ import annotations

import re

MAX_CPU = 8191
MAX_TEXT = 4096
PART = re.compile(r"(\d{1,6})(?:-(\d{1,6}))?")


class CpuListError(ValueError):
    """Not a CPU list, or one beyond the limits; the message says which part and why."""


def parse(text: str) -> list[int]:
    """``"0-3,8"`` → ``[0, 1, 2, 3, 8]`` (in the order written); raises CpuListError."""
    if not isinstance(text, str):
        raise CpuListError(f"expected a CPU list like 0-15,32-47, got {text!r}")
    if len(text) > MAX_TEXT:
        raise CpuListError(f"a CPU list of {len(text)} characters (at most {MAX_TEXT})")
    spans: list[tuple[int, int]] = []
    for part in text.strip().split(","):
        match = PART.fullmatch(part.strip())
        if not match:
            raise CpuListError(f"expected a CPU list like 0-15,32-47, got {_short(text)!r}")
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if high < low:
            raise CpuListError(f"CPU range {part.strip()!r} runs backwards")
        if high > MAX_CPU:
            raise CpuListError(
                f"CPU {high} in {part.strip()!r} is beyond the largest CPU number Linux "
                f"supports ({MAX_CPU})"
            )
        spans.append((low, high))
    if sum(high - low + 1 for low, high in spans) > MAX_CPU + 1:
        raise CpuListError(f"the list names more than {MAX_CPU + 1} CPUs")
    return [cpu for low, high in spans for cpu in range(low, high + 1)]


def problem(text) -> str | None:
    """Why ``text`` is not a usable CPU list, or None."""
    try:
        parse(text)
    except CpuListError as exc:
        return str(exc)
    return None


def format_list(cpus) -> str:
    """``[0, 1, 2, 3, 8, 9]`` → ``"0-3,8-9"``."""
    ordered = sorted({int(c) for c in cpus})
    parts: list[str] = []
    start = prev = None
    for cpu in [*ordered, None]:
        if cpu is not None and prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(parts)


def _short(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."
