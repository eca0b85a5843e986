"""The minute roll-up and retention (hosts.services.telemetry_sql): aggregates equal to a
plain Python computation over random samples, on either backend (PostgreSQL runs the one
``INSERT … SELECT … GROUP BY``, SQLite the ORM fallback), the SQL path equal to the ORM path,
idempotent, and retention deletes in bounded chunks that remove exactly the old rows."""

import random
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from hosts.models import GpuSample, GpuSampleMinute
from hosts.models_telemetry import THROTTLE_REASONS
from hosts.services import telemetry, telemetry_sql
from tests.factories import make_gpu, make_host

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

BASE = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def maybe(rng, value, none_share=0.15):
    return None if rng.random() < none_share else value


def random_samples(gpus, minutes=3, seed=7):
    """Irregular samples (some seconds missing, some values missing) over ``minutes``."""
    rng = random.Random(seed)
    samples = []
    for gpu in gpus:
        for second in range(minutes * 60):
            if rng.random() < 0.2:
                continue
            samples.append(
                GpuSample(
                    gpu=gpu,
                    time=BASE + timedelta(seconds=second, microseconds=rng.randrange(10**6)),
                    utilization_pct=maybe(rng, rng.uniform(0, 100)),
                    memory_used_bytes=maybe(rng, rng.randrange(80 * 2**30)),
                    power_w=maybe(rng, rng.uniform(50, 700)),
                    power_limit_w=maybe(rng, rng.choice([500.0, 700.0])),
                    temperature_c=maybe(rng, rng.uniform(30, 90)),
                    sm_clock_mhz=maybe(rng, rng.randrange(300, 1981)),
                    mem_clock_mhz=maybe(rng, rng.randrange(1000, 2620)),
                    clocks_event_reasons=maybe(rng, rng.choice([0, 1, 4, 5, 8, 0x24, 0xC0, 0x11])),
                    pcie_tx_kbps=maybe(rng, rng.uniform(0, 1e6)),
                    pcie_rx_kbps=maybe(rng, rng.uniform(0, 1e6)),
                )
            )
    GpuSample.objects.bulk_create(samples)
    return samples


def expected_minutes(samples):
    """The roll-up computed in Python: per GPU and minute."""
    groups = {}
    for s in samples:
        groups.setdefault((s.gpu_id, s.time.replace(second=0, microsecond=0)), []).append(s)

    def values(rows, name):
        return [getattr(r, name) for r in rows if getattr(r, name) is not None]

    def avg(rows, name):
        v = values(rows, name)
        return sum(v) / len(v) if v else None

    def top(rows, name, f=max):
        v = values(rows, name)
        return f(v) if v else None

    out = {}
    for key, rows in groups.items():
        masks = values(rows, "clocks_event_reasons")
        out[key] = {
            "samples": len(rows),
            "utilization_avg": avg(rows, "utilization_pct"),
            "utilization_max": top(rows, "utilization_pct"),
            "memory_used_max": top(rows, "memory_used_bytes"),
            "power_avg": avg(rows, "power_w"),
            "power_max": top(rows, "power_w"),
            "power_limit_max": top(rows, "power_limit_w"),
            "temperature_max": top(rows, "temperature_c"),
            "sm_clock_avg": avg(rows, "sm_clock_mhz"),
            "sm_clock_min": top(rows, "sm_clock_mhz", min),
            "sm_clock_max": top(rows, "sm_clock_mhz"),
            "mem_clock_avg": avg(rows, "mem_clock_mhz"),
            "pcie_tx_avg": avg(rows, "pcie_tx_kbps"),
            "pcie_tx_max": top(rows, "pcie_tx_kbps"),
            "pcie_rx_avg": avg(rows, "pcie_rx_kbps"),
            "pcie_rx_max": top(rows, "pcie_rx_kbps"),
            "throttled_samples": sum(1 for m in masks if m > 1),
            "reason_samples": len(masks),
            **{
                f"throttle_{k}": sum(1 for m in masks if m & bit) for k, bit, _w in THROTTLE_REASONS
            },
        }
    return out


def stored_minutes():
    return {
        (m.gpu_id, m.minute): {f: getattr(m, f) for f in telemetry_sql.MINUTE_FIELDS}
        for m in GpuSampleMinute.objects.all()
    }


def assert_same(got, want):
    assert got.keys() == want.keys()
    for key, fields in want.items():
        for name, value in fields.items():
            if isinstance(value, float):
                assert got[key][name] == pytest.approx(value, rel=1e-9), (key, name)
            else:
                assert got[key][name] == value, (key, name)


