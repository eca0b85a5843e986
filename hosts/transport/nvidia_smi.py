"""Reading GPUs through ``nvidia-smi`` CSV queries: the field lists to ask for and the parsers of
what comes back, in the shapes of ``Transport.telemetry()`` / ``inventory()``. (Pure: no I/O.)

The SSH transport runs these queries on hosts without our agent. Field names are the ones
``nvidia-smi --help-query-gpu`` lists. Two traps shape this module:

* one unknown field name fails the whole query, and the throttle-reasons bitmask was renamed
  (``clocks_throttle_reasons.active`` → ``clocks_event_reasons.active``, both accepted by
  R5xx drivers, only the new one by newer ones), so the caller asks with the new name and
  falls back to ``LEGACY_GPU_FIELDS``;
* a metric the board does not report comes back as ``[N/A]``, ``[Not Supported]`` (or another
  bracketed word such as ``[Unknown Error]``): that is "missing", never zero.

nvidia-smi has no query field for PCIe throughput (NVML's ``nvmlDeviceGetPcieThroughput``), so
``pcie_tx_kbps`` / ``pcie_rx_kbps`` are always missing here.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable

from hosts.transport.base import GPU_READING_FIELDS

MIB = 1024 * 1024

# (nvidia-smi field, our key, converter). Order is the CSV column order.
_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("index", "index", "int"),
    ("uuid", "uuid", "text"),
    ("name", "name", "text"),
    ("pci.bus_id", "pci_bus_id", "text"),
    ("driver_version", "driver_version", "text"),
    ("memory.total", "memory_total_bytes", "mib"),
    ("memory.used", "memory_used_bytes", "mib"),
    ("utilization.gpu", "utilization_gpu_pct", "int"),
    ("utilization.memory", "utilization_memory_pct", "int"),
    ("temperature.gpu", "temperature_c", "int"),
    ("power.draw", "power_w", "float"),
    # The limit actually enforced (the lower of the user and board limits), as NVML's
    # nvmlDeviceGetEnforcedPowerLimit that the agent reads.
    ("enforced.power.limit", "power_limit_w", "float"),
    ("clocks.sm", "sm_clock_mhz", "int"),
    ("clocks.max.sm", "max_sm_clock_mhz", "int"),
    ("clocks.mem", "mem_clock_mhz", "int"),
    ("clocks.max.mem", "max_mem_clock_mhz", "int"),
    ("ecc.errors.corrected.volatile.total", "ecc_corrected", "int"),
    ("ecc.errors.uncorrected.volatile.total", "ecc_uncorrected", "int"),
    ("clocks_event_reasons.active", "clocks_event_reasons", "hex"),
)
GPU_FIELDS: tuple[str, ...] = tuple(f for f, _, _ in _FIELDS)
LEGACY_GPU_FIELDS: tuple[str, ...] = tuple(
    "clocks_throttle_reasons.active" if f == "clocks_event_reasons.active" else f
    for f in GPU_FIELDS
)
APP_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "used_memory")
CSV_FORMAT = "--format=csv,noheader,nounits"

# nvmlClocksEventReasons bits, in the words the agent uses (hosts.agent.nvml.CLOCK_EVENT_REASONS)
# so a reading means the same whichever transport produced it.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "Idle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
}

# nvidia-smi reports processes with another query (--query-compute-apps).
TELEMETRY_KEYS: tuple[str, ...] = tuple(f for f in GPU_READING_FIELDS if f != "processes")

_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
_CUDA_VERSION = re.compile(r"CUDA Version\s*:\s*([0-9][0-9.]*)")
_BUS_ID = re.compile(r"^([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])$")


class NvidiaSmiError(ValueError):
    """nvidia-smi answered something other than the CSV asked for; ``str()`` says what."""


def query_gpu_argv(legacy: bool = False) -> list[str]:
    fields = LEGACY_GPU_FIELDS if legacy else GPU_FIELDS
    return ["nvidia-smi", "--query-gpu=" + ",".join(fields), CSV_FORMAT]


def query_apps_argv() -> list[str]:
    return ["nvidia-smi", "--query-compute-apps=" + ",".join(APP_FIELDS), CSV_FORMAT]


def is_missing(value: str) -> bool:
    """``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``, ``N/A`` or empty: not reported."""
    value = value.strip()
    return not value or value == "N/A" or (value.startswith("[") and value.endswith("]"))


def _convert(value: str, kind: str):
    if is_missing(value):
        return None
    value = value.strip()
    try:
        if kind == "text":
            return value
        if kind == "int":
            return int(float(value))  # some drivers print "97.00" where an int is expected
        if kind == "float":
            return float(value)
        if kind == "mib":
            return int(float(value) * MIB)
        if kind == "hex":
            return int(value, 16)
    except ValueError:
        raise NvidiaSmiError(f"unexpected value {value!r} from nvidia-smi") from None
    raise AssertionError(kind)


def invalid_field(output: str) -> str | None:
    """The field nvidia-smi refused (an older or newer driver), if that is why it failed."""
    match = _INVALID_FIELD.search(output)
    return match.group(1) if match else None


def _rows(text: str) -> Iterable[list[str]]:
    lines = [line for line in text.splitlines() if line.strip()]
    yield from csv.reader(lines, skipinitialspace=True)


def throttle_words(mask: int | None) -> list[str] | None:
    if mask is None:
        return None
    words = [word for bit, word in THROTTLE_REASONS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASONS)
    if unknown:
        words.append(hex(unknown))  # as the agent spells bits without a name
    return words


def parse_gpus(text: str, legacy: bool = False) -> list[dict]:
    """Rows of a ``query_gpu_argv()`` answer → dicts keyed like ``_FIELDS`` (plus
    ``pci_bus_id`` and ``driver_version``, which the caller uses and drops)."""
    del legacy  # both field lists have the same columns and conversions
    gpus = []
    for row in _rows(text):
        if len(row) != len(_FIELDS):
            raise NvidiaSmiError(
                f"nvidia-smi printed {len(row)} columns where {len(_FIELDS)} were asked for: "
                f"{', '.join(row)[:200]}"
            )
        gpus.append(
            {key: _convert(value, kind) for (_, key, kind), value in zip(_FIELDS, row, strict=True)}
        )
    return gpus


def parse_apps(text: str) -> dict[str, list[dict]]:
    """``query_apps_argv()`` answer → ``{gpu_uuid: [{"pid", "used_memory_bytes"}]}``."""
    apps: dict[str, list[dict]] = {}
    for row in _rows(text):
        if len(row) != len(APP_FIELDS) or row[0].startswith("No running"):
            continue  # older drivers print a sentence instead of nothing
        uuid, pid, used = row
        pid_value = _convert(pid, "int")
        if pid_value is None:
            continue
        apps.setdefault(uuid.strip(), []).append(
            {"pid": pid_value, "used_memory_bytes": _convert(used, "mib")}
        )
    return apps


def cuda_version(text: str) -> str | None:
    """The CUDA version from plain ``nvidia-smi`` (or ``-q``) output's header."""
    match = _CUDA_VERSION.search(text)
    return match.group(1) if match else None


