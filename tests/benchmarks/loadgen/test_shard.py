"""Sharing a load across client processes gives the same load, merged on one time base."""

import math
import sys

import pytest

from benchmarks.loadgen import Dataset, LengthDist, LoadSpec, Stage, run
from benchmarks.loadgen.__main__ import main as cli
from benchmarks.loadgen.shard import split


def test_split_divides_every_stage():
    spec = LoadSpec(
        base_url="http://x:1",
        model="m",
        workers=3,
        warmup_requests=5,
        stages=(
            Stage("a", concurrency=8, num_requests=100),
            Stage("b", concurrency=None, request_rate=30.0, max_concurrency=10, num_requests=7),
            Stage("c", concurrency=None, request_rate=math.inf, max_concurrency=4, duration_s=5),
        ),
    )
    parts = split(spec)
    assert [p.stages[0].concurrency for p in parts] == [3, 3, 2]
    assert sum(p.stages[0].num_requests for p in parts) == 100
    assert [p.stages[1].request_rate for p in parts] == [10.0, 10.0, 10.0]
    assert sum(p.stages[1].num_requests for p in parts) == 7
    assert [p.stages[1].max_concurrency for p in parts] == [4, 3, 3]
    assert all(math.isinf(p.stages[2].request_rate) for p in parts)
    assert [p.scrape_metrics for p in parts] == [True, False, False]
    assert all(p.workers == 1 and p.record_requests for p in parts)


@pytest.mark.timing
def test_two_workers_merge_into_one_result(fixed_server):
    server = fixed_server(ttft_ms=20, itl_ms=4)
    points = []
    spec = LoadSpec(
        base_url=server.url,
        model="fixed-latency",
        workers=2,
        warmup_requests=4,
        scrape_metrics=False,
        record_requests=True,
        dataset=Dataset(LengthDist("fixed", 8), LengthDist("fixed", 10)),
        stages=(
            Stage("closed", concurrency=6, num_requests=30),
            Stage("open", concurrency=None, request_rate=200, num_requests=600),
        ),
    )
    result = run(spec, on_progress=points.append)
    data = result.to_dict()
    assert data["workers"] == 2 and data["completed"] == 630 and data["warmup_requests"] == 4
    assert {k: v["completed"] for k, v in data["stages"].items()} == {"closed": 30, "open": 600}
    assert abs(data["median_ttft_ms"] - 20) < 3
    assert data["timestamps"] == ("kernel" if sys.platform == "linux" else "read")
    indices = [r["index"] for r in result.records]
    assert len(indices) == len(set(indices)) == 634
    # One time base: the two workers' open-loop arrivals interleave into one 200 req/s stream.
    # Judged on the planned times (how fast Python got round to sending them depends on how
    # loaded the machine is, which is client_queue's to report), and none went out early.
    opened = [r for r in result.records if r["stage"] == "open"]
    planned = sorted(r["scheduled"] for r in opened)
    rate = (len(planned) - 1) / (planned[-1] - planned[0])
    assert abs(rate - 200) / 200 < 0.1, rate
    assert all(r["sent"] >= r["scheduled"] - 0.002 for r in opened)
    assert points and points[-1]["completed"] == 630


def test_cli_workers_flag(fixed_server, tmp_path, capsys):
    server = fixed_server(ttft_ms=5, itl_ms=1)
    code = cli(
        [
            "--base-url",
            server.url,
            "--model",
            "fixed-latency",
            "--workers",
            "2",
            "--max-concurrency",
            "4",
            "--num-prompts",
            "20",
            "--random-input-len",
            "4",
            "--random-output-len",
            "3",
            "--ignore-eos",
            "--no-server-metrics",
            "--quiet",
        ]
    )
    assert code == 0 and "Successful requests                     20" in capsys.readouterr().out
