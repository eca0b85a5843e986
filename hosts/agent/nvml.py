"""GPU telemetry through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Drivers and GPUs differ in what they report (no ECC on consumer cards, no power reading on some
boards, no NUMA call before driver 535 …): each metric is read on its own, and one the driver
refuses is reported as None and named in the GPU's ``missing`` list instead of failing the
sample. NVML that cannot start at all (no library, no driver, an import error) means "no NVML
here", with the reason kept for the inventory's note.

The bindings module is a constructor argument so tests can hand in a stand-in that raises the
real ``pynvml`` exceptions for some calls.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from pathlib import Path

from hosts.agent.host import format_cpu_list
from hosts.transport.base import GPU_READING_FIELDS

log = logging.getLogger("hosts.agent.nvml")

# Fields NVML fills for one GPU (the index is the handle's, never "missing").
FIELDS = tuple(f for f in GPU_READING_FIELDS if f != "index")

# (word, pynvml constant, value in nvml.h): the value is looked up in the bindings first so a
# renumbering there wins; the literal keeps old bindings without the newer names working.
CLOCK_EVENT_REASONS = (
    ("Idle", "nvmlClocksEventReasonGpuIdle", 0x1),
    ("ApplicationsClocksSetting", "nvmlClocksEventReasonApplicationsClocksSetting", 0x2),
    ("SwPowerCap", "nvmlClocksEventReasonSwPowerCap", 0x4),
    ("HwSlowdown", "nvmlClocksEventReasonHwSlowdown", 0x8),
    ("SyncBoost", "nvmlClocksEventReasonSyncBoost", 0x10),
    ("SwThermalSlowdown", "nvmlClocksEventReasonSwThermalSlowdown", 0x20),
    ("HwThermalSlowdown", "nvmlClocksEventReasonHwThermalSlowdown", 0x40),
    ("HwPowerBrakeSlowdown", "nvmlClocksEventReasonHwPowerBrakeSlowdown", 0x80),
    ("DisplayClockSetting", "nvmlClocksEventReasonDisplayClockSetting", 0x100),
)


def decode_reasons(mask: int | None, nvml=None) -> list[str] | None:
    """The clock-event bitmask as words; bits without a name come out as ``0x…``."""
    if mask is None:
        return None
    words, known = [], 0
    for word, constant, default in CLOCK_EVENT_REASONS:
        bit = getattr(nvml, constant, default) if nvml is not None else default
        known |= bit
        if mask & bit:
            words.append(word)
    rest = mask & ~known
    if rest:
        words.append(hex(rest))
    return words


def cuda_version_string(version: int | None) -> str | None:
    """NVML's 12040 → ``"12.4"``."""
    if not version:
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


