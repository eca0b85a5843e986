"""Reading result files made elsewhere: `vllm bench serve --save-result` JSON (field names as
vllm/benchmarks/serve.py writes them) and the load generator CLI's own JSON (produced here by
really running it against the fixed-latency test server)."""

from __future__ import annotations

import json

import pytest

from benchmarks import importers, records
from benchmarks.loadgen.__main__ import main as cli
from benchmarks.loadgen.profile import build_spec
from benchmarks.loadgen.stats import percentile
from tests.benchmarks.loadgen.conftest import fixed_server  # noqa: F401 - shared fixture

# What `vllm bench serve --save-result --metric-percentiles 99,99.9 --goodput ttft:500` writes
# (keys and their order from vllm/benchmarks/serve.py main_async + benchmark()).
VLLM_SUMMARY = {
    "date": "20250612-143005",
    "endpoint_type": "openai-chat",
    "backend": "openai-chat",
    "label": None,
    "model_id": "meta-llama/Llama-3.1-8B-Instruct",
    "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct",
    "num_prompts": 200,
    "request_rate": "inf",
    "burstiness": 1.0,
    "max_concurrency": 32,
    "duration": 40.0,
    "completed": 196,
    "total_input_tokens": 100352,
    "total_output_tokens": 25088,
    "request_throughput": 4.9,
    "request_goodput": 4.5,
    "output_throughput": 627.2,
    "total_token_throughput": 3136.0,
    "max_output_tokens_per_s": 900.0,
    "max_concurrent_requests": 32,
    "mean_ttft_ms": 210.5,
    "median_ttft_ms": 180.25,
    "std_ttft_ms": 60.0,
    "p99_ttft_ms": 480.0,
    "p99.9_ttft_ms": 520.0,
    "mean_tpot_ms": 21.0,
    "median_tpot_ms": 20.5,
    "std_tpot_ms": 2.0,
    "p99_tpot_ms": 30.0,
    "p99.9_tpot_ms": 33.0,
    "mean_itl_ms": 20.8,
    "median_itl_ms": 19.9,
    "std_itl_ms": 4.0,
    "p99_itl_ms": 45.0,
    "p99.9_itl_ms": 60.0,
}


def vllm_detailed(start_times: bool = True) -> dict:
    """Five requests, the fourth failed; ttfts/itls in seconds like vllm writes them."""
    data = {
        "date": "20250612-150000",
        "endpoint_type": "openai",
        "backend": "vllm",
        "label": "tp2-bench",
        "model_id": "Qwen/Qwen2.5-7B-Instruct",
        "tokenizer_id": "Qwen/Qwen2.5-7B-Instruct",
        "num_prompts": 5,
        "request_rate": 2.0,
        "burstiness": 1.0,
        "max_concurrency": None,
        "duration": 3.0,
        "completed": 4,
        "failed": 1,
        "total_input_tokens": 400,
        "total_output_tokens": 10,
        "request_throughput": 4 / 3,
        "request_goodput": None,
        "output_throughput": 10 / 3,
        "total_token_throughput": 410 / 3,
        "input_lens": [100, 100, 100, 100, 100],
        "output_lens": [3, 2, 4, 0, 1],
        "ttfts": [0.1, 0.2, 0.3, 0.0, 0.4],
        "itls": [[0.01, 0.03], [0.02], [0.01, 0.01, 0.04], [], []],
        "generated_texts": ["a b c", "a b", "a b c d", "", "a"],
        "errors": ["", "", "", "ClientConnectorError: connection refused", ""],
        "max_output_tokens_per_s": 5.0,
        "max_concurrent_requests": 3,
        "mean_ttft_ms": 250.0,
        "median_ttft_ms": 250.0,
        "std_ttft_ms": 111.8,
        "p99_ttft_ms": 397.0,
    }
    if start_times:
        data["start_times"] = [1000.0, 1000.5, 1001.0, 1001.5, 1002.0]
    return data


