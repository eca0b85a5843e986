"""The metric registry: every list of a run's numbers derives from it, so it must agree with
the run's columns, their indexes and the load generator's summary names."""

from __future__ import annotations

from django.db import models

from benchmarks import metrics
from benchmarks.loadgen.stats import RequestRecord, summarize
from benchmarks.models import BenchmarkRun
from benchmarks.services import history


def request(index: int) -> RequestRecord:
    start = index * 0.1
    return RequestRecord(
        index=index,
        stage="main",
        warmup=False,
        input_len=100,
        max_tokens=10,
        scheduled=start,
        sent=start,
        first_token=start + 0.05,
        chunk_times=[start + 0.05, start + 0.06, start + 0.08],
        end=start + 0.08,
        output_tokens=3,
        status=200,
    )


def test_every_metric_is_a_number_column_of_a_run_and_named_once():
    keys = [metric.key for metric in metrics.METRICS]
    assert len(keys) == len(set(keys)) and set(keys) == set(metrics.BY_KEY)
    for metric in metrics.METRICS:
        field = BenchmarkRun._meta.get_field(metric.key)
        integer = isinstance(field, models.PositiveIntegerField | models.PositiveBigIntegerField)
        assert integer == metric.integer, metric.key
        assert metric.better in (metrics.LOWER, metrics.HIGHER, None)


def test_the_summary_names_are_the_load_generators():
    summary = summarize([request(i) for i in range(20)], slo={"ttft": 1000})
    assert {m.summary_key for m in metrics.RECORDED} <= set(summary)
    assert all(m.summary_key for m in metrics.METRICS if m.key != "cost_per_million_output")
    ttft_p95 = metrics.BY_KEY["ttft_p95_ms"]
    assert (ttft_p95.summary_key, ttft_p95.latency, ttft_p95.percentile) == (
        "p95_ttft_ms",
        metrics.TTFT,
        95,
    )
    assert metrics.BY_KEY["itl_p50_ms"].summary_key == "median_itl_ms"
    assert [lat.distribution for lat in metrics.LATENCIES] == [
        "ttft_ms",
        "itl_ms",
        "tpot_ms",
        "e2el_ms",
    ]


def test_each_history_column_is_sortable_and_indexed():
    indexes = {index.name for index in BenchmarkRun._meta.indexes}
    for metric in metrics.HISTORY:
        assert f"run_{metric.key}" in indexes
        assert history.SORTS[metric.key] == (metric.key, metric.short)
    assert list(history.SORTS) == ["date", *(m.key for m in metrics.HISTORY)]
    # Throughput and goodput read best most-first; latencies, errors and cost least-first.
    assert history.DESCENDING_FIRST == {"date", "output_tokens_per_s", "goodput_share"}
    headings = [m.heading for m in metrics.HISTORY]
    assert headings[:3] == ["TTFT p50", "p95", "p99"] and headings[-1] == "Per 1M output"


def test_the_compare_text_of_a_number_and_a_share():
    assert metrics.BY_KEY["itl_p95_ms"].text(1234.56) == "1,234.6"
    assert metrics.BY_KEY["error_rate"].text(0.0234) == "2.3 %"
    assert metrics.BY_KEY["ttft_p95_ms"].text(None) == "—"
    assert [m.key for m in metrics.COMPARED][-3:] == ["completed", "failed", "duration_s"]
    assert "input_tokens_total" not in {m.key for m in metrics.COMPARED}


def test_numbers_of_a_run():
    run = BenchmarkRun(ttft_p95_ms=300.0, error_rate=0.01)
    wanted = metrics.pick("ttft_p95_ms", "error_rate")
    assert metrics.numbers(run, wanted) == {"ttft_p95_ms": 300.0, "error_rate": 0.01}
    assert metrics.numbers(None) == {}
