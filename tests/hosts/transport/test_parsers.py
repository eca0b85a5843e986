"""The pure parsers behind the SSH transport's readings: nvidia-smi CSV (captured-style output
of an 8-GPU H100 box's first four boards and of a laptop GeForce on an old driver) and /proc."""

from __future__ import annotations

from pathlib import Path

import pytest

from hosts.transport import nvidia_smi, procfs

pytestmark = pytest.mark.integration

DATA = Path(__file__).parent / "data"
GIB = 1024**3


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_the_query_names_fields_nvidia_smi_knows_and_falls_back_to_the_old_reason_name():
    argv = nvidia_smi.query_gpu_argv()
    assert argv[0] == "nvidia-smi" and argv[2] == "--format=csv,noheader,nounits"
    fields = argv[1].removeprefix("--query-gpu=").split(",")
    assert "clocks_event_reasons.active" in fields and "enforced.power.limit" in fields
    legacy = nvidia_smi.query_gpu_argv(legacy=True)[1]
    assert "clocks_throttle_reasons.active" in legacy and "clocks_event" not in legacy
    assert nvidia_smi.query_apps_argv()[1] == "--query-compute-apps=gpu_uuid,pid,used_memory"


def test_h100_rows_parse_into_units_of_the_transport_shape():
    rows = nvidia_smi.parse_gpus(read("h100-query-gpu.csv"))
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    busy = rows[0]
    assert busy["name"] == "NVIDIA H100 80GB HBM3"
    assert busy["uuid"] == "GPU-8c3a6f1e-27b4-4d9a-b5e0-91f2c7d4a610"
    assert busy["memory_total_bytes"] == 81559 * 1024 * 1024  # MiB → bytes
    assert 79 < busy["memory_total_bytes"] / GIB < 80
    assert busy["memory_used_bytes"] == 74213 * 1024 * 1024
    assert (busy["utilization_gpu_pct"], busy["utilization_memory_pct"]) == (100, 61)
    assert busy["power_w"] == pytest.approx(689.52) and busy["power_limit_w"] == 700.0
    assert (busy["sm_clock_mhz"], busy["max_sm_clock_mhz"]) == (1755, 1980)
    assert (busy["mem_clock_mhz"], busy["max_mem_clock_mhz"]) == (2619, 2619)
    assert busy["clocks_event_reasons"] == 0x4
    assert busy["driver_version"] == "550.54.15"
    assert rows[2]["ecc_corrected"] == 2 and rows[2]["clocks_event_reasons"] == 0x1


def test_a_full_reading_has_every_key_and_lists_what_nvidia_smi_cannot_say():
    row = nvidia_smi.parse_gpus(read("h100-query-gpu.csv"))[0]
    apps = nvidia_smi.parse_apps(read("h100-compute-apps.csv"))
    reading = nvidia_smi.telemetry_gpu(
        row, processes=apps[row["uuid"]], numa_node=0, cpu_affinity="0-55,112-167"
    )
    assert set(nvidia_smi.TELEMETRY_KEYS) | {"processes", "missing"} == set(reading)
    assert reading["throttle_reasons"] == ["SwPowerCap"]
    assert reading["processes"] == [{"pid": 412877, "used_memory_bytes": 73640 * 1024 * 1024}]
    # No query field for PCIe throughput exists: always missing, never a made-up zero.
    assert reading["missing"] == ["pcie_tx_kbps", "pcie_rx_kbps"]
    assert reading["pcie_tx_kbps"] is None
    assert "pci_bus_id" not in reading and "driver_version" not in reading


def test_not_available_and_not_supported_are_missing_not_zero():
    (row,) = nvidia_smi.parse_gpus(read("laptop-query-gpu-legacy.csv"), legacy=True)
    reading = nvidia_smi.telemetry_gpu(row, processes=[], numa_node=None, cpu_affinity=None)
    for key in ("power_w", "power_limit_w", "ecc_corrected", "ecc_uncorrected"):
        assert reading[key] is None and key in reading["missing"]
    assert reading["clocks_event_reasons"] is None and reading["throttle_reasons"] is None
    assert {"clocks_event_reasons", "throttle_reasons", "numa_node", "cpu_affinity"} <= set(
        reading["missing"]
    )
    assert reading["temperature_c"] == 45 and reading["memory_total_bytes"] == 6 * GIB


@pytest.mark.parametrize("value", ["[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", " "])
def test_missing_markers(value):
    assert nvidia_smi.is_missing(value)


