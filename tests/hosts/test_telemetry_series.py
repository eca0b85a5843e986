"""Telemetry charts' data: the minute aggregates keep clocks, PCIe and each throttle reason;
the series of a range come from the right store, bucketed in SQL on known data, in a bounded
number of queries. Runs on SQLite and (with DATABASE_URL) PostgreSQL."""

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from hosts.models import GpuSample, GpuSampleHour, GpuSampleMinute
from hosts.models_telemetry import THROTTLE_REASONS
from hosts.services import telemetry, telemetry_series
from tests.factories import make_gpu, make_host

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

NOW = datetime(2026, 3, 2, 12, 0, 0, tzinfo=UTC)
SW_POWER_CAP, HW_SLOWDOWN, HW_THERMAL, IDLE = 0x4, 0x8, 0x40, 0x1


def sample(gpu, t, **kw):
    data = dict(
        utilization_pct=50.0,
        memory_used_bytes=10 * 2**30,
        power_w=300.0,
        power_limit_w=700.0,
        temperature_c=60.0,
        sm_clock_mhz=1980,
        mem_clock_mhz=2619,
        clocks_event_reasons=0,
        pcie_tx_kbps=1000.0,
        pcie_rx_kbps=3000.0,
    )
    data.update(kw)
    return GpuSample(gpu=gpu, time=t, **data)


def test_the_model_move_keeps_every_import():
    from hosts import models, models_telemetry

    assert models.GpuSample is models_telemetry.GpuSample
    assert models.GpuSampleMinute is models_telemetry.GpuSampleMinute
    assert GpuSample._meta.app_label == "hosts" and GpuSample._meta.db_table == "hosts_gpusample"
    assert GpuSampleMinute._meta.db_table == "hosts_gpusampleminute"


def test_minute_aggregates_keep_clocks_pcie_and_each_throttle_reason():
    gpu = make_gpu(make_host())
    minute = NOW - timedelta(minutes=2)
    reasons = [SW_POWER_CAP] * 3 + [SW_POWER_CAP | HW_THERMAL] + [IDLE] * 2 + [None] * 2
    GpuSample.objects.bulk_create(
        sample(
            gpu,
            minute + timedelta(seconds=i),
            sm_clock_mhz=1000 + 100 * i,
            mem_clock_mhz=2000 + 10 * i,
            pcie_tx_kbps=1000.0 * (i + 1),
            pcie_rx_kbps=500.0,
            power_limit_w=600.0 + i,
            clocks_event_reasons=r,
        )
        for i, r in enumerate(reasons)
    )
    telemetry.downsample_telemetry(now=NOW)
    row = GpuSampleMinute.objects.get(gpu=gpu, minute=minute)
    assert row.samples == 8 and row.reason_samples == 6
    assert row.throttle_sw_power_cap == 4 and row.throttle_hw_thermal == 1
    assert row.throttle_hw_slowdown == row.throttle_sync_boost == 0
    assert row.throttle_sw_thermal == row.throttle_power_brake == 0
    assert row.throttled_samples == 4
    assert row.sm_clock_min == 1000 and row.sm_clock_max == 1700 and row.sm_clock_avg == 1350
    assert row.mem_clock_avg == pytest.approx(2035)
    assert row.pcie_tx_avg == pytest.approx(4500) and row.pcie_tx_max == 8000
    assert row.pcie_rx_avg == row.pcie_rx_max == 500
    assert row.power_limit_max == 607


def test_ranges_pick_their_store_and_bucket_size(settings):
    settings.TELEMETRY_RAW_RETENTION_MINUTES = 60
    w = {
        name: telemetry_series.window_for_request({"range": name}, NOW)
        for name in telemetry_series.RANGES
    }
    assert (w["10m"].source, w["10m"].bucket_s) == ("raw", 1)
    assert (w["1h"].source, w["1h"].bucket_s) == ("raw", 6)
    assert (w["24h"].source, w["24h"].bucket_s) == ("minute", 180)
    assert (w["7d"].source, w["7d"].bucket_s) == ("minute", 1020)
    assert (w["30d"].source, w["30d"].bucket_s) == ("hour", 7200)
    assert (w["1y"].source, w["1y"].bucket_s) == ("hour", 15 * 3600)
    for window in w.values():
        span = (window.end - window.start).total_seconds()
        assert span / window.bucket_s <= telemetry_series.MAX_POINTS
    # Raw samples kept only half an hour: the hour comes from the minutes.
    settings.TELEMETRY_RAW_RETENTION_MINUTES = 30
    assert telemetry_series.window_for_request({"range": "1h"}, NOW).source == "minute"
    # Minutes kept three days: a week comes from the hours.
    settings.TELEMETRY_MINUTE_RETENTION_DAYS = 3
    seven = telemetry_series.window_for_request({"range": "7d"}, NOW)
    assert (seven.source, seven.bucket_s) == ("hour", 3600)
    assert telemetry_series.window_for_request({}, NOW).range == "10m"


