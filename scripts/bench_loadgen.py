#!/usr/bin/env python3
"""How right the load generator's clock is (docs/: "Benchmarks").

A fixed-latency server (benchmarks/loadgen/testserver.py, in its own process) sends the first
token TTFT ms after each request arrives and one token every ITL ms after that. Everything a
client measures above those numbers is the client's error. The same open-loop load (Poisson,
~256 streams in flight) is measured by our load generator and by an aiohttp client written the
way `vllm bench serve` does it, one after the other in this run.

    .venv/bin/python scripts/bench_loadgen.py [--streams 256] [--ttft-ms 50] [--itl-ms 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.loadgen import Dataset, LengthDist, LoadSpec, Stage, run  # noqa: E402
from benchmarks.loadgen.arrivals import open_loop_offsets  # noqa: E402
from benchmarks.loadgen.stats import percentile  # noqa: E402


async def vllm_style_client(url: str, model: str, offsets: list[float], tokens: int) -> dict:
    """What `vllm bench serve` does (lib/endpoint_request_func.py): aiohttp, one session,
    perf_counter before the POST, TTFT at the first data message with choices, ITL between
    chunks."""
    import aiohttp

    ttfts, itls, chunks, by_id = [], [], 0, {}
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    timeout = aiohttp.ClientTimeout(total=6 * 60 * 60)

    async def one(index: int, delay: float):
        nonlocal chunks
        await asyncio.sleep(delay)
        body = {
            "model": model,
            "prompt": [1000] * 16,
            "max_tokens": tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        st = time.perf_counter()
        most_recent = st
        ttft = 0.0
        async with session.post(
            url, json=body, headers={"X-Request-Id": f"aiohttp-{index}"}
        ) as response:
            async for raw in response.content:
                line = raw.strip()
                if not line:
                    continue
                data = line.decode().removeprefix("data: ")
                if data == "[DONE]":
                    continue
                timestamp = time.perf_counter()
                message = json.loads(data)
                if message.get("choices"):
                    chunks += 1
                    if ttft == 0.0:
                        ttft = timestamp - st
                        ttfts.append(ttft)
                        by_id[f"aiohttp-{index}"] = ttft
                    else:
                        itls.append(timestamp - most_recent)
                    most_recent = timestamp

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter()
        await asyncio.gather(*(one(i, d) for i, d in enumerate(offsets)))
        elapsed = time.perf_counter() - start
    return {
        "ttft": sorted(t * 1000 for t in ttfts),
        "itl": sorted(t * 1000 for t in itls),
        "chunks_per_s": chunks / elapsed,
        "by_id": by_id,
    }


def client_error(measured: dict[str, float], actual: dict[str, float]) -> str:
    """Per request: measured TTFT minus the TTFT the server actually produced (its own
    lateness taken out), in ms."""
    errors = sorted((measured[k] - actual[k]) * 1000 for k in measured if k in actual)
    return (
        f"client-only TTFT error p50 {percentile(errors, 50):5.2f} ms, p99 "
        f"{percentile(errors, 99):5.2f} ms over {len(errors)} requests"
    )


def report(name: str, ttft: list[float], itl: list[float], chunks_per_s: float, args) -> None:
    print(
        f"{name:<30} TTFT error p50 {percentile(ttft, 50) - args.ttft_ms:6.2f} ms, "
        f"p99 {percentile(ttft, 99) - args.ttft_ms:6.2f} ms | ITL error p50 "
        f"{percentile(itl, 50) - args.itl_ms:6.2f} ms, p99 {percentile(itl, 99) - args.itl_ms:6.2f}"
        f" ms | {chunks_per_s:8.0f} chunks/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.loadgen.testserver",
            "--port",
            str(port),
            "--ttft-ms",
            str(args.ttft_ms),
            "--itl-ms",
            str(args.itl_ms),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    server.stdout.readline()  # "listening on ..."
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        # One core each: the server's work never preempts the client's measuring loop.
        os.sched_setaffinity(server.pid, {cpus[0]})
        os.sched_setaffinity(0, set(cpus[1:]))
    base = f"http://127.0.0.1:{port}"
    # Open loop sized so that about --streams requests are in flight.
    per_request = (args.ttft_ms + args.itl_ms * (args.tokens - 1)) / 1000
    rate = args.streams / per_request
    try:
        spec = LoadSpec(
            base_url=base,
            model="fixed-latency",
            scrape_metrics=False,
            warmup_requests=32,
            record_requests=True,
            stages=(
                Stage("bench", concurrency=None, request_rate=rate, num_requests=args.requests),
            ),
            dataset=Dataset(LengthDist("fixed", 16), LengthDist("fixed", args.tokens)),
        )
        outcome = run(spec)
        result = outcome.to_dict()
        ours_by_id = {
            f"loadgen-{r['index']}": r["first_token"] - r["sent"]
            for r in outcome.records
            if r["first_token"] is not None and not r["warmup"]
        }
        server_side = json.loads(urllib.request.urlopen(base + "/stats").read())  # noqa: S310
        print(
            f"load: {rate:.0f} req/s Poisson, ~{args.streams} streams in flight, "
            f"{args.tokens} tokens each, injected TTFT {args.ttft_ms:g} ms, ITL "
            f"{args.itl_ms:g} ms"
        )
        print(
            f"{'ours (httpx + fast transport)':<30} TTFT error p50 "
            f"{result['median_ttft_ms'] - args.ttft_ms:6.2f} ms, p99 "
            f"{result['p99_ttft_ms'] - args.ttft_ms:6.2f} ms | ITL error p50 "
            f"{result['median_itl_ms'] - args.itl_ms:6.2f} ms, p99 "
            f"{result['p99_itl_ms'] - args.itl_ms:6.2f} ms | "
            f"{result['total_output_tokens'] / result['duration']:8.0f} chunks/s "
            f"(max {result['max_output_tokens_per_s']:.0f}/s), "
            f"max concurrency {result['max_concurrent_requests']}"
        )
        print(
            f"{'':<30} (the server itself sent first tokens late by p50 "
            f"{server_side['first_token_late_p50_ms']:.2f} ms, p99 "
            f"{server_side['first_token_late_p99_ms']:.2f} ms)"
        )
        print(f"{'':<30} {client_error(ours_by_id, server_side['actual_ttft_s'])}")
        late = sorted(
            (r["sent"] - r["scheduled"]) * 1000 for r in outcome.records if not r["warmup"]
        )
        print(
            f"{'':<30} timestamps: {result['timestamps']}; client-side queueing (scheduled "
            f"→ sent) p50 {percentile(late, 50):.2f} ms, p99 {percentile(late, 99):.2f} ms"
        )
        offsets = open_loop_offsets(args.requests, rate, 1.0, random.Random(0))
        theirs = asyncio.run(
            vllm_style_client(base + "/v1/completions", "fixed-latency", offsets, args.tokens)
        )
        report(
            "vllm-bench-style (aiohttp)",
            theirs["ttft"],
            theirs["itl"],
            theirs["chunks_per_s"],
            args,
        )
        server_side = json.loads(urllib.request.urlopen(base + "/stats").read())  # noqa: S310
        print(f"{'':<30} {client_error(theirs['by_id'], server_side['actual_ttft_s'])}")
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