def test_vllm_summary_file_maps_onto_our_names():
    got = importers.parse(dict(VLLM_SUMMARY))
    doc = got.document
    assert got.kind == importers.VLLM_BENCH and got.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert got.log is None and got.distributions is None and doc["spec"] is None
    # vllm's "p99.9_ttft_ms" is the load generator's "p99_9_ttft_ms".
    assert doc["p99_9_ttft_ms"] == 520.0 and "p99.9_ttft_ms" not in doc
    assert doc["median_ttft_ms"] == 180.25 and doc["p99_itl_ms"] == 45.0
    # No "failed" in older files: num_prompts − completed.
    assert doc["failed"] == 4 and doc["error_rate"] == pytest.approx(4 / 200)
    # Goodput share: 4.5 req/s × 40 s = 180 good of 200.
    assert doc["goodput_share"] == pytest.approx(0.9)
    assert doc["endpoint"] == "/v1/chat/completions" and doc["timeline"] == []
    assert "p95_ttft_ms" not in doc  # not in the file, not invented
    assert got.date.isoformat() == "2025-06-12T14:30:05+00:00"
    text = " ".join(got.notes)
    assert "no per-second timeline" in text and "p95" in text and "--save-detailed" in text


def test_vllm_detailed_file_gives_records_and_missing_percentiles():
    got = importers.parse(vllm_detailed())
    doc = got.document
    assert [k for k in importers.DETAILED if k in doc] == []  # lists are not summary keys
    rows = records.decode(got.log)
    assert got.label == "tp2-bench" and got.log_count == 5 and len(rows) == 5
    ok = [r for r in rows if r["error_class"] is None]
    assert len(ok) == 4
    bad = rows[3]
    assert bad["error_class"] == "connection" and "refused" in bad["error"]
    assert bad["ttft_ms"] is None and bad["output_tokens"] == 0
    first = rows[0]
    assert first["sent_s"] == 0.0 and rows[1]["sent_s"] == 0.5
    # First token 100 ms after the send, then gaps of 10 and 30 ms.
    assert first["ttft_ms"] == pytest.approx(100.0, abs=1e-3)
    assert first["itl_mean_ms"] == pytest.approx(20.0, abs=1e-3)
    assert first["itl_max_ms"] == pytest.approx(30.0, abs=1e-3)
    assert first["e2el_ms"] == pytest.approx(140.0, abs=1e-3)
    # p95 TTFT over the successes (100, 200, 300, 400 ms): 300 + 0.85 × 100.
    assert doc["p95_ttft_ms"] == pytest.approx(385.0)
    # Values in the file win over computed ones.
    assert doc["p99_ttft_ms"] == 397.0 and doc["mean_ttft_ms"] == 250.0
    # Pooled ITL: 10, 30, 20, 10, 10, 40 ms.
    assert doc["median_itl_ms"] == pytest.approx(15.0)
    assert doc["p95_itl_ms"] == pytest.approx(percentile([10, 10, 10, 20, 30, 40], 95))
    # E2EL from TTFT + gaps: 140, 220, 360, 400 ms.
    assert doc["p99_e2el_ms"] == pytest.approx(percentile([140, 220, 360, 400], 99))
    assert "request_goodput" not in doc
    assert any("computed from its per-request lists" in n for n in got.notes)
    dist = got.distributions
    assert dist["n"]["succeeded"] == 4 and dist["ttft_ms"][-1] == pytest.approx(400.0)


def test_vllm_detailed_file_without_send_times_has_latencies_but_no_clock():
    got = importers.parse(vllm_detailed(start_times=False))
    rows = records.decode(got.log)
    assert rows[2]["sent_s"] is None and rows[2]["ttft_ms"] == pytest.approx(300.0, abs=1e-3)
    assert any("no send times" in n for n in got.notes)


def test_vllm_detailed_lists_that_disagree_are_not_imported():
    data = vllm_detailed()
    data["itls"] = data["itls"][:3]
    got = importers.parse(data)
    assert got.log is None and got.distributions is None
    assert any("different lengths" in n for n in got.notes)


def test_other_files_are_refused_with_what_they_are():
    with pytest.raises(ValueError, match="load generator's JSON"):
        importers.parse({"hello": "world"})
    with pytest.raises(ValueError, match="list"):
        importers.parse([VLLM_SUMMARY, VLLM_SUMMARY])
    with pytest.raises(ValueError, match="load profile"):
        importers.parse({"format": "llm-control-panel/load-profile", "spec": {}})
    with pytest.raises(ValueError, match="completed"):
        importers.parse({**VLLM_SUMMARY, "completed": "many"})