def affinity_words_to_list(words) -> list[int]:
    """NVML's CPU-set array (64 CPUs per unsigned long on 64-bit Linux) → CPU numbers."""
    cpus = []
    for index, word in enumerate(words):
        word = int(word)
        for bit in range(64):
            if word >> bit & 1:
                cpus.append(index * 64 + bit)
    return cpus


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlReader:
    """Reads every GPU NVML sees. ``available`` is False (and ``reason`` says why) when NVML
    could not start; the reader then reports no GPUs."""

    def __init__(self, nvml=None, *, sysfs_pci: Path = Path("/sys/bus/pci/devices")):
        self.available = False
        self.reason = ""
        self.driver_version: str | None = None
        self.cuda_version: str | None = None
        self.sysfs_pci = sysfs_pci
        self._lock = threading.Lock()
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as exc:
                self.nvml = None
                self.reason = f"the nvidia-ml-py bindings are not installed ({exc})"
                return
        self.nvml = nvml
        self.error = getattr(nvml, "NVMLError", Exception)
        try:
            nvml.nvmlInit()
        except self.error as exc:
            # LibraryNotFound / DriverNotLoaded on machines without an NVIDIA driver; any other
            # init error (version mismatch, no permission) equally means we cannot read GPUs.
            self.reason = f"{type(exc).__name__}: {exc}"
            return
        except OSError as exc:
            self.reason = f"NVML could not be loaded: {exc}"
            return
        self.available = True
        self.driver_version = self._try(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        self.cuda_version = cuda_version_string(
            self._try(lambda: nvml.nvmlSystemGetCudaDriverVersion())
        )

    def close(self) -> None:
        if self.available:
            self._try(self.nvml.nvmlShutdown)
            self.available = False

    # -- reading ------------------------------------------------------------------------------

    def _try(self, read):
        try:
            return read()
        except self.error as exc:
            log.debug("NVML call failed: %s", exc)
        except AttributeError:  # bindings older than the call
            pass
        return None

    def device_count(self) -> int:
        if not self.available:
            return 0
        return self._try(self.nvml.nvmlDeviceGetCount) or 0

    def gpus(self) -> list[dict]:
        """One reading per GPU in the shape of Transport.telemetry()'s ``gpus`` items."""
        if not self.available:
            return []
        with self._lock:  # NVML is thread-safe; the lock only keeps samples from interleaving
            return [self._read(index) for index in range(self.device_count())]

    def inventory_gpus(self) -> list[dict]:
        keys = ("index", "uuid", "name", "memory_total_bytes", "numa_node", "cpu_affinity")
        return [{k: gpu[k] for k in keys} for gpu in self.gpus()]

    def _read(self, index: int) -> dict:
        nvml = self.nvml
        reading: dict = {"index": index}
        missing: list[str] = []

        def put(field: str, read, convert=lambda v: v):
            try:
                value = read()
            except self.error as exc:
                log.debug("GPU %d %s: %s", index, field, exc)
                value = None
            except AttributeError:
                value = None
            except Exception:  # noqa: BLE001 - a metric the bindings choke on must not take the sample down
                log.exception("GPU %d: reading %s failed", index, field)
                value = None
            if value is not None:
                value = convert(value)
            reading[field] = value
            if value is None:
                missing.append(field)

        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except self.error as exc:
            log.warning("GPU %d: no handle: %s", index, exc)
            for field in FIELDS:
                reading[field] = None
            reading["missing"] = list(FIELDS)
            return reading

        put("name", lambda: nvml.nvmlDeviceGetName(handle), _text)
        put("uuid", lambda: nvml.nvmlDeviceGetUUID(handle), _text)
        memory = self._try(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        put("memory_total_bytes", lambda: memory.total, int)
        put("memory_used_bytes", lambda: memory.used, int)
        rates = self._try(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        put("utilization_gpu_pct", lambda: rates.gpu, int)
        put("utilization_memory_pct", lambda: rates.memory, int)
        put(
            "temperature_c",
            lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
            int,
        )
        put("power_w", lambda: nvml.nvmlDeviceGetPowerUsage(handle), lambda mw: round(mw / 1000, 1))
        put(
            "power_limit_w",
            lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle),
            lambda mw: round(mw / 1000, 1),
        )
        put("sm_clock_mhz", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM), int)
        put(
            "max_sm_clock_mhz",
            lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM),
            int,
        )
        put("mem_clock_mhz", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM), int)
        put(
            "max_mem_clock_mhz",
            lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM),
            int,
        )
        put("clocks_event_reasons", lambda: self._clock_event_reasons(handle), int)
        put("throttle_reasons", lambda: decode_reasons(reading["clocks_event_reasons"], nvml))
        put(
            "pcie_tx_kbps",
            lambda: nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES),
            int,
        )
        put(
            "pcie_rx_kbps",
            lambda: nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_RX_BYTES),
            int,
        )
        put("numa_node", lambda: self._numa_node(handle))
        put("cpu_affinity", lambda: self._cpu_affinity(handle))
        put(
            "ecc_corrected",
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC
            ),
            int,
        )
        put(
            "ecc_uncorrected",
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            ),
            int,
        )
        put("processes", lambda: self._processes(handle))
        reading["missing"] = missing
        return reading

    def _clock_event_reasons(self, handle) -> int:
        nvml = self.nvml
        try:
            return nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
        except (self.error, AttributeError):
            # Drivers before r535 (and old bindings) only have the "throttle" spelling; the
            # bits are the same.
            return nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)

    def _numa_node(self, handle) -> int | None:
        nvml = self.nvml
        try:
            node = nvml.nvmlDeviceGetNumaNodeId(handle)
        except (self.error, AttributeError):
            # Older drivers lack the call; the kernel knows the PCI device's node too.
            node = self._numa_node_from_sysfs(handle)
        return node if node is not None and node >= 0 else None

    def _numa_node_from_sysfs(self, handle) -> int | None:
        info = self.nvml.nvmlDeviceGetPciInfo(handle)
        bus_id = _text(info.busId).lower()  # "00000000:17:00.0"; sysfs uses a 4-digit domain
        domain, _, rest = bus_id.partition(":")
        path = self.sysfs_pci / f"{domain[-4:]}:{rest}" / "numa_node"
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None

    def _cpu_affinity(self, handle) -> str | None:
        words = math.ceil((os.cpu_count() or 64) / 64)
        cpus = affinity_words_to_list(self.nvml.nvmlDeviceGetCpuAffinity(handle, words))
        return format_cpu_list(cpus) if cpus else None

    def _processes(self, handle) -> list[dict]:
        procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        seen: dict[int, dict] = {}
        for proc in procs:
            used = getattr(proc, "usedGpuMemory", None)
            # MIG and multiple contexts list one pid more than once: add them up.
            entry = seen.setdefault(int(proc.pid), {"pid": int(proc.pid), "used_memory_bytes": 0})
            if used is None:
                entry["used_memory_bytes"] = entry["used_memory_bytes"] or None
            elif entry["used_memory_bytes"] is not None:
                entry["used_memory_bytes"] += int(used)
        return list(seen.values())
