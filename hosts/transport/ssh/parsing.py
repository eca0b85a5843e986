"""Reading what the SSH transport's scripts print: sections, engine directories, telemetry and
inventory (pure functions over text; nothing here talks to a host)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hosts.engines.launch import LaunchConfig
from hosts.transport import nvidia_smi, procfs
from hosts.transport.jsontext import decode


def sections(text: str, marker: str) -> list[tuple[str, str]]:
    """Output printed as ``<marker> name`` lines each followed by its body → [(name, body)].
    The marker is random per call, so no file content can forge a section."""
    found: list[tuple[str, list[str]]] = []
    for line in text.split("\n"):
        if line.startswith(marker + " "):
            found.append((line[len(marker) + 1 :].strip(), []))
        elif found:
            found[-1][1].append(line)
    return [(name, "\n".join(body).strip("\n")) for name, body in found]


def libraries(text: str) -> dict[str, str]:
    """LIBRARIES_PY's output; {} when the host's python is missing or printed anything else."""
    try:
        found = decode(text.strip() or "{}")
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(k): str(v) for k, v in found.items()}


def json_or(text: str, default):
    """The JSON object in ``text``, else ``default`` (empty, unreadable, or not an object)."""
    try:
        value = decode(text) if text.strip() else default
    except ValueError:
        return default
    return value if isinstance(value, dict) else default


def int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def lines(text: str) -> list[str]:
    """The non-blank lines of ``text``."""
    return [line for line in text.splitlines() if line.strip()]


def probe_host(listen: str) -> str:
    """Where, on the host itself, an engine listening on ``listen`` answers."""
    if listen in ("", "0.0.0.0", "localhost"):  # noqa: S104 - not binding, reading a config
        return "127.0.0.1"
    if listen == "::":
        return "::1"
    return listen


# --------------------------------------------------------------------------- engine directories


@dataclass
class EngineFiles:
    """What ``<remote_dir>/<name>/`` holds, plus the process its pid file names."""

    name: str
    pid: int | None = None
    stat: tuple[str, int, int] | None = None  # (state, pgrp, starttime) of that pid
    cpus: str | None = None
    state: dict = field(default_factory=dict)
    config: dict | None = None

    def process_alive(self) -> bool:
        """The pid file's process still runs and is the one we started (a reused pid is not)."""
        if self.pid is None or self.stat is None or self.stat[0] in ("Z", "X"):
            return False
        expected = self.state.get("starttime")
        return expected is None or expected == self.stat[2]

    def launch(self) -> LaunchConfig | None:
        return LaunchConfig.from_dict(self.config) if self.config else None


def engine_files(found: list[tuple[str, str]]) -> dict[str, EngineFiles]:
    """The ENGINE_FILES script's sections → one EngineFiles per engine directory."""
    engines: dict[str, EngineFiles] = {}
    current: EngineFiles | None = None
    for name, body in found:
        if name == "engine":
            current = engines.setdefault(body.strip(), EngineFiles(body.strip()))
        elif current is None:
            continue
        elif name == "pid":
            current.pid = int(body) if body.strip().isdigit() else None
        elif name == "stat":
            current.stat = procfs.parse_proc_stat(body)
        elif name == "cpus":
            current.cpus = body.strip() or None
        elif name == "state":
            current.state = json_or(body, {})
        elif name == "config":
            current.config = json_or(body, None)
    return engines


# --------------------------------------------------------------------------- telemetry


@dataclass
class GpuRows:
    """What ``nvidia-smi`` said in one TELEMETRY_SCRIPT run: ``source`` is "nvidia-smi" when
    ``rows`` (and ``apps``, processes by GPU uuid) were read, else "none" and ``note`` says why."""

    source: str
    rows: list[dict] = field(default_factory=list)
    apps: dict = field(default_factory=dict)
    note: str = ""


def gpu_rows(values: dict[str, str], host: str) -> GpuRows:
    """The GPU sections of TELEMETRY_SCRIPT's output; ``host`` names the host in notes."""
    host = values.get("hostname", "").strip() or host
    if "no-smi" in values:
        return GpuRows("none", note=f"nvidia-smi not found on {host}")
    output = values.get("gpus", "")
    if values.get("gpus-rc", "").strip() != "0":
        first = next(iter(lines(output)), "no output")
        return GpuRows("none", note=f"nvidia-smi failed on {host}: {first}")
    try:
        rows = nvidia_smi.parse_gpus(output, legacy="legacy" in values)
        apps = nvidia_smi.parse_apps(values.get("apps", ""))
    except nvidia_smi.NvidiaSmiError as exc:
        return GpuRows("none", note=f"nvidia-smi on {host}: {exc}")
    return GpuRows("nvidia-smi", rows, apps)


def host_readings(values: dict[str, str]) -> dict:
    """CPU, load and memory of the host from TELEMETRY_SCRIPT's /proc sections."""
    meminfo = procfs.parse_meminfo(values.get("meminfo", ""))
    return {
        "cpu_percent": procfs.cpu_percent(values.get("stat1", ""), values.get("stat2", "")),
        "load_avg": procfs.parse_loadavg(values.get("loadavg", "")),
        "memory_total_bytes": meminfo.get("MemTotal"),
        "memory_used_bytes": procfs.memory_used_bytes(meminfo),
    }


def host_inventory(values: dict[str, str]) -> dict:
    """The host part of an inventory (GPU fields left empty) from TELEMETRY_SCRIPT's output."""
    meminfo = procfs.parse_meminfo(values.get("meminfo", ""))
    nproc = values.get("nproc", "").strip()
    nodes = []
    for line in lines(values.get("nodes", "")):
        node, _, cpus = line.partition(" ")
        if node.isdigit():
            nodes.append({"node": int(node), "cpus": cpus.strip()})
    return {
        "hostname": values.get("hostname", "").strip(),
        "driver_version": None,
        "cuda_version": None,
        "cpu_count": int(nproc) if nproc.isdigit() else None,
        "cpu_model": procfs.cpu_model(values.get("cpuinfo", "")),
        "memory_total_bytes": meminfo.get("MemTotal"),
        "numa_nodes": sorted(nodes, key=lambda n: n["node"]),
        "source": "none",
        "note": "",
        "gpus": [],
    }


def pci_numa(output: str, marker: str) -> dict[str, tuple[int | None, str | None]]:
    """PCI_SCRIPT's output → {sysfs address: (NUMA node, local CPU list)}."""
    found = {}
    for address, body in sections(output, marker):
        node_text, _, cpus = body.partition("\n")
        found[address] = (procfs.parse_numa_node(node_text), cpus.strip() or None)
    return found


def simulator_gpus(body: bytes | str) -> list[dict]:
    """A simulated engine's ``/simulator/gpus`` answer → its GPU readings ([] if unreadable)."""
    try:
        gpus = decode(body).get("gpus", [])
    except (ValueError, AttributeError):
        return []
    return gpus if isinstance(gpus, list) else []


def from_simulator(reading: dict) -> dict:
    """A simulated GPU reading in the telemetry shape nvidia-smi rows get."""
    row = {key: reading.get(key) for key in nvidia_smi.TELEMETRY_KEYS}
    return nvidia_smi.telemetry_gpu(
        row,
        processes=reading.get("processes") or [],
        numa_node=reading.get("numa_node"),
        cpu_affinity=reading.get("cpu_affinity"),
    )
