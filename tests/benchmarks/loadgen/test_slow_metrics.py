"""An engine whose /metrics answers slowly must not hold back the once-a-second points."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.loadgen import Dataset, LengthDist, LoadSpec, Stage, run
from benchmarks.loadgen.scrape import Scraper

MODEL = "slow-metrics"
METRICS_DELAY_S = 2.5


class SlowMetricsEngine(BaseHTTPRequestHandler):
    """Streams short completions at once; /metrics takes METRICS_DELAY_S and reports how many
    times it was scraped as the number of running requests, so a point shows which scrape
    it carries."""

    protocol_version = "HTTP/1.1"
    scrapes = 0
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def _reply(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            return self._reply(200, b"", "text/plain")
        if self.path == "/v1/models":
            return self._reply(200, json.dumps({"data": [{"id": MODEL}]}).encode())
        if self.path == "/metrics":
            cls = type(self)
            with cls.lock:
                cls.scrapes += 1
                count = cls.scrapes
            time.sleep(METRICS_DELAY_S)
            text = (
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="{MODEL}"}} {count}\n'
            )
            return self._reply(200, text.encode(), "text/plain; version=0.0.4")
        return self._reply(404, b"{}")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/v1/completions":
            return self._reply(404, b"{}")
        time.sleep(0.02)
        chunk = {"id": "x", "object": "text_completion", "model": MODEL}
        events = b"".join(
            b"data: "
            + json.dumps(
                {**chunk, "choices": [{"index": 0, "text": " t", "finish_reason": r}]}
            ).encode()
            + b"\n\n"
            for r in (None, None, None, "length")
        )
        self._reply(200, events + b"data: [DONE]\n\n", "text/event-stream")


@pytest.fixture
def slow_engine():
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowMetricsEngine)
    server.daemon_threads = True
    server.handle_error = lambda request, address: None  # a scrape cut off at the run's end
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.timing
def test_a_slow_metrics_endpoint_does_not_delay_the_ticks(slow_engine, monkeypatch):
    in_flight, most = [0], [0]
    original = Scraper._snapshot

    async def counted(self, at):
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        try:
            return await original(self, at)
        finally:
            in_flight[0] -= 1

    monkeypatch.setattr(Scraper, "_snapshot", counted)
    points = []
    spec = LoadSpec(
        base_url=slow_engine,
        model=MODEL,
        scrape_metrics=True,
        dataset=Dataset(LengthDist("fixed", 8), LengthDist("fixed", 4)),
        stages=(Stage("main", concurrency=2, num_requests=None, duration_s=4.5),),
    )
    result = run(spec, on_progress=lambda point: points.append((time.monotonic(), point)))

    ticks = [point["t"] for _, point in points[:-1]]  # the last point is the partial second
    assert len(ticks) >= 4, ticks
    # One a second on the run's clock and on the wall clock, not one per 2.5-s scrape.
    assert all(abs(t - (i + 1)) < 0.5 for i, t in enumerate(ticks)), ticks
    walls = [wall for wall, _ in points[:-1]]
    assert all(b - a < 1.6 for a, b in zip(walls, walls[1:], strict=False)), walls
    # The points still carry the engine's view: a later point shows a scrape made during
    # the run (the one before the run reported 1).
    running = [point["server_running"] for _, point in points]
    assert running[0] == 1 and max(running) >= 2, running
    assert most[0] == 1  # never two scrapes in flight
    assert result.server["available"] is True and result.summary["completed"] > 0
