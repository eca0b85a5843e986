#!/usr/bin/env python3
"""What one telemetry request to an agent costs the polling process (issue 22): httpx's
``AsyncClient`` (one per host, as the poll used it before) against the aiohttp session the
poll uses now (``hosts.services.telemetry_loop``), side by side against the fleet simulator
(``hosts.agent.fleet``) in another process. Each round asks every host once, concurrently;
the number is this process's CPU time (user + system) per request, the JSON parse included.

    .venv/bin/python scripts/bench_agent_fetch.py [--hosts 125] [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import benchkit  # noqa: E402 - after the path it is found on

TOKEN = "bench-" + "t" * 32


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def with_httpx(ports: list[int], rounds: int) -> tuple[float, float]:
    import httpx

    headers = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"}
    clients = [
        httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            headers=headers,
            trust_env=False,
            limits=httpx.Limits(max_connections=2, max_keepalive_connections=1),
        )
        for port in ports
    ]

    async def one(client):
        return (await client.get("/v1/telemetry")).json()

    try:
        await asyncio.gather(*(one(c) for c in clients))  # connect first: not measured
        c0, t0 = cpu(), time.monotonic()
        for _ in range(rounds):
            await asyncio.gather(*(one(c) for c in clients))
        return (cpu() - c0) / (rounds * len(ports)) * 1000, time.monotonic() - t0
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))


async def with_aiohttp(ports: list[int], rounds: int) -> tuple[float, float]:
    import aiohttp

    headers = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"}
    timeout = aiohttp.ClientTimeout(total=10)
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=2, keepalive_timeout=60)
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:

        async def one(port):
            async with session.get(
                f"http://127.0.0.1:{port}/v1/telemetry",
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
            ) as response:
                return json.loads(await response.read())

        await asyncio.gather(*(one(p) for p in ports))
        c0, t0 = cpu(), time.monotonic()
        for _ in range(rounds):
            await asyncio.gather(*(one(p) for p in ports))
        return (cpu() - c0) / (rounds * len(ports)) * 1000, time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=125, help="simulated agents (a shard's)")
    parser.add_argument("--gpus", default="h100-sxm:8")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=2, help="alternations of the two clients")
    parser.add_argument("--base-port", type=int, default=23000)
    args = parser.parse_args()
    print(f"nproc {os.cpu_count()}, CPU {benchkit.cpu_model()}, load {os.getloadavg()}")
    fleet = subprocess.Popen(
        [sys.executable, "-m", "hosts.agent.fleet", "--hosts", str(args.hosts)]
        + ["--gpus", args.gpus, "--base-port", str(args.base_port), "--token", TOKEN],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        if "ready" not in fleet.stdout.readline():
            raise SystemExit("the fleet simulator did not start")
        ports = [args.base_port + i for i in range(args.hosts)]
        print(f"{args.hosts} agents × {args.gpus}, {args.rounds} rounds each")
        for _ in range(args.repeat):
            for name, run in (("httpx", with_httpx), ("aiohttp", with_aiohttp)):
                per_request, wall = asyncio.run(run(ports, args.rounds))
                print(f"{name:8s} {per_request:.3f} ms of CPU a request  ({wall:.2f} s wall)")
    finally:
        fleet.terminate()
        fleet.wait(10)


if __name__ == "__main__":
    main()
