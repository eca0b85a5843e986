"""Hourly telemetry aggregates (hosts.services.telemetry_hours, issue 22): an hour is folded
from its minutes exactly (counts add, extremes stay extremes, averages weighted by samples),
once it has ended, again when late minutes come, a backlog a few hours a run; minutes are only
forgotten once in an hour; the 30 d charts read the hours. SQLite and (DATABASE_URL)
PostgreSQL."""

from datetime import UTC, datetime, timedelta

import pytest

from hosts.models import GpuSampleHour, GpuSampleMinute
from hosts.services import telemetry, telemetry_hours, telemetry_series
from tests.factories import make_gpu, make_host

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

H = datetime(2026, 3, 2, 10, 0, 0, tzinfo=UTC)  # an hour's start


def minute(gpu, at, **kw):
    data = dict(samples=60, reason_samples=60)
    data.update(kw)
    return GpuSampleMinute.objects.create(gpu=gpu, minute=at, **data)


def test_an_hour_is_its_minutes_folded_exactly():
    gpu, other = make_gpu(make_host()), make_gpu(make_host())
    minute(
        gpu, H, samples=60, utilization_avg=10.0, utilization_max=20.0, power_avg=100.0,
        memory_used_max=5 * 2**30, sm_clock_min=900, sm_clock_max=1900, throttled_samples=6,
        throttle_hw_slowdown=6, pcie_tx_avg=1000.0,
    )  # fmt: skip
    minute(
        gpu, H + timedelta(minutes=59), samples=30, utilization_avg=40.0, utilization_max=90.0,
        power_avg=400.0, memory_used_max=7 * 2**30, sm_clock_min=1200, sm_clock_max=1980,
        throttled_samples=30, throttle_hw_slowdown=15, reason_samples=20,
    )  # fmt: skip
    # A minute without a utilisation reading weighs nothing in its average.
    minute(gpu, H + timedelta(minutes=30), samples=60, utilization_avg=None, power_avg=100.0)
    minute(gpu, H + timedelta(hours=1), samples=60, utilization_avg=99.0)  # the next hour
    minute(other, H + timedelta(minutes=5), samples=60, utilization_avg=70.0)

    hours = {
        (h.gpu_id, h.hour): h for h in telemetry_hours.hour_aggregates(H, H + timedelta(hours=1))
    }
    assert set(hours) == {(gpu.pk, H), (other.pk, H)}
    h = hours[(gpu.pk, H)]
    assert h.samples == 150 and h.reason_samples == 140
    assert h.throttled_samples == 36 and h.throttle_hw_slowdown == 21
    assert h.utilization_avg == pytest.approx((10 * 60 + 40 * 30) / 90)
    assert h.power_avg == pytest.approx((100 * 60 + 400 * 30 + 100 * 60) / 150)
    assert h.utilization_max == 90.0 and h.memory_used_max == 7 * 2**30
    assert (h.sm_clock_min, h.sm_clock_max) == (900, 1980)
    assert h.pcie_tx_avg == pytest.approx(1000.0) and h.pcie_rx_avg is None
    assert hours[(other.pk, H)].utilization_avg == pytest.approx(70.0)


def test_an_hour_is_written_once_it_has_ended_and_again_for_late_minutes():
    gpu = make_gpu(make_host())
    minute(gpu, H, utilization_avg=10.0)
    minute(gpu, H + timedelta(minutes=58), utilization_avg=30.0)
    assert telemetry_hours.roll_up_hours(H + timedelta(minutes=59)) == 0  # still running
    assert telemetry_hours.roll_up_hours(H + timedelta(hours=1, seconds=5)) == 1
    assert GpuSampleHour.objects.get().utilization_avg == pytest.approx(20.0)
    assert telemetry_hours.folded_until() == H + timedelta(hours=1)
    # The hour's last minute is written late, and the next hour fills.
    minute(gpu, H + timedelta(minutes=59), utilization_avg=80.0)
    minute(gpu, H + timedelta(hours=1, minutes=3), utilization_avg=50.0)
    assert telemetry_hours.roll_up_hours(H + timedelta(hours=1, minutes=30)) == 0
    assert telemetry_hours.roll_up_hours(H + timedelta(hours=2, seconds=5)) == 2
    assert [(h.hour, round(h.utilization_avg, 3)) for h in GpuSampleHour.objects.all()] == [
        (H, 40.0),
        (H + timedelta(hours=1), 50.0),
    ]