def test_a_zoomed_window_reads_the_finest_store_that_holds_it(settings):
    settings.TELEMETRY_RAW_RETENTION_MINUTES = 60
    ms = lambda d: str(int(d.timestamp() * 1000))  # noqa: E731
    recent = telemetry_series.window_for_request(
        {"start": ms(NOW - timedelta(minutes=5)), "end": ms(NOW - timedelta(minutes=2))}, NOW
    )
    assert (recent.source, recent.bucket_s) == ("raw", 1)
    old = telemetry_series.window_for_request(
        {"start": ms(NOW - timedelta(hours=30)), "end": ms(NOW - timedelta(hours=20))}, NOW
    )
    assert (old.source, old.bucket_s) == ("minute", 60)
    months = telemetry_series.window_for_request(
        {"start": ms(NOW - timedelta(days=90)), "end": ms(NOW - timedelta(days=60))}, NOW
    )
    assert (months.source, months.bucket_s) == ("hour", 7200)
    settings.TELEMETRY_HOUR_RETENTION_DAYS = 30
    with pytest.raises(telemetry_series.BadSeriesRequest, match="before the oldest"):
        telemetry_series.window_for_request(
            {"start": ms(NOW - timedelta(days=90)), "end": ms(NOW - timedelta(days=60))}, NOW
        )
    for bad in (
        {"start": "x", "end": ms(NOW)},
        {"start": ms(NOW)},
        {"start": ms(NOW), "end": ms(NOW)},
    ):
        with pytest.raises(telemetry_series.BadSeriesRequest):
            telemetry_series.window_for_request(bad, NOW)


def test_one_hour_of_raw_samples_is_averaged_in_six_second_buckets(settings):
    settings.TELEMETRY_RAW_RETENTION_MINUTES = 60
    gpu = make_gpu(make_host())
    window = telemetry_series.window_for_request({"range": "1h"}, NOW)
    start = window.start
    # Two buckets of six samples each: utilisation 0..5 and 60..65, power-capped in half of
    # the second bucket, PCIe TX 6000 kB/s.
    GpuSample.objects.bulk_create(
        [sample(gpu, start + timedelta(seconds=i), utilization_pct=float(i)) for i in range(6)]
        + [
            sample(
                gpu,
                start + timedelta(seconds=60 + i),
                utilization_pct=60.0 + i,
                temperature_c=70.0 + i,
                clocks_event_reasons=SW_POWER_CAP if i % 2 else IDLE,
                pcie_tx_kbps=6000.0,
            )
            for i in range(6)
        ]
    )
    data = telemetry_series.host_series(gpu.host, window)
    s = data["gpus"][gpu.pk]
    assert data["source"] == "raw" and data["bucket_s"] == 6 and data["empty"] is None
    assert s["t"] == [int(start.timestamp() * 1000), int((start.timestamp() + 60) * 1000)]
    assert s["utilization"] == [2.5, 62.5]
    assert s["temperature_c"] == [60.0, 75.0]
    assert s["throttle"]["sw_power_cap"] == [0.0, 0.5] and s["throttle"]["hw_thermal"] == [0, 0]
    assert s["pcie_tx_mbs"] == [1.0, 6.0] and s["pcie_rx_mbs"] == [3.0, 3.0]
    assert s["sm_clock_mhz"] == [1980, 1980] and s["mem_clock_mhz"] == [2619, 2619]
    assert s["power_w"] == [300.0, 300.0] and s["power_limit_w"] == [700.0, 700.0]
    assert s["memory_gib"] == [10.0, 10.0]
    labels = [r["label"] for r in data["throttle_reasons"]]
    assert labels == [words for _key, _bit, words in THROTTLE_REASONS]


