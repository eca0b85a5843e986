"""Two load-generator runs at once, in two threads with an event loop each (as the embedded
worker runs two benchmark jobs): each run's bytes stay its own. The transport once read every
connection of the process into one module-level buffer; a read of one run landed in the
buffer while the other run's parser was still reading it ("Invalid character in chunk size",
spliced JSON). Checked against what each server recorded it sent, request by request.

The race needs a thread switch between a read and its parse. To meet it every time rather
than once in thousands of reads, the tests switch threads right after every read (the worst
schedule the real code must survive): ``recv_stamped`` sleeps a moment after reading."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from benchmarks.loadgen import Dataset, LengthDist, LoadSpec, Stage
from benchmarks.loadgen import transport as loadgen_transport
from benchmarks.loadgen.runner import LoadRun, arun_with
from benchmarks.loadgen.transport import FastTransport, new_event_loop_factory
from tests.benchmarks.loadgen.conftest import FixedServer

# Names of different lengths: bytes of one server's stream read as the other's cannot parse.
MODELS = ("model-a", "a-much-longer-model-name-" * 3)
REQUESTS, CONCURRENCY, TOKENS = 60, 12, 24


@pytest.fixture(scope="module")
def servers():
    started = [
        FixedServer("--ttft-ms", "5", "--itl-ms", "1", "--record-tokens", "--model", model)
        for model in MODELS
    ]
    yield started
    for server in started:
        server.stop()


@pytest.fixture
def thread_switch_after_each_read(monkeypatch):
    real = loadgen_transport.recv_stamped

    def read_then_yield(sock, buffers):
        got = real(sock, buffers)
        time.sleep(0.0002)  # the other thread reads now, before this read is parsed
        return got

    monkeypatch.setattr(loadgen_transport, "recv_stamped", read_then_yield)


def both_at_once(work) -> list:
    """``work(i, barrier)`` in two threads; their results (a raised exception re-raised)."""
    barrier = threading.Barrier(2)
    results: list = [None, None]

    def one(i):
        try:
            results[i] = work(i, barrier)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            barrier.abort()
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


class Aligned(LoadRun):
    """A run whose load starts when the other run's does (both past their readiness checks),
    so that the two overlap on any machine."""

    def __init__(self, spec: LoadSpec, barrier: threading.Barrier):
        super().__init__(spec)
        self.barrier = barrier

    async def _before_epoch(self) -> None:
        await asyncio.to_thread(self.barrier.wait, 60)


def test_two_runs_in_two_threads_keep_their_own_bytes(servers, thread_switch_after_each_read):
    def run(i, barrier):
        spec = LoadSpec(
            base_url=servers[i].url,
            model=MODELS[i],
            stages=(Stage(concurrency=CONCURRENCY, num_requests=REQUESTS),),
            dataset=Dataset(LengthDist("fixed", 16), LengthDist("fixed", TOKENS)),
            scrape_metrics=False,
            record_requests=True,
            ready_timeout_s=20,
            request_timeout_s=20,
        )
        # As run_in_process does, with the start aligned: a loop of this thread's own.
        with asyncio.Runner(loop_factory=new_event_loop_factory()) as runner:
            return runner.run(arun_with(Aligned(spec, barrier)))

    results = both_at_once(run)
    for server, result in zip(servers, results, strict=True):
        errors = [(r["index"], r["error"]) for r in result.records if r["error_class"]]
        assert errors == [] and result.summary["failed"] == 0
        sent = server.stats()["token_times"]
        assert len(result.records) == REQUESTS
        for record in result.records:
            produced = sent[f"loadgen-{record['index']}"]["sends"]
            # Every token the server wrote reached this run, once, and nothing else did.
            assert len(record["chunk_times"]) == len(produced) == TOKENS
            assert record["output_tokens"] == TOKENS and record["token_source"] == "usage"


def expected_body(model: str, tokens: int) -> bytes:
    """The body the fixed-latency server streams for a completion of ``tokens`` tokens."""
    import json

    def event(data) -> bytes:
        return b"data: " + data + b"\n\n"

    def chunk(reason) -> bytes:
        choice = {"index": 0, "text": " tok", "finish_reason": reason}
        body = {"id": "x", "object": "text_completion", "model": model}
        return event(
            json.dumps({**body, "choices": [choice], "usage": None}, separators=(",", ":")).encode()
        )

    usage = {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}
    tail = json.dumps({"id": "x", "object": "text_completion", "choices": [], "usage": usage})
    return chunk(None) * (tokens - 1) + chunk("length") + event(tail.encode()) + event(b"[DONE]")


def test_two_transports_in_two_threads_read_byte_exact(servers, thread_switch_after_each_read):
    """The transport alone: every body read equals, byte for byte, what the server sent."""

    def read_all(i, barrier):
        async def main():
            async with httpx.AsyncClient(transport=FastTransport(), timeout=20) as client:
                url = servers[i].url + "/v1/completions"
                body = {"model": MODELS[i], "prompt": "x", "max_tokens": TOKENS, "stream": True}

                async def one(k):
                    async with client.stream("POST", url, json=body) as response:
                        return b"".join([piece async for piece in response.aiter_raw()])

                await asyncio.to_thread(barrier.wait, 60)
                return await asyncio.gather(*(one(k) for k in range(REQUESTS)))

        with asyncio.Runner(loop_factory=new_event_loop_factory()) as runner:
            return runner.run(main())

    for i, bodies in enumerate(both_at_once(read_all)):
        expected = expected_body(MODELS[i], TOKENS)
        assert sum(body != expected for body in bodies) == 0
