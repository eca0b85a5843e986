"""``python -m benchmarks.sweep`` in a subprocess: the table, JSON, and one-line refusals."""

import json
import subprocess
import sys

from tests.integration.processes import ROOT

BASE = [
    "--engine", "vllm", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100-sxm",
    "--input-len", "256", "--output-len", "32", "--num-requests", "60", "--workers", "1",
]  # fmt: skip


def sweep(*args):
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.sweep", *BASE, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_table_with_infeasible_configs():
    out = sweep(
        "--flag", "max_num_seqs=2,8",
        "--flag", "gpu_memory_utilization=0.3,0.9",
        "--slo", "ttft_p95_ms=500",
        "--objective", "cost_per_million", "--price-per-gpu-hour", "2.5",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("4 points: 2 start, 2 meet the SLO (p95 TTFT ≤ 500 ms")
    header = next(line for line in lines if line.startswith("#"))
    for column in ("flags", "max req/s", "p95 TTFT", "p95 ITL", "tok/s/GPU", "cost/1M", "margin"):
        assert column in header
    assert "2 config(s) would not start: ValueError:" in out.stdout
    assert "max_num_seqs=2 gpu_memory_utilization=0.3" in out.stdout


def test_json_and_no_point_meets():
    out = sweep("--flag", "max_num_seqs=4", "--slo", "ttft_p95_ms=1", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["no_point_meets"] and data["counts"] == {"total": 1, "feasible": 1, "meeting": 0}
    text = sweep("--flag", "max_num_seqs=4", "--slo", "ttft_p95_ms=1").stdout
    assert "No point meets the SLO" in text and "Closest: max_num_seqs=4" in text


def test_bad_input_exits_2_with_one_line():
    for args, words in (
        (["--flag", "max_num_sequences=4", "--slo", "ttft_p95_ms=5"], "has no setting"),
        (["--flag", "max_num_seqs=4"], "set at least one latency limit"),
        (["--flag", "max_num_seqs=4", "--slo", "ttft_p95_ms=5", "--objective",
          "cost_per_million"], "price per GPU-hour"),
        (["--slo", "ttft_p95_ms=5"], "at least one --flag"),
        (["--flag", "max_num_seqs", "--slo", "ttft_p95_ms=5"], "expected KEY=VALUE"),
        (["--flag", "max_num_seqs=4", "--slo", "ttft_p95_ms=5", "--num-gpus", "x"], "invalid int"),
    ):  # fmt: skip
        out = sweep(*args)
        assert out.returncode == 2, (args, out.stdout)
        assert out.stderr.count("\n") == 1 and words in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