def three_gpus():
    host = make_host()
    return [make_gpu(host, index=i) for i in range(3)]


def test_the_roll_up_equals_a_python_computation_over_random_samples():
    samples = random_samples(three_gpus())
    # The last minute is the one still filling: not folded.
    written = telemetry_sql.roll_up(None, BASE + timedelta(minutes=2))
    want = {
        k: v for k, v in expected_minutes(samples).items() if k[1] < BASE + timedelta(minutes=2)
    }
    assert written == len(want) == 6
    assert_same(stored_minutes(), want)


def test_the_roll_up_is_idempotent_and_recomputes_a_minute_with_late_samples():
    gpus = three_gpus()
    samples = random_samples(gpus, minutes=2, seed=11)
    end = BASE + timedelta(minutes=2)
    telemetry_sql.roll_up(None, end)
    first = stored_minutes()
    telemetry_sql.roll_up(BASE, end)  # the same minutes again: replaced, not added
    assert stored_minutes() == first
    late = GpuSample(gpu=gpus[0], time=BASE + timedelta(seconds=59), utilization_pct=100.0)
    GpuSample.objects.bulk_create([late])
    telemetry_sql.roll_up(BASE, end)
    assert_same(stored_minutes(), expected_minutes([*samples, late]))
    assert GpuSampleMinute.objects.count() == 6


def test_downsampling_starts_at_the_newest_minute_and_leaves_the_filling_one():
    samples = random_samples(three_gpus(), minutes=3, seed=3)
    now = BASE + timedelta(minutes=2, seconds=30)
    telemetry.downsample_telemetry(now)
    want = expected_minutes(samples)
    assert_same(
        stored_minutes(), {k: v for k, v in want.items() if k[1] < BASE + timedelta(minutes=2)}
    )
    telemetry.downsample_telemetry(now + timedelta(minutes=1))
    assert_same(stored_minutes(), want)


# --- retention -----------------------------------------------------------------------------------
def deletes(captured):
    return [q for q in captured.captured_queries if q["sql"].startswith("DELETE")]


def test_retention_deletes_exactly_the_old_rows_in_bounded_chunks():
    gpu = three_gpus()[0]
    cutoff = BASE + timedelta(minutes=30)
    old = [GpuSample(gpu=gpu, time=cutoff - timedelta(seconds=s + 1)) for s in range(23)]
    kept = [GpuSample(gpu=gpu, time=cutoff + timedelta(seconds=s)) for s in range(5)]  # incl. ==
    GpuSample.objects.bulk_create(old + kept)
    with CaptureQueriesContext(connection) as captured:
        deleted = telemetry_sql.delete_before(GpuSample, "time", cutoff, chunk=5)
    assert deleted == 23
    assert len(deletes(captured)) == 5  # 5 + 5 + 5 + 5 + 3: never more than 5 a statement
    assert sorted(GpuSample.objects.values_list("time", flat=True)) == [s.time for s in kept]


def test_downsampling_deletes_old_samples_and_old_minutes_in_chunks(settings):
    settings.TELEMETRY_DELETE_CHUNK = 4
    settings.TELEMETRY_RAW_RETENTION_MINUTES = 60
    settings.TELEMETRY_MINUTE_RETENTION_DAYS = 30
    gpu = three_gpus()[0]
    now = timezone.now().replace(microsecond=0)
    this_minute = now.replace(second=0)
    GpuSampleMinute.objects.create(gpu=gpu, minute=this_minute - timedelta(hours=3), samples=1)
    old = [GpuSample(gpu=gpu, time=now - timedelta(minutes=61 + m)) for m in range(9)]
    fresh = [GpuSample(gpu=gpu, time=now - timedelta(minutes=m)) for m in range(1, 5)]
    GpuSample.objects.bulk_create(old + fresh)
    GpuSampleMinute.objects.bulk_create(
        [
            GpuSampleMinute(
                gpu=gpu, minute=this_minute - timedelta(days=30, minutes=1 + m), samples=1
            )
            for m in range(6)
        ]
    )
    result = telemetry.downsample_telemetry(now)
    assert result["raw_deleted"] == 9 and result["minutes_deleted"] == 6
    assert GpuSample.objects.count() == 4
    assert not GpuSampleMinute.objects.filter(minute__lt=now - timedelta(days=30)).exists()
    # Every raw sample was folded before it went: 9 old minutes + 4 fresh ones + the
    # 3-hour-old minute, which stays.
    assert GpuSampleMinute.objects.filter(minute__gte=now - timedelta(days=1)).count() == 14
