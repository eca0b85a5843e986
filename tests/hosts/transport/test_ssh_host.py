"""Host readings over SSH from a real sshd: /proc, and nvidia-smi. This machine has no GPU, so
the nvidia-smi path runs against a stand-in executable that prints captured-style output (the
files in data/), which exercises the remote script, the legacy-field retry, the sysfs NUMA
lookup and the parsing, but not a real driver."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

DATA = Path(__file__).parent / "data"


def fake_nvidia_smi(tmp_path: Path, *, driver: str) -> tuple[Path, Path]:
    """A stand-in ``nvidia-smi``: ``new`` answers like an R550 driver on an H100 box,
    ``old`` like an R470 laptop driver that does not know ``clocks_event_reasons``,
    ``broken`` like a host whose driver is not loaded. Records every argv it gets."""
    calls = tmp_path / "nvidia-smi-calls.jsonl"
    h100, apps = DATA / "h100-query-gpu.csv", DATA / "h100-compute-apps.csv"
    legacy, header = DATA / "laptop-query-gpu-legacy.csv", DATA / "h100-nvidia-smi-header.txt"
    record = (
        f"{shlex.quote(shutil.which('python3') or '/usr/bin/python3')} -c "
        + shlex.quote("import json,sys; print(json.dumps(sys.argv[1:]))")
        + f' "$@" >> {shlex.quote(str(calls))}'
    )
    if driver == "broken":
        body = (
            "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
            'driver. Make sure that the latest NVIDIA driver is installed and running."; exit 9'
        )
    else:
        new_answer = (
            f"cat {h100}"
            if driver == "new"
            else "echo 'Field \"clocks_event_reasons.active\" is not a valid field to query.'; "
            "echo; exit 2"
        )
        body = f"""case "$1" in
  --query-gpu=*clocks_event_reasons.active*) {new_answer} ;;
  --query-gpu=*) cat {legacy} ;;
  --query-compute-apps=*) {"cat " + str(apps) if driver == "new" else ":"} ;;
  "") cat {header} ;;
  *) echo "unexpected arguments: $*" >&2; exit 64 ;;
esac"""
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir(exist_ok=True)
    script.write_text(f"#!/bin/sh\n{record}\n{body}\n")
    script.chmod(0o755)
    return script, calls


def local_numa(bus: str) -> tuple[int | None, str | None]:
    """What this machine's sysfs says for a PCI address (usually nothing: no such device)."""
    base = Path("/sys/bus/pci/devices") / bus
    try:
        node = int((base / "numa_node").read_text())
        cpus = (base / "local_cpulist").read_text().strip()
    except OSError:
        return None, None
    return (node if node >= 0 else None), cpus


def test_telemetry_without_nvidia_smi_says_so_and_still_reads_the_host(make_ssh):
    assert shutil.which("nvidia-smi") is None, "this test is about a host without nvidia-smi"
    sample = make_ssh().telemetry()
    assert sample["source"] == "none"
    assert sample["note"] == f"nvidia-smi not found on {socket.gethostname()}"
    assert sample["gpus"] == [] and sample["engines"] == {}
    host = sample["host"]
    assert 0.0 <= host["cpu_percent"] <= 100.0
    assert len(host["load_avg"]) == 3
    total_kib = int(Path("/proc/meminfo").read_text().split()[1])  # MemTotal, same machine
    assert host["memory_total_bytes"] == total_kib * 1024
    assert 0 < host["memory_used_bytes"] < host["memory_total_bytes"]


def test_inventory_without_nvidia_smi(make_ssh):
    inventory = make_ssh().inventory()
    assert inventory["source"] == "none" and inventory["gpus"] == []
    assert inventory["hostname"] == socket.gethostname()
    assert inventory["cpu_count"] == os.cpu_count()
    assert inventory["driver_version"] is None and inventory["cuda_version"] is None
    nodes = sorted(Path("/sys/devices/system/node").glob("node[0-9]*"))
    assert [n["node"] for n in inventory["numa_nodes"]] == sorted(int(p.name[4:]) for p in nodes)
    for node in inventory["numa_nodes"]:
        expected = Path("/sys/devices/system/node") / f"node{node['node']}" / "cpulist"
        assert node["cpus"] == expected.read_text().strip()


