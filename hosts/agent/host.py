"""Readings of the host itself (CPU, memory, NUMA layout) and CPU-list helpers, via psutil and
the kernel's own files; no GPU involved."""

from __future__ import annotations

import os
import socket
from importlib import metadata
from pathlib import Path

import psutil

from hosts.engines import cpulist

SYS_NODES = Path("/sys/devices/system/node")
CPUINFO = Path("/proc/cpuinfo")
# The Python packages whose versions change what an engine measures: the engines, the
# framework, the kernels and the collectives. Distribution names, as pip knows them.
LIBRARIES = (
    "vllm",
    "sglang",
    "torch",
    "transformers",
    "triton",
    "flashinfer-python",
    "nvidia-nccl-cu12",
)


def format_cpu_list(cpus) -> str:
    """``[0, 1, 2, 3, 8, 9]`` → ``"0-3,8-9"`` (the kernel's cpulist spelling, which numactl,
    taskset and our LaunchConfig placement accept)."""
    return cpulist.format_list(cpus)


def parse_cpu_list(text: str) -> list[int]:
    """``"0-3,8"`` → ``[0, 1, 2, 3, 8]``; raises ValueError on anything else, or on a list
    beyond the limits the panel checks too (hosts.engines.cpulist)."""
    if not text.strip():
        return []
    return cpulist.parse(text)


def cpu_model() -> str | None:
    try:
        for line in CPUINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return None


def numa_nodes() -> list[dict]:
    """``[{"node": 0, "cpus": "0-15"}, …]`` from sysfs; empty where the kernel shows none."""
    nodes = []
    for path in SYS_NODES.glob("node[0-9]*"):
        try:
            cpus = (path / "cpulist").read_text().strip()
        except OSError:
            continue
        nodes.append({"node": int(path.name[4:]), "cpus": cpus})
    return sorted(nodes, key=lambda n: n["node"])


def host_readings() -> dict:
    memory = psutil.virtual_memory()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        # Non-blocking: the share since the previous call (the agent primes it at start).
        "cpu_percent": psutil.cpu_percent(interval=None),
        "load_avg": load,
        "memory_total_bytes": memory.total,
        # "used" the way an operator means it: what is not available to new allocations.
        "memory_used_bytes": memory.total - memory.available,
    }


def host_identity() -> dict:
    return {
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "numa_nodes": numa_nodes(),
    }


def process_affinity(pid: int | None) -> list[int] | None:
    if pid is None:
        return None
    try:
        return sorted(psutil.Process(pid).cpu_affinity())
    except (psutil.Error, AttributeError, OSError):
        # AttributeError: platforms without cpu_affinity (macOS).
        return None


def library_versions(names=LIBRARIES) -> dict[str, str]:
    """``{name: version}`` of the packages installed for this interpreter (absent ones left
    out). Only this interpreter's environment is seen: an engine run from another
    virtualenv reports its own versions (vLLM's /version) but not these. A few ms: the
    installed packages' metadata is read afresh each call, so an upgrade shows at once."""
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found
