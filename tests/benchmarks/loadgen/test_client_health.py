"""The load generator measures its own health and the engine's view of the same window
(issue 37, finding 3): client-side protocol errors are their own class, the engine's TTFT/ITL
histograms are read as window deltas (vLLM's and SGLang's names), a run records its event-loop
lag, CPU share and late sends, and shards' healths merge to the worst."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from benchmarks.loadgen import Dataset, LengthDist, LoadSpec, Stage, run
from benchmarks.loadgen.client import CLIENT_ERROR, make_client, send
from benchmarks.loadgen.distributed import merge_health
from benchmarks.loadgen.scrape import bucket_quantile, deltas, parse
from benchmarks.loadgen.stats import RequestRecord, engine_state, summarize


# --- client-side protocol errors --------------------------------------------------------------
def _send_through(handler) -> RequestRecord:
    record = RequestRecord(
        index=0, stage="s", warmup=False, input_len=1, max_tokens=4, scheduled=0.0
    )

    async def go():
        async with make_client(5.0, None, httpx.MockTransport(handler)) as client:
            await send(client, "http://engine.test/v1/completions", {}, record, {}, 0.0)

    asyncio.run(go())
    return record


def _raises(exc):
    def handler(request):
        raise exc

    return handler


def _stream(body: bytes):
    def handler(request):
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return handler


@pytest.mark.parametrize(
    ("handler", "error_class"),
    [
        # The errors: a read buffer shared by two runs mangled the framing or spliced
        # two streams' JSON. The client's doing, never "as the engine answered".
        (
            _raises(
                httpx.RemoteProtocolError(
                    "malformed HTTP response: Invalid character in chunk size"
                )
            ),
            CLIENT_ERROR,
        ),
        (
            _stream(b'data: {"choices":[{"text":"a"}]}{"choices":[{"te\n\ndata: [DONE]\n\n'),
            CLIENT_ERROR,
        ),
        (_raises(httpx.PoolTimeout("no connection free in the pool")), CLIENT_ERROR),
        # The engine's doing stays the engine's.
        (
            _raises(httpx.RemoteProtocolError("the server closed the connection mid-response")),
            "connection",
        ),
        (_raises(httpx.ConnectError("connection refused")), "connection"),
        (_raises(httpx.ReadTimeout("timed out")), "timeout"),
        (_stream(b'data: {"error": {"message": "overloaded"}}\n\n'), "malformed_stream"),
    ],
)
def test_protocol_errors_are_classified_by_whose_they_are(handler, error_class):
    record = _send_through(handler)
    assert record.error_class == error_class, record.error


def test_client_errors_are_counted_apart_and_worded_as_the_clients():
    ok = RequestRecord(0, "s", False, 1, 4, 0.0, sent=0.0, first_token=0.1, end=0.2)
    ok.chunk_times, ok.output_tokens = [0.1], 1
    bad = RequestRecord(1, "s", False, 1, 4, 0.0, sent=0.0, end=0.1)
    bad.error_class, bad.error = CLIENT_ERROR, "RemoteProtocolError: malformed HTTP response"
    summary = summarize([ok, bad])
    assert summary["errors_by_class"] == {CLIENT_ERROR: 1}
    state = engine_state([ok, bad], "http://engine.test/v1/completions")
    assert "load generator could not read" in state and "client-side, not the engine" in state


# --- the engine's own histograms over the window --------------------------------------------------
# vLLM 0.11: ITL under its new name beside the deprecated TPOT (here with other numbers, to
# show the newest name is read, never the sum), labels model_name and engine.
VLLM = """# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.01",model_name="m"}} 0.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.02",model_name="m"}} {t02}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.04",model_name="m"}} {t04}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.06",model_name="m"}} {t06}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {count}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {count}
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {tsum}
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{{engine="0",le="0.01",model_name="m"}} {i01}
vllm:inter_token_latency_seconds_bucket{{engine="0",le="0.025",model_name="m"}} {icount}
vllm:inter_token_latency_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {icount}
vllm:inter_token_latency_seconds_count{{engine="0",model_name="m"}} {icount}
vllm:inter_token_latency_seconds_sum{{engine="0",model_name="m"}} {isum}
# HELP vllm:time_per_output_token_seconds DEPRECATED: Use vllm:inter_token_latency_seconds instead.
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{{engine="0",le="0.5",model_name="m"}} {icount}
vllm:time_per_output_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {icount}
vllm:time_per_output_token_seconds_count{{engine="0",model_name="m"}} {icount}
vllm:time_per_output_token_seconds_sum{{engine="0",model_name="m"}} 999.0
"""
# SGLang 0.5.3 (tokenizer metrics collector): the same histograms under sglang: names.
SGLANG = """# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{{model_name="m"}} {tsum}
sglang:time_to_first_token_seconds_bucket{{le="0.01",model_name="m"}} 0.0
sglang:time_to_first_token_seconds_bucket{{le="0.02",model_name="m"}} {t02}
sglang:time_to_first_token_seconds_bucket{{le="0.04",model_name="m"}} {t04}
sglang:time_to_first_token_seconds_bucket{{le="0.06",model_name="m"}} {t06}
sglang:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {count}
sglang:time_to_first_token_seconds_count{{model_name="m"}} {count}
# HELP sglang:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE sglang:inter_token_latency_seconds histogram
sglang:inter_token_latency_seconds_sum{{model_name="m"}} {isum}
sglang:inter_token_latency_seconds_bucket{{le="0.01",model_name="m"}} {i01}
sglang:inter_token_latency_seconds_bucket{{le="0.025",model_name="m"}} {icount}
sglang:inter_token_latency_seconds_bucket{{le="+Inf",model_name="m"}} {icount}
sglang:inter_token_latency_seconds_count{{model_name="m"}} {icount}
"""
BEFORE = dict(t02=2, t04=8, t06=10, count=10, tsum=0.3, i01=50, icount=100, isum=0.9)
AFTER = dict(t02=4, t04=20, t06=28, count=30, tsum=1.0, i01=150, icount=400, isum=3.6)


@pytest.mark.parametrize(("text", "engine"), [(VLLM, "vllm"), (SGLANG, "sglang")])
def test_engine_ttft_and_itl_over_the_window(text, engine):
    d = deltas(parse(text.format(**BEFORE)), parse(text.format(**AFTER)))
    assert d["engine"] == engine
    # 20 first tokens in the window, 0.7 s in all.
    assert d["server_ttft_count"] == 20
    assert d["server_mean_ttft_ms"] == pytest.approx(35.0)
    # Window buckets 0/2/12/18/20: the median lies in (20, 40] ms, 8 of its 10 in → 36 ms;
    # p95 in +Inf: the highest finite bound, as histogram_quantile says.
    assert d["server_p50_ttft_ms"] == pytest.approx(36.0)
    assert d["server_p95_ttft_ms"] == pytest.approx(60.0)
    # 300 gaps, 2.7 s: the newest name's 9 ms, never the deprecated TPOT's numbers.
    assert d["server_mean_itl_ms"] == pytest.approx(9.0)
    # 100 of 300 gaps ≤ 10 ms, all ≤ 25 ms: the 150th is a quarter into (10, 25] ms.
    assert d["server_p50_itl_ms"] == pytest.approx(13.75)


def test_bucket_quantile_edges():
    assert bucket_quantile(0.5, []) is None
    assert bucket_quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None
    assert bucket_quantile(0.5, [(0.1, 4.0), (float("inf"), 4.0)]) == pytest.approx(0.05)


def test_buckets_of_another_layout_give_no_quantile():
    before = parse(VLLM.format(**BEFORE))
    after = parse(VLLM.format(**AFTER).replace('le="0.06"', 'le="0.08"'))
    d = deltas(before, after)
    assert d["server_mean_ttft_ms"] == pytest.approx(35.0)
    assert "server_p50_ttft_ms" not in d


# --- the run's own health -------------------------------------------------------------------------
def test_a_run_records_its_loop_lag_cpu_share_and_late_sends(fixed_server):
    server = fixed_server(ttft_ms=5, itl_ms=2)
    spec = LoadSpec(
        base_url=server.url,
        model="fixed-latency",
        scrape_metrics=False,
        dataset=Dataset(LengthDist("fixed", 8), LengthDist("fixed", 6)),
        stages=(Stage("main", request_rate=40.0, num_requests=20),),
    )
    result = run(spec).to_dict()
    health = result["client_health"]
    lag = health["loop_lag_ms"]
    assert lag["samples"] > 0 and 0 <= lag["p50"] <= lag["p99"] <= lag["max"]
    sends = health["sends"]
    assert sends["scheduled"] == 20 and 0 <= sends["late"] <= 20
    assert sends["late_p99_ms"] >= 0 and sends["late_max_ms"] >= sends["late_p99_ms"]
    cpu = health["cpu"]
    assert 0 <= cpu["loop_thread_share"] and cpu["wall_s"] > 0
    # Tokens per chunk are in the summary, computed from the same records.
    assert result["token_chunks"] >= 20 and result["multi_token_chunk_share"] is not None


def test_shards_merge_to_the_worst_shard():
    quiet = {
        "loop_lag_ms": {"p50": 0.1, "p99": 1.0, "max": 3.0, "samples": 100},
        "sends": {"scheduled": 50, "late": 0, "late_ms": 10.0, "late_p99_ms": 1.0},
        "cpu": {"loop_thread_share": 0.3, "process_share": 0.3, "wall_s": 10.0},
    }
    starved = {
        "loop_lag_ms": {"p50": 4.0, "p99": 60.0, "max": 300.0, "samples": 80},
        "sends": {"scheduled": 50, "late": 9, "late_ms": 10.0, "late_p99_ms": 90.0},
        "cpu": {"loop_thread_share": 0.95, "process_share": 0.97, "wall_s": 10.0},
    }
    merged = merge_health([quiet, starved, None])
    assert merged["loop_lag_ms"] == {"p50": 4.0, "p99": 60.0, "max": 300.0, "samples": 180}
    assert merged["sends"]["late"] == 9 and merged["sends"]["scheduled"] == 100
    assert merged["cpu"]["loop_thread_share"] == 0.95 and merged["shards"] == 2
    assert merge_health([None, None]) is None
