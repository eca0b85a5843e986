"""Reading AIPerf's results: real files of one AIPerf 0.13.0 run against the simulator
(tests/benchmarks/fixtures/README.md), the summary (profile_export_aiperf.json) and the
per-request records (profile_export.jsonl). The records, read the way this panel reads them,
give back AIPerf's own summary numbers: evidence that the names are mapped onto the same
quantities (aiperf/metrics/types/*.py of 0.13.0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import importers, importers_aiperf, records
from tests.benchmarks.test_importers import vllm_detailed

FIXTURES = Path(__file__).parent / "fixtures"
SUMMARY = FIXTURES / "aiperf-0.13.0-profile_export_aiperf.json"
RECORDS = FIXTURES / "aiperf-0.13.0-profile_export.jsonl"
OURS = {
    "time_to_first_token": "ttft",
    "request_latency": "e2el",
    "inter_chunk_latency": "itl",
    "inter_token_latency": "tpot",
}


@pytest.fixture(scope="module")
def summary() -> dict:
    return json.loads(SUMMARY.read_text())


def test_the_summary_maps_their_names_onto_ours(summary):
    got = importers.read(SUMMARY)
    doc = got.document
    assert got.kind == importers_aiperf.AIPERF and got.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert got.log is None and "AIPerf 0.13.0" in got.notes[0]
    assert any("profile_export.jsonl" in n for n in got.notes)
    # request_count counts the successes; error_request_count the failures.
    assert (doc["completed"], doc["failed"]) == (7, 5)
    assert doc["error_rate"] == pytest.approx(5 / 12)
    assert doc["max_concurrency"] == 4 and doc["endpoint"] == "/v1/chat/completions"
    assert doc["total_output_tokens"] == summary["total_usage_completion_tokens"]["avg"]
    for theirs, ours in OURS.items():
        assert doc[f"mean_{ours}_ms"] == summary[theirs]["avg"]
        assert doc[f"median_{ours}_ms"] == summary[theirs]["p50"]
        assert doc[f"p99_{ours}_ms"] == summary[theirs]["p99"]
    # Their "inter_token_latency" is one value a request: our TPOT, not our ITL.
    assert doc["p90_tpot_ms"] == summary["inter_token_latency"]["p90"]
    assert doc["p90_itl_ms"] == summary["inter_chunk_latency"]["p90"]
    assert doc["p90_tpot_ms"] != doc["p90_itl_ms"]


def test_the_records_give_back_aiperfs_own_summary(summary):
    got = importers.read(RECORDS)
    doc = got.document
    assert got.kind == importers_aiperf.AIPERF and got.log_count == 12
    assert (doc["completed"], doc["failed"]) == (7, 5)
    assert any("profile_export.jsonl" in n for n in got.notes)
    for theirs, ours in OURS.items():
        for stat, key in (("avg", "mean"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99")):
            assert doc[f"{key}_{ours}_ms"] == pytest.approx(summary[theirs][stat], rel=1e-9), (
                theirs,
                stat,
            )
    assert doc["total_input_tokens"] == summary["total_usage_prompt_tokens"]["avg"]
    rows = records.decode(got.log)
    failed = [r for r in rows if r["error_class"] is not None]
    assert len(failed) == 5 and {r["error_class"] for r in failed} == {"http_4xx"}
    assert "maximum context length" in failed[0]["error"]
    assert min(r["sent_s"] for r in rows) == 0.0
    assert got.distributions["n"]["itl"] == summary["inter_chunk_latency"]["count"]


def test_warm_up_lines_are_left_out(tmp_path):
    lines = RECORDS.read_text().splitlines()
    first = json.loads(lines[0])
    first["metadata"]["benchmark_phase"] = "warmup"
    path = tmp_path / "profile_export.jsonl"
    path.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    assert importers.read(path).log_count == 11


def test_a_line_that_is_not_a_record_is_refused_with_its_number(tmp_path):
    lines = RECORDS.read_text().splitlines()
    path = tmp_path / "profile_export.jsonl"
    path.write_text("\n".join([*lines[:3], '{"hello": 1}', *lines[3:]]) + "\n")
    with pytest.raises(ValueError, match="line 4 is not a request record"):
        importers.read(path)
    path.write_text("\n".join([*lines[:2], "{not json", *lines[2:]]) + "\n")
    with pytest.raises(ValueError, match="line 3 is not JSON"):
        importers.read(path)


def test_a_one_line_json_file_is_not_taken_for_records(tmp_path):
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps(vllm_detailed()) + "\n")
    assert importers.read(path).kind == importers.VLLM_BENCH
    # GuideLLM writes its report on one line too, with "metadata" first.
    guidellm = FIXTURES / "guidellm-0.8.1-benchmarks.json"
    assert not importers_aiperf.is_records_file(lambda: open(guidellm, "rb"))


@pytest.mark.django_db
def test_the_import_page_takes_aiperf_records(client, operator):
    from benchmarks.models import BenchmarkRun
    from tests.benchmarks.test_import_streaming import post_import
    from tests.factories import make_deployment

    deployment = make_deployment()
    client.force_login(operator)
    with open(RECORDS, "rb") as handle:
        response = post_import(client, {"file": handle, "deployment": deployment.pk, "label": ""})
    run = BenchmarkRun.objects.get()
    assert run.source == "aiperf" and (run.completed, run.failed) == (7, 5)
    assert run.model_name == deployment.model  # the records name no model
    assert run.ttft_p50_ms == pytest.approx(
        json.loads(SUMMARY.read_text())["time_to_first_token"]["p50"]
    )
    page = client.get(response["Location"]).content.decode()
    assert "Read as AIPerf" in page and "profile_export.jsonl" in page


def test_a_big_records_file_is_read_a_line_at_a_time(tmp_path):
    """2,400 lines (the fixture's twelve, two hundred times over, their send times spread).
    Parsed whole, as json.load would, the lines take about six times the file's size; read a
    line at a time what stays is the request log and the distributions (bounded by the
    requests: about 0.5 kB each here), under half the file."""
    import tracemalloc

    lines = [json.loads(line) for line in RECORDS.read_text().splitlines()]
    path = tmp_path / "profile_export.jsonl"
    with path.open("w") as out:
        for copy in range(200):
            for line in lines:
                line["metadata"]["request_start_ns"] += copy * 10**9
                out.write(json.dumps(line) + "\n")
                line["metadata"]["request_start_ns"] -= copy * 10**9
    size = path.stat().st_size
    tracemalloc.start()
    try:
        got = importers.read(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.log_count == 2400 and got.document["failed"] == 1000
    assert peak < size / 2, f"peak {peak / 2**20:.1f} MiB for a {size / 2**20:.1f} MiB file"