def test_telemetry_from_nvidia_smi_on_an_h100_host(make_ssh, tmp_path):
    smi, calls = fake_nvidia_smi(tmp_path, driver="new")
    sample = make_ssh(nvidia_smi=str(smi)).telemetry()
    assert sample["source"] == "nvidia-smi" and sample["note"] == ""
    assert [g["index"] for g in sample["gpus"]] == [0, 1, 2, 3]
    first = sample["gpus"][0]
    assert first["name"] == "NVIDIA H100 80GB HBM3"
    assert first["throttle_reasons"] == ["SwPowerCap"]
    assert first["processes"] == [{"pid": 412877, "used_memory_bytes": 73640 * 2**20}]
    assert sample["gpus"][2]["processes"] == [] and sample["gpus"][2]["throttle_reasons"] == [
        "Idle"
    ]
    assert (first["numa_node"], first["cpu_affinity"]) == local_numa("0000:18:00.0")
    assert {"pcie_tx_kbps", "pcie_rx_kbps"} <= set(first["missing"])
    argvs = [json.loads(line) for line in calls.read_text().splitlines()]
    assert argvs[0][0].startswith("--query-gpu=index,uuid,name,pci.bus_id,")
    assert argvs[0][1] == "--format=csv,noheader,nounits"
    assert argvs[1] == ["--query-compute-apps=gpu_uuid,pid,used_memory", argvs[0][1]]
    assert len(argvs) == 2  # no legacy retry on a driver that knows the new name


def test_an_old_driver_gets_the_old_throttle_field_and_reports_what_it_lacks(make_ssh, tmp_path):
    smi, calls = fake_nvidia_smi(tmp_path, driver="old")
    (gpu,) = make_ssh(nvidia_smi=str(smi)).telemetry()["gpus"]
    assert gpu["name"] == "NVIDIA GeForce RTX 3060 Laptop GPU"
    assert gpu["power_w"] is None and gpu["ecc_corrected"] is None
    assert {"power_w", "power_limit_w", "ecc_corrected", "clocks_event_reasons"} <= set(
        gpu["missing"]
    )
    argvs = [json.loads(line) for line in calls.read_text().splitlines()]
    assert "clocks_event_reasons.active" in argvs[0][0]
    assert "clocks_throttle_reasons.active" in argvs[1][0]


def test_inventory_from_nvidia_smi(make_ssh, tmp_path):
    smi, _ = fake_nvidia_smi(tmp_path, driver="new")
    inventory = make_ssh(nvidia_smi=str(smi)).inventory()
    assert inventory["source"] == "nvidia-smi"
    assert inventory["driver_version"] == "550.54.15" and inventory["cuda_version"] == "12.4"
    assert len(inventory["gpus"]) == 4
    assert set(inventory["gpus"][0]) == {
        "index",
        "uuid",
        "name",
        "memory_total_bytes",
        "numa_node",
        "cpu_affinity",
    }
    assert inventory["gpus"][3]["uuid"] == "GPU-e07a3c59-4d28-4b9f-9f16-c82d5e0a4b73"


def test_a_failing_nvidia_smi_is_reported_not_raised(make_ssh, tmp_path):
    smi, _ = fake_nvidia_smi(tmp_path, driver="broken")
    sample = make_ssh(nvidia_smi=str(smi)).telemetry()
    assert sample["source"] == "none" and sample["gpus"] == []
    assert "couldn't communicate with the NVIDIA driver" in sample["note"]
    assert make_ssh(nvidia_smi=str(smi)).info()["telemetry_source"] == "nvidia-smi"


@pytest.mark.parametrize("style", ["process", "systemd", "docker"])
def test_no_engines_is_an_empty_map_in_every_style(make_ssh, style, tmp_path):
    transport = make_ssh(
        launch_style=style,
        unit_dir=str(tmp_path),
        systemctl=["/bin/false"],
        journalctl=["/bin/false"],
        docker=["/bin/false"],
    )
    assert transport.telemetry()["engines"] == {}
    status = transport.engine_status("never-deployed")
    assert status["state"] == "stopped" and status["config"] is None
    assert transport.logs("never-deployed") == []
    transport.stop_engine("never-deployed")  # no error when nothing runs