def test_our_cli_file_with_records(fixed_server, tmp_path, capsys):  # noqa: F811
    server = fixed_server(ttft_ms=15, itl_ms=3)
    out = tmp_path / "result.json"
    code = cli(
        [
            "--base-url",
            server.url,
            "--model",
            "fixed-latency",
            "--stage",
            "low:concurrency=2,requests=6",
            "--stage",
            "high:concurrency=4,requests=8",
            "--random-input-len",
            "16",
            "--random-output-len",
            "6",
            "--warmup",
            "2",
            "--ignore-eos",
            "--no-server-metrics",
            "--quiet",
            "--save-detailed",
            "--result-filename",
            str(out),
            "--goodput",
            "ttft:1000",
        ]
    )
    assert code == 0
    capsys.readouterr()
    data = json.loads(out.read_text())
    got = importers.parse(data)
    assert got.kind == importers.LOADGEN and got.model == "fixed-latency"
    assert len(data["records"]) == 16 and got.log_count == 14  # warm-up dropped
    assert set(got.document["stages"]) == {"low", "high"}
    assert got.document["completed"] == 14 and "records" not in got.document
    assert got.spec["stages"][0]["name"] == "low"
    dist = got.distributions
    assert dist == records.distributions(data["records"])  # streamed as a list would give
    # The server sends the first token 15 ms after a request arrives.
    assert 14.0 <= dist["ttft_ms"][0] and dist["ttft_ms"][50] < 200.0
    assert dist["n"]["itl"] == 14 * 5
    # The same load written as a profile compares equal; another load does not.
    profile = {
        "stages": [
            {"name": "low", "concurrency": 2, "num_requests": 6},
            {"name": "high", "concurrency": 4, "num_requests": 8},
        ],
        "input_len": {"kind": "fixed", "mean": 16},
        "output_len": {"kind": "fixed", "mean": 6},
        "warmup_requests": 2,
        "slo": {"ttft": 1000},
    }
    as_profile = build_spec(profile, "http://elsewhere:1", "m").to_dict()
    assert importers.comparable_spec(as_profile) == importers.comparable_spec(got.spec)
    other = build_spec({**profile, "warmup_requests": 3}, "http://x:1", "m").to_dict()
    assert importers.comparable_spec(other) != importers.comparable_spec(got.spec)


def test_our_file_without_records_says_so():
    data = {
        "date": "2025-01-02T03:04:05+00:00",
        "model_id": "m",
        "completed": 3,
        "failed": 0,
        "stages": {},
        "timeline": [{"t": 1.0}],
        "spec": None,
        "notes": ["from the CLI"],
    }
    got = importers.parse(data)
    assert got.log is None and got.spec is None
    assert got.document["notes"] == ["from the CLI"]
    assert any("--save-detailed" in n for n in got.notes)
    with pytest.raises(ValueError, match="stages"):
        importers.parse({**data, "stages": []})


def test_an_infinite_request_rate_survives_as_text_and_still_matches():
    spec = build_spec(
        {"stages": [{"name": "main", "request_rate": float("inf"), "num_requests": 10}]},
        "http://x:1",
        "m",
    ).to_dict()
    data = {"completed": 1, "failed": 0, "stages": {}, "timeline": [], "spec": spec}
    got = importers.parse(json.loads(json.dumps(data)))  # Python's json writes Infinity
    assert got.spec["stages"][0]["request_rate"] == "inf"
    json.dumps(got.spec, allow_nan=False)  # storable in PostgreSQL's jsonb
    assert importers.comparable_spec(got.spec) == importers.comparable_spec(spec)


def test_the_note_names_p99_9_as_such_not_p99():
    """The file has p99 TTFT; p99.9 TTFT (the load generator's ``p99_9_ttft_ms``) is computed
    from the lists. The note once cut ``p99_9`` at its underscore and said "p99 ... computed",
    which claimed the file's own p99 was ours."""
    got = importers.parse(vllm_detailed())
    note = next(n for n in got.notes if "computed from its per-request lists" in n)
    by_metric = dict(part.split(" ", 1) for part in note.split(": ", 1)[1].split("; "))
    assert by_metric["TTFT"].split(", ") == ["p50", "p90", "p95", "p99.9"]
    assert by_metric["ITL"].split(", ") == [
        "mean",
        "median",
        "std",
        "p50",
        "p90",
        "p95",
        "p99",
        "p99.9",
    ]
    assert got.document["p99_ttft_ms"] == 397.0  # the file's, not recomputed