def test_seven_days_come_from_minutes_in_buckets_with_shares_weighted_by_samples():
    gpu = make_gpu(make_host())
    window = telemetry_series.window_for_request({"range": "7d"}, NOW)
    base = window.start
    # Three minutes in the first 17-minute bucket, one in a bucket three days later.
    GpuSampleMinute.objects.bulk_create(
        [
            GpuSampleMinute(
                gpu=gpu,
                minute=base + timedelta(minutes=m),
                samples=60,
                utilization_avg=u,
                memory_used_max=mem * 2**30,
                power_avg=200.0,
                power_limit_max=700.0,
                temperature_max=t,
                sm_clock_avg=1500.0,
                mem_clock_avg=2600.0,
                pcie_tx_avg=2000.0,
                pcie_rx_avg=4000.0,
                reason_samples=60,
                throttle_hw_slowdown=hw,
            )
            for m, u, mem, t, hw in (
                (0, 10.0, 5, 50.0, 0),
                (1, 20.0, 7, 55.0, 30),
                (2, 30.0, 6, 52.0, 60),
            )
        ]
        + [
            GpuSampleMinute(
                gpu=gpu,
                minute=base + timedelta(days=3),
                samples=60,
                utilization_avg=90.0,
                reason_samples=0,
            )
        ]
    )
    data = telemetry_series.host_series(gpu.host, window)
    s = data["gpus"][gpu.pk]
    assert data["source"] == "minute" and data["bucket_s"] == 1020
    assert s["t"] == [
        int(base.timestamp() * 1000),
        int((base + timedelta(days=3)).timestamp() * 1000),
    ]
    assert s["utilization"] == [20.0, 90.0]
    assert s["memory_gib"] == [7.0, None] and s["temperature_c"] == [55.0, None]
    assert s["throttle"]["hw_slowdown"] == [0.5, None]
    assert s["pcie_tx_mbs"] == [2.0, None] and s["pcie_rx_mbs"] == [4.0, None]


def test_a_range_with_no_minutes_yet_says_so(client, viewer):
    host = make_host()
    make_gpu(host)
    client.force_login(viewer)
    data = client.get(reverse("hosts:telemetry", args=[host.pk]), {"range": "24h"}).json()
    assert data["source"] == "minute"
    assert data["empty"].startswith("no minute aggregates in this window yet")


def test_a_bad_range_or_window_is_a_400_that_says_why(client, viewer):
    host = make_host()
    client.force_login(viewer)
    url = reverse("hosts:telemetry", args=[host.pk])
    response = client.get(url, {"range": "2y"})
    assert response.status_code == 400
    assert response.json()["error"] == "range must be one of 10m, 1h, 24h, 7d, 30d, 1y (got '2y')"
    response = client.get(url, {"start": "soon", "end": "later"})
    assert response.status_code == 400 and "milliseconds" in response.json()["error"]
    assert client.get(url, {"range": "7d"}).status_code == 200


@pytest.mark.parametrize("gpus", [1, 8])
def test_queries_do_not_grow_with_gpus(client, viewer, gpus, django_assert_max_num_queries):
    host = make_host()
    now = datetime.now(UTC)
    for _ in range(gpus):
        gpu = make_gpu(host)
        GpuSample.objects.bulk_create(sample(gpu, now - timedelta(seconds=s)) for s in range(1, 30))
        GpuSampleMinute.objects.create(gpu=gpu, minute=now - timedelta(hours=2), samples=60)
        GpuSampleHour.objects.create(gpu=gpu, hour=now - timedelta(hours=3), samples=3600)
    client.force_login(viewer)
    url = reverse("hosts:telemetry", args=[host.pk])
    for name in telemetry_series.RANGES:
        # Session, user, permissions, host, GPUs, buckets.
        with django_assert_max_num_queries(7):
            data = client.get(url, {"range": name}).json()
        assert len(data["gpus"]) == gpus
        assert all(s["t"] for s in data["gpus"].values()), name
