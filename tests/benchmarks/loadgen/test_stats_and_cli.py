"""Statistics on known data, server-side /metrics deltas, and the CLI."""

import json
import math
import random

import pytest

from benchmarks.loadgen import Dataset, LengthDist, LoadSpec, Stage, run
from benchmarks.loadgen.__main__ import build_parser, parse_stage, spec_from_args
from benchmarks.loadgen.__main__ import main as cli
from benchmarks.loadgen.arrivals import open_loop_offsets
from benchmarks.loadgen.scrape import deltas, parse
from benchmarks.loadgen.stats import RequestRecord, describe, percentile, summarize
from tests.hosts.simulator.conftest import LLAMA


def test_percentiles_interpolate_like_numpy():
    data = [float(x) for x in range(1, 101)]
    assert percentile(data, 50) == 50.5
    assert percentile(data, 99) == pytest.approx(99.01)
    assert percentile(data, 99.9) == pytest.approx(99.901)
    assert percentile([7.0], 99) == 7.0 and math.isnan(percentile([], 50))


def test_describe_on_a_known_distribution():
    rng = random.Random(0)
    values = [rng.expovariate(1 / 0.1) for _ in range(20000)]  # mean 100 ms
    stats = describe(values, "x")
    assert stats["mean_x_ms"] == pytest.approx(100, rel=0.03)
    assert stats["median_x_ms"] == pytest.approx(100 * math.log(2), rel=0.03)
    assert stats["p99_x_ms"] == pytest.approx(100 * math.log(100), rel=0.05)
    assert stats["std_x_ms"] == pytest.approx(100, rel=0.05)


def test_latency_from_schedule_shows_client_queueing():
    late = RequestRecord(
        index=0,
        stage="s",
        warmup=False,
        input_len=1,
        max_tokens=2,
        scheduled=0.0,
        sent=0.5,
        first_token=0.6,
        chunk_times=[0.6, 0.7],
        end=0.7,
        output_tokens=2,
        token_source="usage",
    )
    summary = summarize([late])
    assert summary["mean_ttft_ms"] == pytest.approx(100)
    assert summary["mean_ttft_from_scheduled_ms"] == pytest.approx(600)
    assert summary["mean_client_queue_ms"] == pytest.approx(500)


def test_offsets_span_exactly_n_over_rate():
    offsets = open_loop_offsets(1000, 50.0, 0.5, random.Random(1))
    assert offsets[0] == 0 and offsets == sorted(offsets)
    last_gap_end = offsets[-1] + (offsets[-1] - offsets[-2])
    assert 1000 / 50.0 * 0.95 < last_gap_end < 1000 / 50.0 * 1.05


def test_length_distributions():
    rng = random.Random(3)
    lognormal = [LengthDist("lognormal", 400, stddev=0.5).sample(rng) for _ in range(20000)]
    assert sum(lognormal) / len(lognormal) == pytest.approx(400, rel=0.03)
    empirical = LengthDist("empirical", values=((100, 3), (1000, 1)))
    draws = [empirical.sample(rng) for _ in range(8000)]
    assert set(draws) == {100, 1000} and draws.count(100) / 8000 == pytest.approx(0.75, abs=0.02)
    clamped = [
        LengthDist("normal", 50, stddev=100, low=10, high=60).sample(rng) for _ in range(500)
    ]
    assert min(clamped) >= 10 and max(clamped) <= 60


