#!/usr/bin/env python3
"""Benchmark of the simulated GPU server (docs/: "Benchmarks").

1. Virtual time: how fast predict() simulates 10,000 requests.
2. Real time: 1,000 concurrent streams against a running simulator (client in a second
   process), and the server's event-loop lag meanwhile (target: p99 under 5 ms).
3. Pacing: closed-loop loads at concurrency 1, 8 and 64 measured by the load generator in a
   second process, against predict() for the same workload: how far the real-time server's
   pace (ITL, TTFT, throughput) is from its own model while a client shares the CPU.

    .venv/bin/python scripts/bench_simulator.py [all|virtual|real|pacing] [--streams 1000]
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


def client(port: int, streams: int, tokens: int, concurrency: int | None = None) -> dict:
    """All streams at once (or a closed loop at ``concurrency``), measured by the panel's own
    load generator."""
    from benchmarks.loadgen import Dataset, LengthDist, LoadSpec, Stage, run

    if concurrency:
        stage = Stage("closed", concurrency=concurrency, num_requests=streams)
    else:
        stage = Stage("burst", concurrency=None, request_rate=float("inf"), num_requests=streams)
    spec = LoadSpec(
        base_url=f"http://127.0.0.1:{port}",
        model=MODEL,
        scrape_metrics=False,
        dataset=Dataset(LengthDist("fixed", 256), LengthDist("fixed", tokens)),
        stages=(stage,),
        # The server's and the client's first request pay one-off costs (imports, the first
        # connection: ~11 ms on this machine) that are not the engine's pace.
        warmup_requests=2 if concurrency else 0,
    )
    result = run(spec).to_dict()
    return {
        "mean_ttft_ms": result["mean_ttft_ms"],
        "mean_itl_ms": result["mean_itl_ms"],
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


def start_server() -> tuple[subprocess.Popen, str]:
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
    for _ in range(200):
        try:
            urllib.request.urlopen(base + "/health", timeout=1)  # noqa: S310
            break
        except OSError:
            time.sleep(0.05)
    return server, base


def run_client(base: str, streams: int, tokens: int, concurrency: int | None = None) -> dict:
    """The load generator in its own process, as a real client would be."""
    port = base.rsplit(":", 1)[1]
    args = ["--port", port, "--streams", str(streams), "--tokens", str(tokens)]
    if concurrency:
        args += ["--concurrency", str(concurrency)]
    out = subprocess.run(
        [sys.executable, __file__, "client", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=raise_fd_limit,
    )
    return json.loads(out.stdout)


def real_time(streams: int, tokens: int) -> None:
    server, base = start_server()
    try:
        idle = get_json(base + "/simulator/loop-lag?reset=1")
        result = run_client(base, streams, tokens)
        lag = get_json(base + "/simulator/loop-lag")
    finally:
        server.terminate()
        server.wait(10)
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


def pacing(tokens: int) -> None:
    """Measured pace against the model's, for closed loops of growing concurrency."""
    from hosts.simulator.predict import Workload, predict

    print("pacing: real-time server (measured by the load generator) vs its model (predict)")
    for concurrency, requests in ((1, 8), (8, 48), (64, 256)):
        server, base = start_server()
        try:
            measured = run_client(base, requests, tokens, concurrency)
        finally:
            server.terminate()
            server.wait(10)
        expected = predict(
            "vllm",
            MODEL,
            {"max_model_len": 8192},
            "h100-sxm",
            Workload(
                num_requests=requests,
                input_tokens=256,
                output_tokens=tokens,
                concurrency=concurrency,
            ),
        )
        rows = (
            ("ITL mean", measured["mean_itl_ms"], expected["itl_ms"]["mean"], "ms"),
            ("TTFT mean", measured["mean_ttft_ms"], expected["ttft_ms"]["mean"], "ms"),
            ("output", measured["output_tok_per_s"], expected["output_throughput"], "tok/s"),
        )
        parts = [
            f"{name} {got:.2f} vs {want:.2f} {unit} ({(got / want - 1) * 100:+.1f} %)"
            for name, got, want, unit in rows
        ]
        print(f"  concurrency {concurrency:>2}: " + "; ".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "mode", nargs="?", default="all", choices=["all", "virtual", "real", "pacing", "client"]
    )
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--port", type=int)
    args = parser.parse_args()
    if args.mode == "client":
        print(json.dumps(client(args.port, args.streams, args.tokens, args.concurrency)))
        return
    if args.mode in ("all", "virtual"):
        virtual(args.requests)
    if args.mode in ("all", "real"):
        real_time(args.streams, args.tokens)
    if args.mode in ("all", "pacing"):
        pacing(args.tokens)


if __name__ == "__main__":
    main()