def test_a_backlog_is_folded_a_few_hours_a_run_and_gaps_are_skipped():
    gpu = make_gpu(make_host())
    for hour in range(10):
        minute(gpu, H + timedelta(hours=hour), utilization_avg=float(hour))
    # A week without minutes (the fleet was empty), then one more hour.
    minute(gpu, H + timedelta(days=7), utilization_avg=7.0)
    now = H + timedelta(days=7, hours=1, minutes=1)
    assert telemetry_hours.roll_up_hours(now) == telemetry_hours.BACKLOG_HOURS
    assert telemetry_hours.roll_up_hours(now) == 5  # hours 6-9 and hour 5 again
    assert telemetry_hours.roll_up_hours(now) == 2  # the hour a week later, and hour 9 again
    assert telemetry_hours.roll_up_hours(now) == 0
    hours = list(GpuSampleHour.objects.values_list("hour", "utilization_avg"))
    assert hours == [(H + timedelta(hours=h), float(h)) for h in range(10)] + [
        (H + timedelta(days=7), 7.0)
    ]


def test_downsampling_forgets_minutes_only_once_they_are_in_an_hour(settings):
    settings.TELEMETRY_MINUTE_RETENTION_DAYS = 1
    settings.TELEMETRY_HOUR_RETENTION_DAYS = 2
    gpu = make_gpu(make_host())
    for hour in range(0, 10 * 24, 12):  # ten days of minutes, two a day
        minute(gpu, H + timedelta(hours=hour), utilization_avg=float(hour))
    now = H + timedelta(days=10)
    first = telemetry.downsample_telemetry(now)
    # Only the first six hours are folded this run: every later minute is kept, so none is
    # forgotten before it is in an hour, however far past retention.
    assert first["hours"] == 1 and first["minutes_deleted"] == 1
    assert GpuSampleMinute.objects.count() == 19
    for _ in range(40):
        telemetry.downsample_telemetry(now)
    assert GpuSampleHour.objects.filter(hour__lt=now - timedelta(days=2)).count() == 0
    assert GpuSampleHour.objects.count() == 4  # the last two days' minutes, each its hour
    assert not GpuSampleMinute.objects.filter(minute__lt=now - timedelta(days=1)).exists()


def test_thirty_days_are_charted_from_the_hours(client, viewer):
    host = make_host()
    gpu = make_gpu(host)
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    for days, util in ((20, 30.0), (2, 60.0)):
        GpuSampleHour.objects.create(
            gpu=gpu, hour=now - timedelta(days=days), samples=3600, utilization_avg=util,
            memory_used_max=2**30, reason_samples=3600, throttle_sw_thermal=900,
        )  # fmt: skip
    client.force_login(viewer)
    data = client.get(f"/hosts/{host.pk}/telemetry/", {"range": "30d"}).json()
    assert data["source"] == "hour" and data["bucket_s"] == 7200 and data["empty"] is None
    s = data["gpus"][str(gpu.pk)]
    assert s["utilization"] == [30.0, 60.0]
    assert s["throttle"]["sw_thermal"] == [0.25, 0.25]
    window = telemetry_series.window_for_request({"range": "1y"})
    assert window.source == "hour"


def test_hours_are_hours_of_utc_whatever_the_panels_time_zone(settings):
    settings.TIME_ZONE = "Asia/Kolkata"  # UTC+5:30: its hours begin at :30 UTC
    gpu = make_gpu(make_host())
    minute(gpu, H + timedelta(minutes=10), utilization_avg=10.0)
    minute(gpu, H + timedelta(minutes=50), utilization_avg=30.0)
    hours = telemetry_hours.hour_aggregates(H, H + timedelta(hours=1))
    assert [(h.hour, h.utilization_avg) for h in hours] == [(H, 20.0)]
