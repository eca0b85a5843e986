"""The ITL p95's noise band (issue 37, "Verdicts that know when they can't judge"): the load
generator's batch-means standard error, checked against the spread of the p95 over many
simulated runs of the same load, and how a verdict uses it."""

from __future__ import annotations

import math
import random
import statistics

from benchmarks.loadgen.stats import RequestRecord, itl_p95_standard_error, percentile, summarize
from changes import verdict


def record(index: int, gaps: list[float]) -> RequestRecord:
    times = [0.1]
    for gap in gaps:
        times.append(times[-1] + gap)
    return RequestRecord(
        index=index,
        stage="main",
        warmup=False,
        input_len=64,
        max_tokens=len(gaps) + 1,
        scheduled=index * 0.01,
        sent=index * 0.01,
        first_token=times[0],
        chunk_times=times,
        end=times[-1],
        output_tokens=len(times),
        status=200,
    )


def one_run(rng: random.Random, requests: int, tokens: int, per_request_sd: float):
    """A run's records: each request decodes at its own pace (a batch it shared, a long
    prompt beside it: ``per_request_sd``), its gaps scattered around that pace."""
    out = []
    for i in range(requests):
        pace = 0.020 * math.exp(rng.gauss(0, per_request_sd))
        out.append(record(i, [pace * rng.expovariate(1.0) ** 0.3 for _ in range(tokens)]))
    return out


def pooled_p95(records) -> float:
    return percentile(sorted(x * 1000 for r in records for x in r.itls), 95)


def test_the_standard_error_matches_the_spread_of_the_p95_over_runs():
    rng = random.Random(37)
    for per_request_sd in (0.0, 0.3):  # independent gaps, then gaps correlated by request
        runs = [one_run(rng, 200, 30, per_request_sd) for _ in range(60)]
        spread = statistics.stdev(pooled_p95(run) for run in runs)
        estimated = statistics.mean(itl_p95_standard_error(run) for run in runs)
        assert 0.6 * spread < estimated < 1.6 * spread, (per_request_sd, spread, estimated)


def test_correlated_gaps_widen_the_band_as_they_should():
    """The count of gaps would make a correlated run's band as narrow as an independent one's;
    batches of whole requests do not."""
    rng = random.Random(7)
    independent = statistics.mean(
        itl_p95_standard_error(one_run(rng, 200, 30, 0.0)) for _ in range(10)
    )
    correlated = statistics.mean(
        itl_p95_standard_error(one_run(rng, 200, 30, 0.3)) for _ in range(10)
    )
    assert correlated > 2 * independent


def test_too_few_requests_give_no_estimate_and_the_summary_carries_it():
    rng = random.Random(1)
    assert itl_p95_standard_error(one_run(rng, 24, 10, 0.1)) is None  # 4 batches of 5
    assert itl_p95_standard_error(one_run(rng, 25, 10, 0.1)) is not None
    # One-token answers have no gap: they are not counted.
    assert itl_p95_standard_error([record(i, []) for i in range(100)]) is None
    records = one_run(rng, 100, 10, 0.1)
    assert summarize(records)["p95_itl_se_ms"] == itl_p95_standard_error(records) > 0
    assert summarize(one_run(rng, 10, 10, 0.1))["p95_itl_se_ms"] is None


def test_estimate_interval():
    assert verdict.estimate_interval(20.0, 1.0) == (20.0 - verdict.NOISE_Z, 20.0 + verdict.NOISE_Z)
    assert verdict.estimate_interval(None, 1.0) is None
    assert verdict.estimate_interval(20.0, None) is None
    assert verdict.estimate_interval(20.0, math.nan) is None
    low, high = verdict.estimate_interval(2.0, 5.0)
    assert 0 < low < 2.0 < high  # never down to zero or below: the band's ratios are taken


THRESHOLDS = verdict.Thresholds(0.01, 0.10, 0.10)


def test_an_itl_band_wider_than_the_limit_cannot_judge_and_a_narrow_one_judges():
    base = {"error_rate": 0.0, "ttft_p95_ms": 100.0, "itl_p95_ms": 20.0}
    after = {"error_rate": 0.0, "ttft_p95_ms": 100.0, "itl_p95_ms": 21.0}  # +5 %
    conditions = ({"requests": 200, "run": 1}, {"requests": 200, "run": 2})
    wide = verdict.verdict(
        base,
        after,
        THRESHOLDS,
        conditions,
        noise={"itl_p95_ms": (verdict.estimate_interval(20, 2), verdict.estimate_interval(21, 2))},
    )
    assert wide["outcome"] == "inconclusive" and wide["measure_more"], wide
    assert "cannot judge ITL p95" in wide["reason"] and "spans the limit +10%" in wide["reason"]
    narrow = verdict.verdict(
        base,
        after,
        THRESHOLDS,
        conditions,
        noise={
            "itl_p95_ms": (verdict.estimate_interval(20, 0.1), verdict.estimate_interval(21, 0.1))
        },
    )
    assert narrow["outcome"] == "verified", narrow
