#!/usr/bin/env python3
"""What a request costs the production web tier before any page work (issue 22): one
``python -m controlpanel.webserver`` worker (uvicorn, Django's ASGI handler, the whole
middleware chain) on a fresh PostgreSQL database and Redis, ``--clients`` concurrent
keep-alive clients for ``--seconds`` on each of /healthz (one ``SELECT 1``), the login page
(a template, sessions, CSRF) and a static file (answered by WhiteNoise near the top of the
chain). Prints requests/s and the server's CPU per request (its process's user + system
time over the window / requests): the floor under every page's own cost.

    .venv/bin/python scripts/bench_request_floor.py [--clients 20] [--seconds 5]

Windows are short on purpose: the worker is recycled after ~10,000 requests
(controlpanel.webserver.MAX_REQUESTS), which would reset the clients' connections.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import benchkit  # noqa: E402 - after the path it is found on

PATHS = ("/healthz", "/accounts/login/", "/static/controlpanel/favicon.svg")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--port", type=int, default=8795)
    p.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    return p.parse_args(argv)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(base: str, path: str, clients: int, seconds: float) -> int:
    import httpx

    done = 0
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=base) as client:

        async def one():
            nonlocal done
            while time.monotonic() < end:
                response = await client.get(path)
                assert response.status_code == 200, (path, response.status_code)
                done += 1

        await asyncio.gather(*(one() for _ in range(clients)))
    return done


def main(args) -> int:
    import httpx

    database = benchkit.create_database(args.database_url, "request_floor")
    env = benchkit.panel_env(
        f"{args.database_url}/{database}",
        args.redis_url,
        tempfile.mkdtemp(prefix="request-floor-"),
        "request-floor",
        WEB_CONCURRENCY="1",
        WEB_HOST="127.0.0.1",
        WEB_PORT=str(args.port),
    )
    server = None
    try:
        for step in (["migrate", "--noinput", "-v0"], ["collectstatic", "--noinput", "-v0"]):
            subprocess.run([sys.executable, "manage.py", *step], env=env, cwd=ROOT, check=True)
        server = subprocess.Popen(
            [sys.executable, "-m", "controlpanel.webserver"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{args.port}"
        for _ in range(200):
            try:
                httpx.get(f"{base}/healthz")
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        print(f"nproc {os.cpu_count()}  CPU {benchkit.cpu_model()}  load {os.getloadavg()}")
        print(f"1 uvicorn worker, {args.clients} clients, {args.seconds:g} s a path")
        for path in PATHS:
            asyncio.run(load(base, path, args.clients, 1.0))  # warm: connections, caches
            before, t0 = cpu_seconds(server.pid), time.monotonic()
            done = asyncio.run(load(base, path, args.clients, args.seconds))
            cpu, elapsed = cpu_seconds(server.pid) - before, time.monotonic() - t0
            print(
                f"  {path:36s} {done / elapsed:7.1f} req/s   "
                f"server CPU {1000 * cpu / done:5.2f} ms a request"
            )
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=20)
        benchkit.drop_database(args.database_url, database)
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