def sysfs_pci_address(bus_id: str | None) -> str | None:
    """nvidia-smi's ``00000000:18:00.0`` → sysfs's ``0000:18:00.0`` (lower case, 4-digit
    domain); None when it does not look like a PCI address (so it never reaches a path)."""
    if not bus_id:
        return None
    match = _BUS_ID.match(bus_id.strip())
    if not match:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def telemetry_gpu(
    row: dict,
    *,
    processes: list[dict] | None,
    numa_node: int | None,
    cpu_affinity: str | None,
) -> dict:
    """One parsed row → one GPU reading of ``Transport.telemetry()``, with ``missing``."""
    reading = {key: row.get(key) for key in TELEMETRY_KEYS}
    reading["throttle_reasons"] = throttle_words(row.get("clocks_event_reasons"))
    reading["numa_node"] = numa_node
    reading["cpu_affinity"] = cpu_affinity
    reading["processes"] = processes or []
    reading["missing"] = [key for key in TELEMETRY_KEYS if reading[key] is None]
    return reading


def inventory_gpu(row: dict, *, numa_node: int | None, cpu_affinity: str | None) -> dict:
    return {
        "index": row.get("index"),
        "uuid": row.get("uuid"),
        "name": row.get("name"),
        "memory_total_bytes": row.get("memory_total_bytes"),
        "numa_node": numa_node,
        "cpu_affinity": cpu_affinity,
    }
