"""Distributed shards: the split covers the schedule once, the merge is exact, clocks are
corrected, a failing shard fails the run (issue 22)."""

import math
import multiprocessing
import random
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from benchmarks.loadgen import LoadSpec, Stage
from benchmarks.loadgen.distributed import (
    ClockOffset,
    ShardFailed,
    estimate_offset,
    merge_reports,
    run_shard,
    shard_indices,
)
from benchmarks.loadgen.stats import RequestRecord, summarize


def _spec(url="http://x:1", **kw):
    return LoadSpec(
        base_url=url,
        model="fixed-latency",
        stages=(
            Stage("a", concurrency=None, request_rate=200.0, num_requests=37),
            Stage("b", concurrency=None, request_rate=300.0, num_requests=23),
        ),
        **kw,
    )


@pytest.mark.parametrize("shards", [1, 2, 3, 7, 16])
def test_split_is_exact(shards):
    spec = _spec()
    whole = shard_indices(spec, 0, 1)
    parts = [shard_indices(spec, s, shards) for s in range(shards)]
    union = [item for part in parts for item in part]
    assert len(union) == len(whole) == 60  # no duplicates, nothing missing
    assert sorted(union) == sorted(whole)  # same numbers, same scheduled offsets
    for s, part in enumerate(parts):
        assert all(index % shards == s or index >= 37 for index, _ in part)


def _record(rng, index, base):
    sent = base + rng.uniform(0, 5)
    ok = rng.random() > 0.1
    first = sent + rng.expovariate(20) if ok else None
    chunks = [first + 0.004 * k for k in range(rng.randint(1, 6))] if ok else []
    return RequestRecord(
        index=index,
        stage="a",
        warmup=False,
        input_len=10,
        max_tokens=8,
        scheduled=sent - rng.uniform(0, 0.01),
        sent=sent,
        first_token=first,
        chunk_times=chunks,
        end=(chunks[-1] if chunks else sent + 0.01),
        output_tokens=len(chunks),
        status=200 if ok else 500,
        error_class=None if ok else "http_500",
        error="" if ok else "boom",
    )


def _report(shard, records, epoch):
    return {
        "shard": shard,
        "hostname": f"h{shard}",
        "epoch_wall": epoch,
        "offset_s": 0.0,
        "offset_uncertainty_s": 0.001,
        "records": [r.to_dict() for r in records],
        "timeline": [],
        "sent": len(records),
        "done": 0,
        "failed": 0,
        "late_p99_ms": 1.0,
        "error": None,
    }


@pytest.mark.parametrize("seed", range(20))
def test_merge_is_exact(seed):
    rng = random.Random(seed)
    shards = rng.randint(2, 6)
    records = [_record(rng, i, 1_700_000_000.0) for i in range(rng.randint(1, 300))]
    reports = [
        _report(s, [r for r in records if r.index % shards == s], 1_700_000_000.0)
        for s in range(shards)
    ]
    merged = merge_reports(reports, shards)
    single = summarize(records)
    # The same numbers, not approximately: one process over the same records.
    for key, value in single.items():
        got = merged["summary"][key]
        assert got == value or (isinstance(value, float) and math.isnan(value) and math.isnan(got))


def test_timelines_add_up_per_second():
    reports = []
    # Shard 1 starts 1.2 s later: its ticks fall one second further on.
    for shard, epoch in enumerate([100.0, 101.2]):
        report = _report(shard, [], epoch)
        report["timeline"] = [
            {"t": t, "t_wall": epoch + t, "completed": 10 * t, "requests_per_s": 10 + shard}
            for t in (1.0, 2.0, 3.0)
        ]
        reports.append(report)
    merged = merge_reports(reports, 2)["timeline"]
    assert [p["requests_per_s"] for p in merged] == [10, 21, 21, 11]
    assert sum(p["requests_per_s"] for p in merged) == 3 * 10 + 3 * 11
    # Cumulative counts carry over: shard 1 has not ticked in second 1, shard 0 is done by 4.
    assert [p["completed"] for p in merged] == [10, 30, 50, 60]


def test_offset_takes_the_shortest_round_trip():
    # The reference is 2.5 s ahead; the queued samples would say otherwise.
    samples = [(10.0, 12.9, 10.6), (20.0, 22.51, 20.02), (30.0, 33.0, 30.4)]
    offset = estimate_offset(samples)
    assert offset.offset_s == pytest.approx(2.5)
    assert offset.uncertainty_s == pytest.approx(0.01)
    assert offset.samples == 3


def test_failing_or_missing_shard_fails_the_merge():
    ok = _report(0, [], 1.0)
    with pytest.raises(ShardFailed, match="shard 1: ConnectError: refused"):
        merge_reports([ok, {"shard": 1, "error": "ConnectError: refused"}], 2)
    with pytest.raises(ShardFailed, match=r"shard\(s\) \[1\] sent no result"):
        merge_reports([ok], 2)


class _SkewedClock:
    def __init__(self, skew):
        self.skew = skew

    def __call__(self):
        return time.time() - self.skew


def _skewed_shard(spec, number, start_at, skew):
    clock = _SkewedClock(skew)
    offset = estimate_offset([(clock(), time.time(), clock())])
    return offset, run_shard(spec, number, 2, start_at, offset, f"w{number}", clock)


@pytest.mark.timing
def test_two_shards_against_the_test_server_with_skewed_clocks(fixed_server):
    """Two shards whose clocks disagree by 3 s still start together and merge on one base."""
    server = fixed_server(ttft_ms=20, itl_ms=2)
    spec = _spec(server.url)
    start_at = time.time() + 3.0
    # Shard 1's clock is 3 s slow and its measured offset says so: without the correction it
    # would start 3 s late and its records would sit 3 s before shard 0's.
    # Separate processes, as Celery workers are (one event loop and transport each).
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=context) as pool:
        futures = [
            pool.submit(_skewed_shard, spec, n, start_at, s) for n, s in ((0, 0.0), (1, 3.0))
        ]
        outcomes = [f.result(timeout=120) for f in futures]
    offsets = [o for o, _ in outcomes]
    reports = [r for _, r in outcomes]
    assert all(r is not None and r["error"] is None for r in reports), reports
    assert [o.offset_s for o in offsets] == [pytest.approx(0.0, abs=0.01), pytest.approx(3.0)]
    # Both started at the shared time, on the reference clock (generous: a loaded machine).
    for report in reports:
        assert start_at - 0.05 <= report["epoch_wall"] < start_at + 1.0
    first_sent = [min(d["sent"] for d in r["records"]) for r in reports]
    assert abs(first_sent[0] - first_sent[1]) < 1.0  # not 3 s apart
    merged = merge_reports(reports, 2)
    assert merged["summary"]["completed"] == 60, [
        (d["index"], d["error"]) for r in reports for d in r["records"] if d["error_class"]
    ]
    assert sorted(r.index for r in merged["records"]) == list(range(60))
    assert merged["summary"]["median_ttft_ms"] >= 20
    assert [s["hostname"] for s in merged["shards"]] == ["w0", "w1"]
    assert [s["sent"] for s in merged["shards"]] == [19 + 12, 18 + 11]


def test_shard_failure_is_reported_with_its_reason():
    # Nothing listens on port 9: the shard's engine never becomes ready.
    spec = _spec("http://127.0.0.1:9", ready_timeout_s=1.0)
    report = run_shard(spec, 0, 2, time.time(), ClockOffset(0.0, 0.0, 1))
    assert "LoadGenError" in report["error"], report
    with pytest.raises(ShardFailed, match="shard 0"):
        merge_reports([report, report | {"shard": 1, "error": None}], 2)
