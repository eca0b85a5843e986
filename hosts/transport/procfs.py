"""Parsers of the Linux ``/proc`` and ``/sys`` files the SSH transport reads for host readings
(load, memory, CPU busy share, NUMA layout). (Pure: no I/O.)"""

from __future__ import annotations


def parse_loadavg(text: str) -> list[float] | None:
    parts = text.split()
    try:
        return [float(p) for p in parts[:3]] if len(parts) >= 3 else None
    except ValueError:
        return None


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` → bytes per key (the file says ``kB`` and means KiB)."""
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return values


def memory_used_bytes(meminfo: dict[str, int]) -> int | None:
    """Used = total − available, the number ``free`` and the agent (psutil) report."""
    if "MemTotal" not in meminfo or "MemAvailable" not in meminfo:
        return None
    return meminfo["MemTotal"] - meminfo["MemAvailable"]


def cpu_times(stat_line: str) -> tuple[int, int] | None:
    """The aggregate ``cpu`` line of ``/proc/stat`` → (busy, total) jiffies."""
    parts = stat_line.split()
    if not parts or parts[0] != "cpu":
        return None
    try:
        # user nice system idle iowait irq softirq steal (guest time is already in user)
        values = [int(v) for v in parts[1:9]]
    except ValueError:
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values)
    return total - idle, total


def cpu_percent(first: str, second: str) -> float | None:
    a, b = cpu_times(first), cpu_times(second)
    if a is None or b is None or b[1] <= a[1]:
        return None
    return round(100.0 * (b[0] - a[0]) / (b[1] - a[1]), 1)


def parse_cpulist(text: str) -> list[int]:
    """``0-3,8,10-11`` (the kernel's cpulist format) → ``[0, 1, 2, 3, 8, 10, 11]``."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def parse_numa_node(text: str) -> int | None:
    """sysfs ``numa_node``: ``-1`` means the platform does not say (single node, VMs)."""
    try:
        node = int(text.strip())
    except ValueError:
        return None
    return node if node >= 0 else None


def cpu_model(cpuinfo: str) -> str | None:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model name"):
            return value.strip() or None
    return None


def parse_proc_stat(text: str) -> tuple[str, int, int] | None:
    """``/proc/<pid>/stat`` → (state letter, process group, start time in clock ticks).

    The command name (field 2) sits in parentheses and may itself contain spaces and ``)``,
    so fields are counted from the last ``)``."""
    rparen = text.rfind(")")
    if rparen < 0:
        return None
    fields = text[rparen + 1 :].split()
    try:
        return fields[0], int(fields[2]), int(fields[19])
    except (IndexError, ValueError):
        return None