EXPOSITION = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="m"}} {waiting}
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{model_name="m"}} {queries}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{model_name="m"}} {hits}
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{{le="+Inf",model_name="m"}} {count}
vllm:request_queue_time_seconds_sum{{model_name="m"}} {total}
vllm:request_queue_time_seconds_count{{model_name="m"}} {count}
"""


def test_metrics_parse_and_deltas():
    before = parse(EXPOSITION.format(waiting=0, queries=100, hits=0, total=1.0, count=10))
    after = parse(EXPOSITION.format(waiting=3, queries=300, hits=150, total=3.0, count=20))
    d = deltas(before, after)
    assert d["engine"] == "vllm" and after["waiting"] == 3
    assert d["prefix_cache_hit_rate"] == 0.75
    assert d["server_mean_queue_ms"] == pytest.approx(200)


def test_server_metrics_against_the_simulator(sim_server):
    server = sim_server("vllm", "--max-model-len", "4096", "--time-scale", "0.1")
    spec = LoadSpec(
        base_url=server.url,
        model=LLAMA,
        warmup_requests=2,
        dataset=Dataset(
            # 480 shared tokens on top of 32 of each request's own: 512 sent.
            LengthDist("fixed", 32),
            LengthDist("fixed", 16),
            prefix_len=480,
            prefix_groups=1,
        ),
        stages=(Stage("s", concurrency=4, num_requests=24),),
    )
    result = run(spec).to_dict()
    srv = result["server"]
    assert srv["available"] and srv["engine"] == "vllm"
    # Deltas cover the measured requests only, not the warm-up.
    assert srv["generation_tokens"] == 24 * 16
    assert srv["server_ttft_count"] == 24
    assert srv["prefix_cache_hit_rate"] > 0.8  # 480 of 512 tokens shared
    assert srv["server_mean_queue_ms"] is not None and srv["server_mean_prefill_ms"] > 0
    assert srv["timeline"] and "kv_cache_usage" in srv["timeline"][0]
    assert result["completed"] == 24 and result["total_input_tokens"] == 24 * 512


def test_stage_flag_parsing():
    stage = parse_stage("peak:rate=20,burstiness=0.5,max_concurrency=64,duration=30")
    assert (
        stage.name,
        stage.request_rate,
        stage.burstiness,
        stage.max_concurrency,
        stage.duration_s,
        stage.num_requests,
    ) == ("peak", 20.0, 0.5, 64, 30.0, None)
    with pytest.raises(ValueError, match="unknown"):
        parse_stage("x:speed=3")


def test_vllm_style_flags_map_to_a_spec():
    args = build_parser().parse_args(
        [
            "--host",
            "10.0.0.1",
            "--port",
            "8001",
            "--model",
            "m",
            "--max-concurrency",
            "32",
            "--num-prompts",
            "50",
            "--random-input-len",
            "100",
            "--random-output-len",
            "20",
            "--random-range-ratio",
            "0.5",
            "--goodput",
            "ttft:500",
            "tpot:40",
            "--ignore-eos",
        ]
    )
    spec = spec_from_args(args)
    assert spec.base_url == "http://10.0.0.1:8001" and spec.goodput == {"ttft": 500, "tpot": 40}
    (stage,) = spec.stages
    assert stage.max_concurrency == 32 and math.isinf(stage.request_rate)
    assert spec.dataset.input_len.low == 50 and spec.dataset.input_len.high == 150
    assert spec.ignore_eos


def test_cli_end_to_end(fixed_server, tmp_path, capsys):
    server = fixed_server(ttft_ms=10, itl_ms=2)
    out = tmp_path / "result.json"
    code = cli(
        [
            "--base-url",
            server.url,
            "--model",
            "fixed-latency",
            "--max-concurrency",
            "4",
            "--num-prompts",
            "12",
            "--random-input-len",
            "8",
            "--random-output-len",
            "5",
            "--ignore-eos",
            "--no-server-metrics",
            "--quiet",
            "--result-filename",
            str(out),
            "--goodput",
            "ttft:100",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "Successful requests" in printed and "Request goodput" in printed
    data = json.loads(out.read_text())
    assert data["completed"] == 12 and data["max_concurrency"] == 4


def test_cli_reports_bad_input(capsys):
    assert cli(["--model", "m", "--stage", "nonsense"]) == 2
    assert "error: --stage 'nonsense'" in capsys.readouterr().err
    assert (
        cli(
            [
                "--base-url",
                "http://127.0.0.1:9",
                "--model",
                "m",
                "--ready-timeout",
                "0.3",
                "--quiet",
            ]
        )
        == 1
    )


def test_local_tokenizer_gives_exact_text_lengths(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from benchmarks.loadgen.dataset import WORDS, PromptFactory

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    dataset = Dataset(
        LengthDist("uniform", low=5, high=300),
        LengthDist("fixed", 4),
        prompt_format="text",
        tokenizer=str(tmp_path),
    )
    factory = PromptFactory(dataset, seed=1)
    for i in range(50):
        prompt = factory.make(i)
        assert len(tokenizer.encode(prompt.payload).ids) == prompt.input_len


def test_missing_tokenizer_is_a_clear_error(tmp_path):
    from benchmarks.loadgen.dataset import PromptFactory

    with pytest.raises(ValueError, match="no tokenizer.json"):
        PromptFactory(Dataset(prompt_format="text", tokenizer=str(tmp_path)), seed=0)


def test_histogram_flag():
    args = build_parser().parse_args(["--model", "m", "--input-hist", "100:3,1000:1"])
    assert spec_from_args(args).dataset.input_len.values == ((100, 3.0), (1000, 1.0))


def test_server_going_away_mid_run_counts_connection_errors(fixed_server):
    # The server exits as the 41st request arrives: mid-run whatever the machine's speed.
    server = fixed_server(ttft_ms=5, itl_ms=5, exit_after=40)
    spec = LoadSpec(
        base_url=server.url,
        model="fixed-latency",
        scrape_metrics=False,
        dataset=Dataset(LengthDist("fixed", 4), LengthDist("fixed", 10)),
        stages=(Stage("s", concurrency=4, num_requests=300),),
    )
    result = run(spec).to_dict()
    assert 0 < result["completed"] <= 40 and result["errors_by_class"].get("connection", 0) > 0
    assert result["completed"] + result["failed"] == 300
