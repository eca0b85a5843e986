#!/usr/bin/env python3
"""Benchmark of the simulated GPU server (README: "Benchmarks").

1. Virtual time: how fast predict() simulates 10,000 requests.
2. Real time: 1,000 concurrent streams against a running simulator (client in a second
   process), and the server's event-loop lag meanwhile (target: p99 under 5 ms).

    .venv/bin/python scripts/bench_simulator.py [--streams 1000] [--tokens 128]
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def virtual(requests: int) -> None:
    from hosts.simulator.predict import Workload, predict

    workload = Workload(num_requests=requests, input_tokens=512, output_tokens=128, concurrency=64)
    start = time.perf_counter()
    result = predict("vllm", MODEL, {"max_model_len": 8192}, "h100-sxm", workload)
    wall = time.perf_counter() - start
    print(
        f"virtual time: {requests:,} requests ({result['total_output_tokens']:,} output tokens,"
        f" {result['duration_s']:.1f} s of simulated H100 time) simulated in {wall:.2f} s"
    )
    print(
        f"  predicted: {result['output_throughput']:.0f} output tok/s, TTFT p50 "
        f"{result['ttft_ms']['p50']:.0f} ms, ITL p50 {result['itl_ms']['p50']:.1f} ms"
    )


def client(port: int, streams: int, tokens: int) -> dict:
    """All streams at once, measured by the panel's own load generator."""
    from benchmarks.loadgen import Dataset, LengthDist, LoadSpec, Stage, run

    spec = LoadSpec(
        base_url=f"http://127.0.0.1:{port}",
        model=MODEL,
        scrape_metrics=False,
        dataset=Dataset(LengthDist("fixed", 256), LengthDist("fixed", tokens)),
        stages=(Stage("burst", concurrency=None, request_rate=float("inf"), num_requests=streams),),
    )
    result = run(spec).to_dict()
    return {
        "streams": streams,
        "completed": result["completed"],
        "elapsed_s": result["duration"],
        "output_tok_per_s": result["output_throughput"],
        "ttft_p50_ms": result["median_ttft_ms"],
        "itl_p50_ms": result["median_itl_ms"],
        "errors": sorted(result["errors_by_class"]),
    }


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - localhost only
        return json.loads(response.read())


def real_time(streams: int, tokens: int) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hosts.simulator",
            "vllm",
            MODEL,
            "--max-model-len",
            "8192",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=raise_fd_limit,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(base + "/health", timeout=1)  # noqa: S310
                break
            except OSError:
                time.sleep(0.05)
        idle = get_json(base + "/simulator/loop-lag?reset=1")
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "client",
                "--port",
                str(port),
                "--streams",
                str(streams),
                "--tokens",
                str(tokens),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            preexec_fn=raise_fd_limit,
        )
        lag = get_json(base + "/simulator/loop-lag")
    finally:
        server.terminate()
        server.wait(10)
    result = json.loads(out.stdout)
    print(
        f"real time: {result['completed']}/{streams} streams of {tokens} tokens in "
        f"{result['elapsed_s']:.1f} s, {result['output_tok_per_s']:.0f} output tok/s, "
        f"TTFT p50 {result['ttft_p50_ms']:.0f} ms, ITL p50 {result['itl_p50_ms']:.1f} ms"
    )
    print(
        f"  event-loop lag under load: p50 {lag['p50_ms']:.2f} ms, p99 {lag['p99_ms']:.2f} ms,"
        f" max {lag['max_ms']:.2f} ms over {lag['samples']} samples (idle before: p99 "
        f"{(idle['p99_ms'] or 0):.2f} ms)"
    )
    if result["errors"]:
        print("  errors:", result["errors"])
    from hosts.simulator.predict import Workload, predict

    burst = Workload(
        num_requests=streams,
        input_tokens=256,
        output_tokens=tokens,
        concurrency=None,
        request_rate=float("inf"),
    )
    expected = predict("vllm", MODEL, {"max_model_len": 8192}, "h100-sxm", burst)
    print(
        f"  virtual time, same workload: {expected['duration_s']:.1f} s, "
        f"{expected['output_throughput']:.0f} output tok/s, TTFT p50 "
        f"{expected['ttft_ms']['p50']:.0f} ms, ITL p50 {expected['itl_ms']['p50']:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "mode", nargs="?", default="all", choices=["all", "virtual", "real", "client"]
    )
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--port", type=int)
    args = parser.parse_args()
    if args.mode == "client":
        print(json.dumps(client(args.port, args.streams, args.tokens)))
        return
    if args.mode in ("all", "virtual"):
        virtual(args.requests)
    if args.mode in ("all", "real"):
        real_time(args.streams, args.tokens)


if __name__ == "__main__":
    main()