def test_throttle_words_match_the_agents_and_keep_unknown_bits():
    assert nvidia_smi.throttle_words(0) == []
    assert nvidia_smi.throttle_words(0x4 | 0x40) == ["SwPowerCap", "HwThermalSlowdown"]
    assert nvidia_smi.throttle_words(0x1 | 0x800) == ["Idle", "0x800"]
    from hosts.agent.nvml import decode_reasons

    for mask in (0x1, 0x4, 0x8 | 0x20, 0x80 | 0x100, 0xFFF):
        assert nvidia_smi.throttle_words(mask) == decode_reasons(mask)


def test_an_unknown_field_is_recognised_so_the_caller_can_retry_with_the_old_name():
    assert nvidia_smi.invalid_field(read("invalid-field.txt")) == "clocks_event_reasons.active"
    assert nvidia_smi.invalid_field(read("h100-query-gpu.csv")) is None


def test_rows_of_the_wrong_width_are_an_error_not_a_shifted_reading():
    with pytest.raises(nvidia_smi.NvidiaSmiError, match="columns"):
        nvidia_smi.parse_gpus("0, GPU-x, NVIDIA H100 80GB HBM3, 81559\n")
    with pytest.raises(nvidia_smi.NvidiaSmiError, match="unexpected value"):
        bad = read("h100-query-gpu.csv").splitlines()[0].replace("81559", "lots", 1)
        nvidia_smi.parse_gpus(bad)


def test_compute_apps_with_no_processes_and_unknown_memory():
    assert nvidia_smi.parse_apps("") == {}
    assert nvidia_smi.parse_apps("No running processes found\n") == {}
    apps = nvidia_smi.parse_apps("GPU-a, 17, [N/A]\n")
    assert apps == {"GPU-a": [{"pid": 17, "used_memory_bytes": None}]}


def test_cuda_version_and_pci_addresses():
    assert nvidia_smi.cuda_version(read("h100-nvidia-smi-header.txt")) == "12.4"
    assert nvidia_smi.cuda_version("CUDA Version                          : 12.2\n") == "12.2"
    assert nvidia_smi.cuda_version("no header") is None
    assert nvidia_smi.sysfs_pci_address("00000000:BA:00.0") == "0000:ba:00.0"
    assert nvidia_smi.sysfs_pci_address("0001:2A:00.1") == "0001:2a:00.1"
    for bad in (None, "", "../../etc", "00000000:BA:00.0; reboot", "[N/A]"):
        assert nvidia_smi.sysfs_pci_address(bad) is None


MEMINFO = """MemTotal:       2113426428 kB
MemFree:        1650000000 kB
MemAvailable:   1900000000 kB
HugePages_Total:       0
"""


def test_procfs_readings():
    assert procfs.parse_loadavg("3.52 2.94 2.11 5/2345 99871\n") == [3.52, 2.94, 2.11]
    info = procfs.parse_meminfo(MEMINFO)
    assert info["MemTotal"] == 2113426428 * 1024 and info["HugePages_Total"] == 0
    assert procfs.memory_used_bytes(info) == (2113426428 - 1900000000) * 1024
    first = "cpu  100 0 50 800 50 0 0 0 0 0"
    second = "cpu  160 0 70 900 70 0 0 0 0 0"  # busy +80, total +200 (iowait counts as idle)
    assert procfs.cpu_percent(first, second) == 40.0
    assert procfs.cpu_percent(first, first) is None
    assert procfs.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert procfs.parse_numa_node("-1\n") is None and procfs.parse_numa_node("1") == 1
    assert procfs.cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 9654 96-Core\n") == (
        "AMD EPYC 9654 96-Core"
    )


def test_proc_stat_with_a_command_name_that_has_spaces_and_parentheses():
    line = "4242 (python3 (x) y) S 1 4242 4242 0 -1 4194560 " + " ".join(["0"] * 12) + " 987654 0"
    assert procfs.parse_proc_stat(line) == ("S", 4242, 987654)
    assert procfs.parse_proc_stat("garbage") is None


def test_what_ssh_reads_is_storable_without_nul_or_nan():
    """PostgreSQL takes neither a NUL in text/jsonb nor NaN in JSON: what the SSH transport
    parses drops the one and reads the other as null, as the agent transport does."""
    from hosts.transport import jsontext
    from hosts.transport.ssh import parsing

    assert parsing.json_or('{"note": "a\\u0000b", "power": NaN}', {}) == {
        "note": "ab",
        "power": None,
    }
    gpus = parsing.simulator_gpus(b'{"gpus": [{"name": "H\\u0000100", "power_w": Infinity}]}')
    assert gpus == [{"name": "H100", "power_w": None}]
    assert parsing.libraries('{"vllm": "0.9\\u0000"}') == {"vllm": "0.9"}
    # A command's output: a raw NUL dropped, undecodable bytes replaced.
    assert jsontext.text(b"driver\x00 550\xff") == "driver 550\ufffd"
    assert jsontext.text(b"plain") == "plain"
