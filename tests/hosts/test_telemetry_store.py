"""What hosts report lands on rows: inventory → Gpu rows, telemetry → samples, minutes,
retention. Runs on SQLite (first pass of `make test`) and on PostgreSQL (second pass)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from hosts.models import Deployment, Gpu, GpuSample, GpuSampleMinute
from hosts.services import inventory, telemetry
from tests.factories import make_config, make_deployment, make_host

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

INVENTORY = {
    "hostname": "gpu-box-7",
    "driver_version": "570.124.06",
    "cuda_version": "12.8",
    "cpu_count": 64,
    "cpu_model": "AMD EPYC 9354",
    "memory_total_bytes": 512 * 2**30,
    "numa_nodes": [{"node": 0, "cpus": "0-31"}, {"node": 1, "cpus": "32-63"}],
    "source": "nvml",
    "note": "",
    "gpus": [
        {
            "index": i,
            "uuid": f"GPU-aaaa-{i}",
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total_bytes": 80 * 2**30,
            "numa_node": i // 1,
            "cpu_affinity": "0-31" if i == 0 else "32-63",
        }
        for i in range(2)
    ],
}


def reading(util=(50, 0), power=(400.0, 70.0), reasons=(0, 1), t=None, engines=None):
    return {
        "time": (t or timezone.now()).timestamp(),
        "source": "nvml",
        "note": "",
        "gpus": [
            {
                "index": i,
                "uuid": f"GPU-aaaa-{i}",
                "utilization_gpu_pct": util[i],
                "memory_used_bytes": (60 if i == 0 else 1) * 2**30,
                "memory_total_bytes": 80 * 2**30,
                "power_w": power[i],
                "power_limit_w": 700.0,
                "temperature_c": 61,
                "sm_clock_mhz": 1980,
                "max_sm_clock_mhz": 1980,
                "mem_clock_mhz": 2619,
                "clocks_event_reasons": reasons[i],
                "throttle_reasons": ["SwPowerCap"] if reasons[i] & 4 else ["Idle"],
                "pcie_tx_kbps": 1000,
                "pcie_rx_kbps": 2000,
                "missing": ["ecc_corrected"],
            }
            for i in range(2)
        ],
        "host": {
            "cpu_percent": 12.5,
            "load_avg": [1, 2, 3],
            "memory_total_bytes": 1,
            "memory_used_bytes": 1,
        },
        "engines": engines or {},
    }


def test_inventory_creates_and_updates_gpus_by_uuid():
    host = make_host()
    inventory.refresh_inventory(host, INVENTORY)
    host.refresh_from_db()
    assert host.status == "online" and host.cpu_count == 64 and host.driver_version == "570.124.06"
    assert [g.cpu_affinity for g in host.gpus.order_by("index")] == ["0-31", "32-63"]
    gpu0 = Gpu.objects.get(uuid="GPU-aaaa-0")
    # The two cards swapped slots: same rows (history kept), new indexes.
    swapped = dict(INVENTORY, gpus=[dict(g, index=1 - g["index"]) for g in INVENTORY["gpus"]])
    inventory.refresh_inventory(host, swapped)
    assert Gpu.objects.filter(host=host).count() == 2
    gpu0.refresh_from_db()
    assert gpu0.index == 1


def test_telemetry_becomes_samples_latest_readings_and_engine_states():
    host = make_host()
    inventory.refresh_inventory(host, INVENTORY)
    deployment = make_deployment(host, name="chat")
    make_config(deployment)
    stored = telemetry.record_telemetry(
        host, reading(engines={"chat": {"state": "ready", "pid": 42}})
    )
    assert stored == 2 and GpuSample.objects.count() == 2
    gpu0 = Gpu.objects.get(uuid="GPU-aaaa-0")
    sample = GpuSample.objects.get(gpu=gpu0)
    assert sample.utilization_pct == 50 and sample.power_w == 400.0
    assert gpu0.last_sample["memory_used_bytes"] == 60 * 2**30
    assert gpu0.last_sample["missing"] == ["ecc_corrected"]
    # GPU1 is idle (reason 0x1): clocking down when idle is not a throttle worth a badge.
    assert Gpu.objects.get(uuid="GPU-aaaa-1").throttle_reasons == []
    telemetry.record_telemetry(host, reading(reasons=(4, 1)))
    assert Gpu.objects.get(uuid="GPU-aaaa-0").throttle_reasons == ["SwPowerCap"]
    host.refresh_from_db()
    assert host.host_readings["cpu_percent"] == 12.5 and host.last_seen_at is not None
    assert Deployment.objects.get(pk=deployment.pk).status == "running"


def test_a_new_gpu_in_telemetry_is_not_dropped_silently(monkeypatch):
    host = make_host()
    inventory.refresh_inventory(host, dict(INVENTORY, gpus=INVENTORY["gpus"][:1]))
    asked = []

    class Inventory:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def inventory(self):
            asked.append(True)
            return INVENTORY

    monkeypatch.setattr(telemetry, "transport_for", lambda h: Inventory())
    assert telemetry.record_telemetry(host, reading()) == 2
    assert asked and host.gpus.count() == 2


def sample_at(gpu, when, util, power, reasons=0):
    return GpuSample(
        gpu=gpu,
        time=when,
        utilization_pct=util,
        memory_used_bytes=int(util) * 2**20,
        power_w=power,
        temperature_c=50 + util / 10,
        sm_clock_mhz=1500 + int(util),
        clocks_event_reasons=reasons,
    )


def test_downsampling_aggregates_minutes_and_keeps_retention(settings):
    host = make_host()
    inventory.refresh_inventory(host, INVENTORY)
    gpu = Gpu.objects.get(uuid="GPU-aaaa-0")
    now = timezone.now().replace(second=30, microsecond=0)
    base = now.replace(second=0) - timedelta(minutes=90)
    rows = []
    for minute in range(91):  # 90 full minutes and the one still filling
        for second in range(0, 60, 10):
            when = base + timedelta(minutes=minute, seconds=second)
            if when > now:
                break
            util = 10 * (second // 10)  # 0, 10, ..., 50 in every minute
            rows.append(sample_at(gpu, when, util, 100 + util, reasons=4 if second == 50 else 1))
    GpuSample.objects.bulk_create(rows)
    ancient = GpuSampleMinute.objects.create(
        gpu=gpu, minute=now - timedelta(days=31), samples=1, utilization_avg=1
    )
    result = telemetry.downsample_telemetry(now)
    assert result["aggregated"] == 90  # the current minute waits until it is complete
    first = GpuSampleMinute.objects.get(gpu=gpu, minute=base)
    assert first.samples == 6 and first.utilization_avg == 25 and first.utilization_max == 50
    assert first.power_avg == 125 and first.power_max == 150
    assert first.sm_clock_min == 1500 and first.throttled_samples == 1  # idle alone is not
    # Raw samples older than an hour are gone, newer ones stay for the live charts.
    cutoff = now - timedelta(minutes=settings.TELEMETRY_RAW_RETENTION_MINUTES)
    assert not GpuSample.objects.filter(time__lt=cutoff).exists()
    assert GpuSample.objects.filter(time__gte=cutoff).count() == 6 * 60 + 1  # both ends
    assert not GpuSampleMinute.objects.filter(pk=ancient.pk).exists()
    # Again: nothing is counted twice.
    again = telemetry.downsample_telemetry(now)
    assert GpuSampleMinute.objects.get(gpu=gpu, minute=base).samples == 6
    assert again["raw_deleted"] == 0


def test_a_paused_downsampler_loses_no_samples():
    """Raw rows are only deleted once they are folded into minutes, however long beat slept."""
    host = make_host()
    inventory.refresh_inventory(host, INVENTORY)
    gpu = Gpu.objects.get(uuid="GPU-aaaa-0")
    now = timezone.now().replace(second=0, microsecond=0)
    GpuSampleMinute.objects.create(gpu=gpu, minute=now - timedelta(hours=3), samples=1)
    GpuSample.objects.bulk_create(
        [sample_at(gpu, now - timedelta(hours=2, minutes=m), 40, 200) for m in range(3)]
    )
    telemetry.downsample_telemetry(now)
    assert GpuSampleMinute.objects.filter(gpu=gpu).count() == 4
    assert GpuSample.objects.count() == 0
