"""The NVML reader against a stand-in bindings module (real pynvml exceptions and constants)
and against the real bindings on this machine."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from hosts.agent.nvml import (
    FIELDS,
    NvmlReader,
    affinity_words_to_list,
    cuda_version_string,
    decode_reasons,
)

pytestmark = pytest.mark.integration

MIB = 2**20


def not_supported(*_args):
    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def function_not_found(*_args):
    # What pynvml raises when libnvml lacks the symbol (an older driver).
    raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


class FakeNvml:
    """Two GPUs: an H100 that reports everything, and a board on an old driver that lacks
    ECC, power, processes, the NUMA call and the "clocks event" spelling."""

    # The real exception classes and constants: the reader must work with these as they are.
    NVMLError = pynvml.NVMLError
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
    NVML_PCIE_UTIL_TX_BYTES = pynvml.NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = pynvml.NVML_PCIE_UTIL_RX_BYTES
    NVML_MEMORY_ERROR_TYPE_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    nvmlClocksEventReasonSwPowerCap = pynvml.nvmlClocksEventReasonSwPowerCap
    nvmlClocksEventReasonHwThermalSlowdown = pynvml.nvmlClocksEventReasonHwThermalSlowdown

    def __init__(self):
        self.shut_down = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return SimpleNamespace(index=index)

    def nvmlDeviceGetName(self, h):
        return ["NVIDIA H100 80GB HBM3", b"NVIDIA L4"][h.index]

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-0000000{h.index}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=81559 * MIB, used=1024 * MIB, free=80535 * MIB)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=87, memory=41)

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 64

    def nvmlDeviceGetPowerUsage(self, h):
        if h.index == 1:
            not_supported()
        return 612_345  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        if h.index == 1:
            not_supported()
        return 700_000

    def nvmlDeviceGetClockInfo(self, h, clock):
        return {pynvml.NVML_CLOCK_SM: 1755, pynvml.NVML_CLOCK_MEM: 2619}[clock]

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619}[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        if h.index == 1:
            function_not_found()
        return pynvml.nvmlClocksEventReasonSwPowerCap

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return (
            pynvml.nvmlClocksThrottleReasonSwPowerCap
            | pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
        )

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        return {pynvml.NVML_PCIE_UTIL_TX_BYTES: 1200, pynvml.NVML_PCIE_UTIL_RX_BYTES: 3400}[counter]

    def nvmlDeviceGetNumaNodeId(self, h):
        if h.index == 1:
            function_not_found()
        return 1

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=b"00000000:17:00.0")

    def nvmlDeviceGetCpuAffinity(self, h, words):
        assert words >= 1
        # CPUs 0-15 and 64-65 (the second 64-bit word), padded to the size asked for.
        return ([0xFFFF, 0x3] + [0] * words)[: max(words, 2)]

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter):
        if h.index == 1:
            not_supported()
        assert counter == pynvml.NVML_VOLATILE_ECC
        return {
            pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: 3,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: 0,
        }[error_type]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        if h.index == 1:
            not_supported()
        return [
            SimpleNamespace(pid=4242, usedGpuMemory=70 * 1024 * MIB),
            SimpleNamespace(pid=4343, usedGpuMemory=None),
        ]


@pytest.fixture
def sysfs(tmp_path):
    device = tmp_path / "0000:17:00.0"
    device.mkdir()
    (device / "numa_node").write_text("0\n")
    return tmp_path


def test_partial_support_gpu_reports_values_and_missing(sysfs):
    fake = FakeNvml()
    reader = NvmlReader(fake, sysfs_pci=sysfs)
    assert reader.available and reader.reason == ""
    assert reader.driver_version == "550.54.15"
    assert reader.cuda_version == "12.4"

    full, partial = reader.gpus()
    assert full["missing"] == []
    assert set(FIELDS) <= set(full)
    assert full["name"] == "NVIDIA H100 80GB HBM3"
    assert full["memory_total_bytes"] == 81559 * MIB
    assert full["power_w"] == 612.3 and full["power_limit_w"] == 700.0
    assert full["clocks_event_reasons"] == 0x4
    assert full["throttle_reasons"] == ["SwPowerCap"]
    assert full["numa_node"] == 1
    assert full["cpu_affinity"] == "0-15,64-65"
    assert (full["ecc_corrected"], full["ecc_uncorrected"]) == (3, 0)
    assert full["processes"] == [
        {"pid": 4242, "used_memory_bytes": 70 * 1024 * MIB},
        {"pid": 4343, "used_memory_bytes": None},
    ]

    # The old-driver board: values where it has them, None + named in "missing" elsewhere.
    assert partial["name"] == "NVIDIA L4"  # bytes from old bindings decoded
    assert partial["utilization_gpu_pct"] == 87 and partial["temperature_c"] == 64
    assert sorted(partial["missing"]) == sorted(
        ["power_w", "power_limit_w", "ecc_corrected", "ecc_uncorrected", "processes"]
    )
    for name in partial["missing"]:
        assert partial[name] is None
    # Fallbacks: the "throttle" spelling of the reasons, the kernel's NUMA node of the device.
    assert partial["clocks_event_reasons"] == 0x44
    assert partial["throttle_reasons"] == ["SwPowerCap", "HwThermalSlowdown"]
    assert partial["numa_node"] == 0

    inventory = reader.inventory_gpus()
    assert inventory[0] == {
        "index": 0,
        "uuid": "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd",
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total_bytes": 81559 * MIB,
        "numa_node": 1,
        "cpu_affinity": "0-15,64-65",
    }
    reader.close()
    assert fake.shut_down


def test_a_gpu_without_a_handle_is_all_missing():
    fake = FakeNvml()

    def handle(i):
        if i == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(index=i)

    fake.nvmlDeviceGetHandleByIndex = handle
    _, lost = NvmlReader(fake).gpus()
    assert lost["index"] == 1 and lost["missing"] == list(FIELDS)
    assert all(lost[f] is None for f in FIELDS)


class Without:
    """The bindings minus some functions, as in an older nvidia-ml-py."""

    def __init__(self, inner, *names):
        self._inner, self._names = inner, names

    def __getattr__(self, name):
        if name in self._names:
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_bindings_older_than_a_call_count_as_missing(sysfs):
    old = Without(
        FakeNvml(),
        "nvmlDeviceGetNumaNodeId",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    )
    gpu = NvmlReader(old, sysfs_pci=sysfs).gpus()[0]
    assert gpu["numa_node"] == 0  # from sysfs
    assert gpu["clocks_event_reasons"] is None and gpu["throttle_reasons"] is None
    assert {"clocks_event_reasons", "throttle_reasons"} <= set(gpu["missing"])


@pytest.mark.parametrize(
    "error",
    [
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_NO_PERMISSION,
    ],
)
def test_init_failure_means_no_nvml(error):
    fake = FakeNvml()

    def fail():
        raise pynvml.NVMLError(error)

    fake.nvmlInit = fail
    reader = NvmlReader(fake)
    assert not reader.available
    assert reader.reason.startswith("NVMLError_")
    assert reader.gpus() == [] and reader.inventory_gpus() == []
    reader.close()


def test_real_bindings_on_this_machine():
    reader = NvmlReader()  # the installed nvidia-ml-py
    try:
        if reader.available:  # a machine with an NVIDIA driver: real readings
            gpus = reader.gpus()
            assert gpus and all(set(FIELDS) <= set(g) for g in gpus)
            assert reader.driver_version
        else:  # this CI machine: no driver, reported cleanly
            assert "NVMLError_LibraryNotFound" in reader.reason or "Driver" in reader.reason
            assert reader.gpus() == []
    finally:
        reader.close()


def test_helpers():
    assert decode_reasons(0) == []
    assert decode_reasons(0x1 | 0x100) == ["Idle", "DisplayClockSetting"]
    assert decode_reasons(0x1000) == ["0x1000"]
    assert decode_reasons(None) is None
    assert decode_reasons(0x4, pynvml) == ["SwPowerCap"]
    assert cuda_version_string(12040) == "12.4" and cuda_version_string(11080) == "11.8"
    assert cuda_version_string(None) is None
    assert affinity_words_to_list([0b101, 1]) == [0, 2, 64]
