"""Distributed load generation on this machine: 1 shard process vs 2 against a fast test server.

Starts benchmarks.loadgen.testserver with a known injected TTFT, then runs the same open-loop
schedule (seeded) once as one shard and once as two shard processes that share an absolute
start time and correct their clocks against Redis TIME (db 13; the local clock if Redis is not
there), merges the shards' records with benchmarks.loadgen.distributed.merge_reports and prints
merged throughput (requests/s, SSE chunks/s), merged TTFT p50/p95/p99 vs the injected TTFT, each
shard's clock offset +/- uncertainty and its send lateness. Processes, not Celery: the Celery
task that wraps run_shard is not written yet (issue 22).

    .venv/bin/python scripts/bench_sharded.py [--rate 600] [--requests 3000] [--ttft-ms 20]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from benchkit import cpu_model  # noqa: E402

from benchmarks.loadgen import Dataset, LengthDist, LoadSpec, Stage  # noqa: E402
from benchmarks.loadgen.distributed import measure_offset, merge_reports, run_shard  # noqa: E402


def reference():
    """Redis TIME when a Redis answers (the common clock of real shards), else this clock."""
    try:
        import redis

        client = redis.Redis(host="127.0.0.1", port=6379, db=13, socket_timeout=1)
        client.ping()

        def read():
            seconds, micros = client.time()
            return seconds + micros / 1e6

        return read, "redis TIME"
    except Exception:  # noqa: BLE001 - no Redis: the local clock is the reference
        return time.time, "local clock (no Redis)"


def shard_process(spec, shard, shards, start_at):
    read, _ = reference()
    offset = measure_offset(read)
    return run_shard(spec, shard, shards, start_at, offset, f"{socket.gethostname()}:{os.getpid()}")


def measure(spec, shards):
    start_at = time.time() + 3.0
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(shards, mp_context=context) as pool:
        futures = [pool.submit(shard_process, spec, s, shards, start_at) for s in range(shards)]
        reports = [f.result(timeout=600) for f in futures]
    merged = merge_reports(reports, shards)
    summary = merged["summary"]
    chunks = sum(len(r.chunk_times) for r in merged["records"] if r.ok)
    return merged, summary, chunks / summary["duration"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=600.0)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=2.0)
    parser.add_argument("--output-tokens", type=int, default=64)
    args = parser.parse_args()
    server = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.loadgen.testserver", "--ttft-ms", str(args.ttft_ms),
         "--itl-ms", str(args.itl_ms)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = "http://127.0.0.1:" + server.stdout.readline().rsplit(":", 1)[1].strip()
        spec = LoadSpec(
            base_url=url,
            model="fixed-latency",
            dataset=Dataset(output_len=LengthDist("fixed", args.output_tokens)),
            stages=(
                Stage("load", concurrency=None, request_rate=args.rate, num_requests=args.requests),
            ),
        )
        print(f"nproc {os.cpu_count()}  cpu {cpu_model()}  load {os.getloadavg()}")
        print(f"reference clock: {reference()[1]}")
        print(
            f"test server: injected TTFT {args.ttft_ms} ms, ITL {args.itl_ms} ms, "
            f"{args.output_tokens} tokens; schedule {args.requests} requests at {args.rate}/s"
        )
        for shards in (1, 2):
            merged, s, chunks_per_s = measure(spec, shards)
            print(
                f"\n{shards} shard(s): {s['completed']} ok, {s['failed']} failed in "
                f"{s['duration']:.2f} s: {s['request_throughput']:.1f} requests/s, "
                f"{chunks_per_s:.0f} SSE chunks/s; TTFT p50 {s['median_ttft_ms']:.1f} / "
                f"p95 {s['p95_ttft_ms']:.1f} / p99 {s['p99_ttft_ms']:.1f} ms "
                f"(injected {args.ttft_ms} ms)"
            )
            for h in merged["shards"]:
                late = h["late_p99_ms"]
                print(
                    f"  shard {h['shard']} {h['hostname']}: sent {h['sent']} done {h['done']} "
                    f"failed {h['failed']}; clock offset {h['offset_s'] * 1000:+.3f} "
                    f"± {h['offset_uncertainty_s'] * 1000:.3f} ms; send lateness p99 "
                    f"{'n/a' if late is None or math.isnan(late) else f'{late:.1f} ms'}"
                    f"{'  BEHIND SCHEDULE' if h['behind'] else ''}"
                )
        print(f"\nload after: {os.getloadavg()}")
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
