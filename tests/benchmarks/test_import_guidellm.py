"""Reading GuideLLM's benchmarks.json: a real file of GuideLLM 0.8.1 run against the simulator
(tests/benchmarks/fixtures/README.md says how it was made), checked against the file's own
numbers and GuideLLM's definitions (guidellm/schemas/base/request_stats.py,
guidellm/benchmark/schemas/metrics.py of 0.8.1)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from benchmarks import importers, importers_guidellm, records, resultstream
from benchmarks.loadgen.stats import percentile

FIXTURE = Path(__file__).parent / "fixtures" / "guidellm-0.8.1-benchmarks.json"


@pytest.fixture(scope="module")
def raw() -> dict:
    return json.loads(FIXTURE.read_text())


def successful(stats) -> dict:
    return stats["successful"]


def test_the_first_benchmark_of_a_sweep_by_default_with_the_others_listed(raw):
    got = importers.read(FIXTURE)
    assert got.kind == importers_guidellm.GUIDELLM
    assert got.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert got.label == "guidellm concurrent@1"
    first = raw["benchmarks"][0]
    assert got.date.timestamp() == pytest.approx(first["start_time"])
    assert "GuideLLM 0.8.1" in got.notes[0] and "benchmark 1 of 2" in got.notes[0]
    assert any("2 concurrent@4 (4 ok, 6 failed)" in n for n in got.notes)
    doc = got.document
    totals = first["metrics"]["request_totals"]
    assert (doc["completed"], doc["failed"]) == (totals["successful"], 1)  # 1 incomplete
    assert doc["max_concurrency"] == 1 and doc["duration"] == pytest.approx(first["duration"])


def test_ttft_and_latency_are_the_files_own_statistics(raw):
    metrics = raw["benchmarks"][0]["metrics"]
    doc = importers.read(FIXTURE).document
    ttft = successful(metrics["time_to_first_token_ms"])
    assert doc["mean_ttft_ms"] == ttft["mean"] and doc["median_ttft_ms"] == ttft["median"]
    assert doc["p95_ttft_ms"] == ttft["percentiles"]["p95"]
    # GuideLLM's p999 is the 99.9th percentile; request_latency is in seconds.
    latency = successful(metrics["request_latency"])
    assert doc["p99_9_e2el_ms"] == pytest.approx(latency["percentiles"]["p999"] * 1000)
    assert doc["mean_e2el_ms"] == pytest.approx(latency["mean"] * 1000)


def test_their_tpot_is_not_stored_as_ours_and_ours_excludes_the_first_token(raw):
    benchmark = raw["benchmarks"][0]
    metrics = benchmark["metrics"]
    got = importers.read(FIXTURE)
    doc = got.document
    theirs = successful(metrics["time_per_output_token_ms"])
    assert doc["guidellm_tpot_incl_first_token_mean_ms"] == theirs["mean"]
    # Ours, from the request list: (end − first token) / (output tokens − 1).
    ours = sorted(
        1000
        * (r["info"]["timings"]["request_end"] - r["info"]["timings"]["first_token_iteration"])
        / (r["output_tokens"] - 1)
        for r in benchmark["requests"]["successful"]
    )
    assert doc["median_tpot_ms"] == pytest.approx(percentile(ours, 50))
    assert doc["p99_tpot_ms"] == pytest.approx(percentile(ours, 99))
    # Theirs counts the wait for the first token: larger, and not what TPOT holds.
    assert theirs["mean"] > doc["mean_tpot_ms"] * 1.2
    assert any("includes the first token" in n for n in got.notes)


def test_itl_mean_is_theirs_but_their_itl_percentiles_are_kept_apart(raw):
    metrics = raw["benchmarks"][1]["metrics"]
    got = importers.read(FIXTURE, benchmark=2)
    doc = got.document
    itl = successful(metrics["inter_token_latency_ms"])
    assert doc["mean_itl_ms"] == itl["mean"]  # token-weighted: the mean gap over all tokens
    assert not [k for k in doc if k.endswith("_itl_ms") and k != "mean_itl_ms"]
    assert doc["guidellm_itl_token_weighted_p50_ms"] == itl["percentiles"]["p50"]
    assert got.distributions["n"]["itl"] == 0  # no per-token times in the file
    assert any("ITL percentiles are not known" in n for n in got.notes)


def test_errored_and_incomplete_requests_count_as_failed(raw):
    got = importers.read(FIXTURE, benchmark=2)
    totals = raw["benchmarks"][1]["metrics"]["request_totals"]
    assert got.document["failed"] == totals["errored"] + totals["incomplete"] == 6
    assert got.document["error_rate"] == pytest.approx(6 / 10)
    rows = records.decode(got.log)
    classes = sorted(r["error_class"] or "ok" for r in rows)
    assert classes == ["cancelled"] * 4 + ["http_4xx"] * 2 + ["ok"] * 4
    assert got.label == "guidellm concurrent@4"
    # Each benchmark's clock starts at its own measured window, not at the sweep's.
    assert min(r["sent_s"] for r in rows) == pytest.approx(0.0, abs=0.1)


def test_a_benchmark_that_is_not_there_is_refused_with_the_list():
    with pytest.raises(ValueError, match=r"no benchmark 3; the file holds 2: 1 concurrent@1"):
        importers.read(FIXTURE, benchmark=3)
    with pytest.raises(ValueError, match="only for GuideLLM"):
        importers.parse({"completed": 1, "backend": "vllm", "model_id": "m"}, benchmark=2)


def test_a_sampled_request_list_says_so(raw):
    data = json.loads(json.dumps(raw))
    first = data["benchmarks"][0]
    first["requests"]["successful"] = first["requests"]["successful"][:2]
    got = importers.parse(data)
    assert got.document["completed"] == 4  # the summary still counts all of them
    assert got.log_count == 3
    assert any("lists 3 of the 5 requests" in n for n in got.notes)


def test_the_first_pass_leaves_the_benchmarks_unbuilt():
    with resultstream.opened(lambda: open(FIXTURE, "rb"), False, None) as (stream, counted):
        scanned = resultstream.scan(stream, counted)
    assert "benchmarks" not in scanned.data and scanned.lists["benchmarks"] is True
    assert scanned.data["metadata"]["guidellm_version"] == "0.8.1"


def test_a_big_file_is_read_one_request_at_a_time(tmp_path, raw):
    """Requests with 200 kB prompts, 100 of them in each of two benchmarks (40 MB): holding
    the file, or a benchmark's request list, would need many times what is allowed here."""
    data = json.loads(json.dumps(raw))
    for benchmark in data["benchmarks"]:
        template = benchmark["requests"]["successful"][0]
        template["request_args"] = "x" * 200_000
        benchmark["requests"]["successful"] = [template] * 100
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(data))
    size = path.stat().st_size
    tracemalloc.start()
    try:
        got = importers.read(path, benchmark=2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.log_count == 100 + 6
    assert peak < size / 20, f"peak {peak / 2**20:.1f} MiB for a {size / 2**20:.1f} MiB file"


@pytest.mark.django_db
def test_the_import_page_takes_a_guidellm_file_and_the_benchmark_picked(client, operator):
    from benchmarks.models import BenchmarkRun, RunRequestLog
    from tests.benchmarks.test_import_streaming import post_import
    from tests.factories import make_deployment

    deployment = make_deployment()
    client.force_login(operator)
    with open(FIXTURE, "rb") as handle:
        response = post_import(
            client, {"file": handle, "deployment": deployment.pk, "label": "", "benchmark": 2}
        )
    run = BenchmarkRun.objects.get()
    assert response.status_code == 302
    assert run.source == "guidellm" and run.loadgen_version == "GuideLLM 0.8.1"
    assert run.import_job.benchmark == 2 and run.label == "guidellm concurrent@4"
    assert (run.completed, run.failed) == (4, 6)
    assert RunRequestLog.objects.get(run=run).count == 10
    assert any("includes the first token" in n for n in run.notes)
    assert any("1 concurrent@1" in n for n in run.notes)
    page = client.get(response["Location"]).content.decode()
    assert "Read as GuideLLM (GuideLLM 0.8.1)" in page and "includes the first token" in page
    # A number past the file's benchmarks fails the job with the list to pick from.
    with open(FIXTURE, "rb") as handle:
        response = post_import(
            client, {"file": handle, "deployment": deployment.pk, "label": "", "benchmark": 5}
        )
    page = client.get(response["Location"]).content.decode()
    assert "no benchmark 5; the file holds 2" in page


def test_a_benchmark_that_is_not_an_object_is_refused():
    with pytest.raises(ValueError, match="each benchmark must be an object"):
        importers.parse({"metadata": {}, "config": {}, "benchmarks": [[1, 2]]})
    with pytest.raises(ValueError, match="holds no benchmarks"):
        importers.parse({"metadata": {}, "config": {}, "benchmarks": []})
    with pytest.raises(ValueError, match="'benchmarks' must be a list"):
        importers.parse({"metadata": {}, "config": {}, "benchmarks": {"a": 1}})
