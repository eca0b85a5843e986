"""The load generator against a server whose latencies are known."""

import asyncio
import json
import statistics
import sys
import threading
import time

import pytest

from benchmarks.loadgen import (
    Dataset,
    LengthDist,
    LoadGenError,
    LoadRun,
    LoadSpec,
    SpecError,
    Stage,
    Trace,
    run,
)

MODEL = "fixed-latency"


def intervals(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def spec(server, **kw):
    defaults = dict(
        base_url=server.url,
        model=MODEL,
        scrape_metrics=False,
        dataset=Dataset(LengthDist("fixed", 8), LengthDist("fixed", 10)),
        stages=(Stage("main", concurrency=4, num_requests=20),),
    )
    defaults.update(kw)
    return LoadSpec(**defaults)


def test_ttft_and_itl_match_what_the_server_injects(fixed_server):
    server = fixed_server(ttft_ms=40, itl_ms=8, record_tokens=True)
    result = run(spec(server, warmup_requests=2, record_requests=True)).to_dict()
    assert result["completed"] == 20 and result["failed"] == 0
    assert result["token_count_source"] == "usage" and result["total_output_tokens"] == 200
    assert result["max_concurrent_requests"] == 4
    assert result["timestamps"] == ("kernel" if sys.platform == "linux" else "read")
    # Never below what the server injects: it never sends early, and a stamp is never earlier
    # than the bytes it belongs to.
    assert result["records"] and all(
        r["first_token"] - r["sent"] >= 0.0399 for r in result["records"]
    ), result["records"]
    # The client measures what the server produced, which a busy machine makes later than the
    # nominal 40 ms and 8 ms now and then: compare with the server's own send times.
    sent = server.stats()["token_times"]
    ttft_errors, itl_errors = [], []
    for record in result["records"]:
        produced = sent[f"loadgen-{record['index']}"]
        done = [after for _, after in produced["sends"]]
        ttft_errors.append(record["first_token"] - record["sent"] - (done[0] - produced["arrived"]))
        assert len(record["chunk_times"]) == len(done) == 10
        measured = intervals(record["chunk_times"])
        itl_errors += [a - b for a, b in zip(measured, intervals(done), strict=True)]
    assert abs(statistics.median(ttft_errors)) < 0.003, ttft_errors
    assert abs(statistics.median(itl_errors)) < 0.001, itl_errors


def blocked_request(server, request_id: str):
    """One request whose event loop is stuck (no Python code reads the socket) from the
    response head until 60 ms after it was sent. Returns the record, its epoch, when the loop
    was free again (``CLOCK`` time) and the transport's stamp source."""
    from benchmarks.loadgen.client import make_client, request_body, send
    from benchmarks.loadgen.dataset import Prompt
    from benchmarks.loadgen.stats import RequestRecord
    from benchmarks.loadgen.transport import CLOCK, FastTransport

    async def main():
        transport = FastTransport()
        async with make_client(10.0, None, transport) as client:
            body = request_body("/v1/completions", MODEL, Prompt([1] * 8, 8, 3, None), False)
            record = RequestRecord(0, "s", False, 8, 3, scheduled=0.0)
            epoch = CLOCK()
            task = asyncio.create_task(
                send(
                    client,
                    server.url + "/v1/completions",
                    body,
                    record,
                    {"X-Request-Id": request_id},
                    epoch,
                )
            )
            while record.status is None:  # until the response head is back
                await asyncio.sleep(0.001)
            time.sleep(max(0.0, record.sent + 0.06 - (CLOCK() - epoch)))
            unblocked = CLOCK()
            await task
            return record, epoch, unblocked, transport.stamp_source

    return asyncio.run(main())


@pytest.mark.skipif(sys.platform != "linux", reason="kernel receive stamps are Linux's")
def test_a_blocked_client_loop_does_not_land_in_ttft(fixed_server):
    """The stamps belong to the bytes: the event loop is stuck from the response head to
    60 ms while the first token (due at 40 ms) arrives, and its stamp is still the moment the
    server sent it, not when it was read. Checked against the server's own send times, so a
    late server or a slow client cannot fail it."""
    # Tokens 200 ms apart: once free, the loop has that long to read the first one before the
    # second arrives (unread bytes merge in the kernel and take the later stamp).
    server = fixed_server(ttft_ms=40, itl_ms=200, record_tokens=True)
    for attempt in range(5):
        record, epoch, unblocked, source = blocked_request(server, f"blocked-{attempt}")
        assert record.error_class is None, record.error
        assert source == "kernel"
        produced = server.stats()["token_times"][f"blocked-{attempt}"]
        sends = produced["sends"]
        assert len(record.chunk_times) == len(sends) == 3
        assert record.first_token == record.chunk_times[0]
        assert record.sent + epoch <= produced["arrived"] + 1e-4
        if unblocked >= sends[1][0]:
            continue  # a machine so busy that the loop woke after the second token: retry
        # Each stamp lies within the server's send of that token (give or take the clock
        # conversion's microseconds).
        for stamp, (before, after) in zip(record.chunk_times, sends, strict=True):
            assert before - 1e-3 <= stamp + epoch <= after + 1e-3, (stamp + epoch, before, after)
        if sends[0][1] < unblocked:
            return  # and the first token did arrive while the loop was stuck
    pytest.fail("in five tries the first token never arrived while the client loop was stuck")


@pytest.mark.timing
def test_open_loop_rate_is_accurate(fixed_server):
    server = fixed_server(ttft_ms=1, itl_ms=1)
    s = spec(
        server,
        dataset=Dataset(LengthDist("fixed", 4), LengthDist("fixed", 1)),
        stages=(Stage("poisson", concurrency=None, request_rate=400, num_requests=2000),),
        record_requests=True,
    )
    records = run(s).records
    sent = sorted(r["sent"] for r in records)
    achieved = (len(sent) - 1) / (sent[-1] - sent[0])
    assert abs(achieved - 400) / 400 < 0.02, achieved
    # Poisson: the gaps of the arrival schedule have a coefficient of variation of about 1.
    # (Measured on the schedule: gaps between actual sends also carry this VM's stalls, which
    # bunch a few sends together; the rate above and the lag below cover the sends.)
    scheduled = sorted(r["scheduled"] for r in records)
    gaps = [b - a for a, b in zip(scheduled, scheduled[1:], strict=False)]
    mean = sum(gaps) / len(gaps)
    cv = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean
    assert 0.85 < cv < 1.15, cv
    lags = sorted(r["sent"] - r["scheduled"] for r in records)
    assert lags[len(lags) // 2] < 0.02, lags[len(lags) // 2]  # sends follow the schedule


def test_token_counts_without_usage_come_from_chunks(fixed_server):
    server = fixed_server(mode="no_usage")
    result = run(spec(server)).to_dict()
    assert result["token_count_source"] == "chunks" and result["total_output_tokens"] == 200


@pytest.mark.timing
def test_goodput(fixed_server):
    server = fixed_server(ttft_ms=30, itl_ms=2)
    strict = run(spec(server, goodput={"ttft": 10})).to_dict()
    loose = run(spec(server, goodput={"ttft": 200, "tpot": 50})).to_dict()
    assert strict["request_goodput"] == 0 and strict["goodput_share"] == 0
    assert loose["goodput_share"] == 1.0 and loose["request_goodput"] > 0


def test_stages_and_warmup(fixed_server):
    server = fixed_server(ttft_ms=5, itl_ms=2)
    points = []
    s = spec(
        server,
        warmup_requests=5,
        stages=(
            Stage("low", concurrency=1, num_requests=4),
            Stage("peak", concurrency=None, request_rate=50, max_concurrency=8, num_requests=30),
        ),
    )
    result = run(s, on_progress=points.append).to_dict()
    assert result["warmup_requests"] == 5 and result["completed"] == 34
    assert result["stages"]["low"]["completed"] == 4
    assert result["stages"]["peak"]["completed"] == 30
    assert result["stages"]["low"]["max_concurrent_requests"] == 1
    assert result["stages"]["peak"]["max_concurrent_requests"] <= 8
    assert points and {p["stage"] for p in result["timeline"]} <= {"warmup", "low", "peak"}
    assert result["timeline"][-1]["completed"] == 34


@pytest.mark.parametrize(
    ("mode", "error_class"),
    [
        ("error_500", "http_5xx"),
        ("malformed", "client_error"),  # not JSON: what a spliced read looks like
        ("no_done", "malformed_stream"),
        ("json", "malformed_stream"),
        ("close", "connection"),
    ],
)
def test_failures_are_counted_by_class(fixed_server, mode, error_class):
    server = fixed_server(mode=mode)
    result = run(spec(server)).to_dict()
    assert result["failed"] == 20 and result["completed"] == 0
    assert result["errors_by_class"] == {error_class: 20}


def test_timeouts(fixed_server):
    server = fixed_server(mode="hang")
    result = run(
        spec(server, request_timeout_s=0.3, stages=(Stage("s", concurrency=4, num_requests=4),))
    ).to_dict()
    assert result["errors_by_class"] == {"timeout": 4}


def test_stops_early_above_the_error_rate(fixed_server):
    server = fixed_server(error_every=2)
    result = run(
        spec(
            server,
            max_error_rate=0.2,
            min_requests_for_error_rate=10,
            stages=(Stage("s", concurrency=2, num_requests=200),),
        )
    ).to_dict()
    assert result["stopped_early"] and "error rate" in result["stopped_early"]
    assert result["completed"] + result["failed"] < 200


def test_unreachable_server_is_a_clear_error():
    with pytest.raises(LoadGenError, match="cannot reach a ready server at http://127.0.0.1:9"):
        run(LoadSpec(base_url="http://127.0.0.1:9", model="m", ready_timeout_s=0.5))


def test_unknown_model_is_a_clear_error(fixed_server):
    server = fixed_server()
    with pytest.raises(LoadGenError, match="model 'nope' is not served"):
        run(spec(server, model="nope"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_url": "localhost:8000"}, "not an http"),
        ({"endpoint": "/generate"}, "endpoint"),
        ({"stages": (Stage("s", concurrency=0),)}, "concurrency >= 1"),
        ({"stages": (Stage("s", concurrency=None, request_rate=-1),)}, "request_rate"),
        ({"goodput": {"latency": 5}}, "unknown metric"),
        ({"dataset": Dataset(LengthDist("uniform", 10))}, "uniform needs"),
    ],
)
def test_bad_specs_are_refused(kwargs, message):
    base = dict(base_url="http://127.0.0.1:8000", model="m")
    with pytest.raises(SpecError, match=message):
        LoadSpec(**{**base, **kwargs}).validate()


def test_cancel_keeps_partial_results(fixed_server):
    server = fixed_server(ttft_ms=5, itl_ms=20)
    load = LoadRun(
        spec(
            server,
            dataset=Dataset(LengthDist("fixed", 4), LengthDist("fixed", 50)),
            stages=(Stage("s", concurrency=4, num_requests=1000),),
        )
    )
    threading.Timer(1.5, load.cancel).start()
    result = asyncio.run(load.execute()).to_dict()
    assert result["cancelled"] is True
    assert 0 < result["completed"] < 1000 and result["failed"] == 0
    assert result["cancelled_requests"] >= 1


@pytest.mark.timing
def test_trace_replay(fixed_server, tmp_path):
    server = fixed_server(ttft_ms=2, itl_ms=1)
    trace = tmp_path / "trace.jsonl"
    rows = [
        {"timestamp": 100 + i * 0.2, "input_tokens": 5 + i, "output_tokens": 3} for i in range(6)
    ]
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    result = run(spec(server, trace=Trace(str(trace), time_scale=0.5), record_requests=True))
    sent = [r["sent"] for r in result.records]
    gaps = [b - a for a, b in zip(sent, sent[1:], strict=False)]
    assert all(abs(g - 0.1) < 0.02 for g in gaps), gaps
    assert [r["input_len"] for r in result.records] == [5, 6, 7, 8, 9, 10]
    assert result.summary["total_output_tokens"] == 18


def test_result_json_has_vllm_bench_fields(fixed_server):
    server = fixed_server()
    data = json.loads(run(spec(server)).to_json())
    for key in (
        "date",
        "backend",
        "model_id",
        "num_prompts",
        "request_rate",
        "burstiness",
        "max_concurrency",
        "duration",
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
        "max_concurrent_requests",
        "max_output_tokens_per_s",
    ):
        assert key in data, key
    assert data["p99_9_ttft_ms"] >= data["p99_ttft_ms"] >= data["median_ttft_ms"]


def test_blocking_run_can_be_called_from_a_worker_thread(fixed_server):
    """Celery tasks call run() from a thread that has no event loop."""
    server = fixed_server()
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("r", run(spec(server))))
    thread.start()
    thread.join(60)
    assert out["r"].summary["completed"] == 20
