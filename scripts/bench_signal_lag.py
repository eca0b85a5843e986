#!/usr/bin/env python3
"""How far the panel's live signals lag the engine (docs/: "Scaling"; issue 20 asks < 3 s).

Starts a simulated vLLM engine with a small batch (``--max-num-seqs``), a throwaway SQLite
database with one online host and one running deployment pointing at it, and a "beat"
thread calling ``poll_signals()`` every ``--interval`` seconds on a fixed schedule, as
Celery beat does. Each trial sends a burst of streaming requests, so the engine's
``vllm:num_requests_waiting`` jumps; one watcher scrapes the engine's /metrics every 20 ms
for the moment the jump shows there, another reads the panel's signals
(``latest_signals``, what the pages and /metrics read) every 20 ms for the moment they show
it. The lag is the difference. The burst is then cancelled (the engine aborts requests whose
client went away) and the queue left to empty before the next trial.

    .venv/bin/python scripts/bench_signal_lag.py [--trials 10] [--interval 1.0]

Prints lag p50 / p95 / max, how long each poll took, and the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from benchkit import cpu_model, pct  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
WATCH_EVERY_S = 0.02


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--interval", type=float, default=1.0, help="beat interval, seconds")
    p.add_argument("--burst", type=int, default=12, help="requests sent at once")
    p.add_argument("--max-num-seqs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=10.0, help="give up on a trial after")
    return p.parse_args()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def setup(scratch: Path):
    os.environ["VAR_DIR"] = str(scratch)
    os.environ.pop("REDIS_URL", None)
    os.environ["DATABASE_URL"] = f"sqlite:///{scratch / 'lag.sqlite3'}"
    os.environ.setdefault("SECRET_KEY", "bench-only-" + "x" * 50)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def start_engine(port: int, max_num_seqs: int) -> subprocess.Popen:
    import httpx

    cmd = [sys.executable, "-m", "hosts.simulator", "vllm", MODEL, "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--max-num-seqs", str(max_num_seqs)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the simulated engine did not become healthy in 60 s")


def make_deployment(port: int):
    from hosts.choices import DeploymentStatus, HostStatus
    from hosts.models import Deployment, EngineConfig, Host

    host = Host.objects.create(
        name="bench",
        address="127.0.0.1",
        transport="agent",
        port=9100,
        agent_token="x",  # noqa: S106 - a throwaway host
    )
    host.status = HostStatus.ONLINE
    host.save()
    d = Deployment.objects.create(
        host=host, name="llama", engine="vllm", engine_version="0.11.0", model=MODEL, port=port
    )
    d.active_config = EngineConfig.objects.create_next(d, {"max_num_seqs": 2})
    d.status = DeploymentStatus.RUNNING
    d.save()
    return d


class Beat(threading.Thread):
    """``poll_signals()`` on a fixed schedule; a tick missed while a poll ran is skipped."""

    def __init__(self, interval: float):
        super().__init__(daemon=True)
        self.interval = interval
        self.stop = threading.Event()
        self.durations: list[float] = []

    def run(self):
        from django.db import connection

        from scaling.services.signals import poll_signals

        next_tick = time.monotonic()
        try:
            while not self.stop.is_set():
                started = time.monotonic()
                poll_signals()
                self.durations.append(time.monotonic() - started)
                next_tick += self.interval
                while next_tick < time.monotonic():
                    next_tick += self.interval
                self.stop.wait(next_tick - time.monotonic())
        finally:
            connection.close()


def engine_waiting(client, url: str) -> tuple[float, float]:
    from scaling.planning.expo import parse_snapshot

    gauges = parse_snapshot(client.get(url).text)["gauges"]
    return gauges.get("waiting", 0.0), gauges.get("running", 0.0)


def trial(args, engine_url: str, deployment_id: int) -> float | None:
    import httpx

    from scaling.services.signals import latest_signals

    threshold = max((args.burst - args.max_num_seqs) // 2, 1)
    cancel = threading.Event()
    seen = {}

    def one_request(client):
        body = {"model": MODEL, "prompt": "hello " * 200, "max_tokens": 2000, "stream": True}
        try:
            with client.stream("POST", engine_url + "/v1/completions", json=body) as r:
                for _ in r.iter_raw():
                    if cancel.is_set():
                        return
        except httpx.HTTPError:
            pass

    def watch_engine(client):
        while not cancel.is_set() and "engine" not in seen:
            if engine_waiting(client, engine_url + "/metrics")[0] >= threshold:
                seen["engine"] = time.monotonic()
            time.sleep(WATCH_EVERY_S)

    # Start from a panel that shows the queue empty, so a jump it shows is this burst's.
    settle = time.monotonic() + args.timeout
    while time.monotonic() < settle:
        latest = latest_signals([deployment_id]).get(deployment_id)
        if latest and (latest[1].requests_waiting or 0) < threshold:
            break
        time.sleep(WATCH_EVERY_S)
    # Bursts come at any moment of the beat's second, not just after a poll.
    time.sleep(random.uniform(0, args.interval))
    limits = httpx.Limits(max_connections=args.burst + 4)
    with (
        httpx.Client(timeout=30, limits=limits) as client,
        ThreadPoolExecutor(args.burst + 1) as pool,
    ):
        watcher = pool.submit(watch_engine, client)
        requests = [pool.submit(one_request, client) for _ in range(args.burst)]
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            latest = latest_signals([deployment_id]).get(deployment_id)
            waiting = latest[1].requests_waiting if latest else None
            if waiting is not None and waiting >= threshold:
                seen["panel"] = time.monotonic()
                break
            time.sleep(WATCH_EVERY_S)
        cancel.set()
        watcher.result()
        for r in requests:
            r.result()
        # Let the engine notice the closed streams and empty its queue. (Its running gauge
        # keeps the aborted batch until the next step, as vLLM's does: not waited for.)
        settle = time.monotonic() + 10
        while engine_waiting(client, engine_url + "/metrics")[0] > 0:
            if time.monotonic() > settle:
                break
            time.sleep(0.05)
        time.sleep(args.interval)  # the panel sees the empty queue before the next burst
    if "panel" not in seen or "engine" not in seen:
        return None
    return max(seen["panel"] - seen["engine"], 0.0)


def main():
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="signal-lag-") as scratch:
        setup(Path(scratch))
        port = free_port()
        engine = start_engine(port, args.max_num_seqs)
        beat = Beat(args.interval)
        try:
            d = make_deployment(port)
            beat.start()
            lags, missed = [], 0
            for _ in range(args.trials):
                lag = trial(args, f"http://127.0.0.1:{port}", d.pk)
                if lag is None:
                    missed += 1
                else:
                    lags.append(lag)
        finally:
            beat.stop.set()
            beat.join(timeout=10)
            engine.terminate()
            engine.wait(timeout=10)
    print(f"machine: {os.cpu_count()} CPUs, {cpu_model()}, Python {platform.python_version()}")
    print(
        f"beat interval {args.interval:g} s; burst of {args.burst} requests on a simulated "
        f"vLLM with --max-num-seqs {args.max_num_seqs}; {args.trials} trials"
    )
    if lags:
        print(
            f"signal lag behind the engine: p50 {statistics.median(lags):.2f} s, "
            f"p95 {pct(lags, 95):.2f} s, max {max(lags):.2f} s ({len(lags)} measured)"
        )
    if missed:
        print(f"{missed} trial(s) never showed the jump on the panel within {args.timeout:g} s")
    if beat.durations:
        print(
            f"poll_signals(): median {statistics.median(beat.durations) * 1000:.0f} ms, "
            f"max {max(beat.durations) * 1000:.0f} ms over {len(beat.durations)} polls"
        )
    return 1 if missed or not lags else 0


if __name__ == "__main__":
    sys.exit(main())
