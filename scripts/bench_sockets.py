#!/usr/bin/env python3
"""Live streams at scale: how late WebSocket events reach 500 browsers (issue 22).

Production mode as ``docker-compose.yml`` runs it, on this machine:

1. a fresh PostgreSQL database (``--database-url``'s server, dropped at the end) and Redis as
   the Channels layer (``--redis-url``: pick a db number nobody else uses);
2. ``--processes`` panel web processes (``uvicorn controlpanel.asgi:application``, one per
   port from ``--port``);
3. seeds ``--hosts`` hosts and ``--runs`` running benchmark runs, and ``--sessions`` logins of
   Viewer-role users (real database sessions, as the login form makes them);
4. opens ``--sockets`` WebSockets (asyncio, the ``websockets`` client) spread round-robin over
   the processes, the sessions and the hosts' and runs' live groups (``/ws/hosts/<pk>/``,
   ``/ws/benchmarks/<pk>/``);
5. a separate publisher process sends, for ``--duration`` seconds, one event per group every
   ``--interval`` seconds (what the workers send: ``telemetry`` per host poll, ``run.point``
   per run second) through the real helper, ``controlpanel.realtime.publish``, each payload
   carrying its sequence number and send time (``time.time()``, same machine's clock);
6. every socket records the arrival time of each event.

Prints: connections accepted / asked, messages delivered / expected (the publisher's log of
what it sent to each group times the sockets in it), delivery lag (receive - send time)
p50 / p95 / p99 / max in ms, publish call time, resident memory of each web process before
and after, and the machine (nproc, CPU, load). Run under the shared lock on a busy machine:

    flock /tmp/h/bench.lock .venv/bin/python scripts/bench_sockets.py [--sockets 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
PYTHON = sys.executable

import benchkit  # noqa: E402 - after the path it is found on
from benchkit import cpu_model, pct  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("role", nargs="?", default="main", choices=("main", "seed", "publish"))
    p.add_argument("--sockets", type=int, default=500)
    p.add_argument("--hosts", type=int, default=50)
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--sessions", type=int, default=50, help="logins the sockets share")
    p.add_argument("--processes", type=int, default=2, help="uvicorn web processes")
    p.add_argument("--port", type=int, default=8700, help="first web process's port")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of publishing")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between a group's events")
    p.add_argument("--gpus", type=int, default=8, help="GPUs in each telemetry event")
    p.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    p.add_argument("--out", default="", help="publisher's log (publish role)")
    p.add_argument("--groups", default="", help="JSON file of groups (publish role)")
    return p.parse_args(argv)


def panel_env(args, database: str, var_dir: str) -> dict:
    return benchkit.panel_env(
        f"{args.database_url}/{database}", args.redis_url, var_dir, "bench-sockets"
    )


# --- seed role (runs with the panel's environment) -----------------------------------------


def seed(args) -> None:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.test import Client

    from controlpanel.choices import OperationStatus
    from tests import factories

    viewers = Group.objects.get(name="Viewer")
    hosts, runs = [], []
    for _ in range(args.hosts):
        host = factories.make_host()
        hosts.append(host.pk)
    deployment_hosts = [factories.make_host() for _ in range(max(1, args.runs // 10))]
    profile = factories.make_profile()
    for i in range(args.runs):
        deployment = factories.make_deployment(deployment_hosts[i % len(deployment_hosts)])
        run = factories.make_run(deployment, load_profile=profile, status=OperationStatus.RUNNING)
        runs.append(run.pk)
    cookies = []
    User = get_user_model()
    for i in range(args.sessions):
        user = User.objects.create_user(username=f"bench-viewer-{i}", password=None)
        user.groups.add(viewers)
        client = Client()
        client.force_login(user)
        cookies.append(client.cookies["sessionid"].value)
    print(json.dumps({"hosts": hosts, "runs": runs, "sessions": cookies}))


# --- publish role (a separate process, as a Celery worker is) -------------------------------


def telemetry_event(seq: int, gpus: int) -> dict:
    # The shape of hosts.services.telemetry's event (live point per GPU, host readings).
    gpu = {
        "util": 87.0,
        "mem_used": 61234.5,
        "mem_total": 81559.0,
        "power": 512.3,
        "temp": 67.0,
        "sm_clock": 1980,
        "throttle": [],
    }
    return {
        "t": int(time.time() * 1000),
        "gpus": [dict(gpu, index=i, pk=i + 1) for i in range(gpus)],
        "host": {"cpu_percent": 23.5, "mem_percent": 41.0, "load1": 3.2},
    }


def point_event(seq: int) -> dict:
    # The shape of a run point (benchmarks.services.points), about a kilobyte of JSON.
    return {
        "t": float(seq),
        "rps": 12.5,
        "tokens_per_s": 3120.4,
        "ttft_p50": 0.182,
        "ttft_p95": 0.412,
        "itl_p50": 0.021,
        "itl_p95": 0.048,
        "errors": 0,
        "in_flight": 64,
        "progress": 0.5,
        "eta_s": 30.0,
        "gpus": [{"index": i, "util": 91.0, "mem_used": 70123.0} for i in range(8)],
    }


def publish_loop(args) -> None:
    import django

    django.setup()
    from controlpanel.realtime import group_name, publish

    groups = json.loads(Path(args.groups).read_text())
    targets = [("host", pk, "telemetry") for pk in groups["hosts"]]
    targets += [("run", pk, "run.point") for pk in groups["runs"]]
    sent: dict[str, int] = {}
    call_ms: list[float] = []
    start = time.monotonic()
    seq = 0
    # Each group's events are spread evenly over the interval, as independent workers' polls
    # are, instead of one burst per second.
    step = args.interval / len(targets)
    while time.monotonic() - start < args.duration:
        for i, (kind, pk, event) in enumerate(targets):
            due = start + seq * args.interval + i * step
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            data = telemetry_event(seq, args.gpus) if kind == "host" else point_event(seq)
            data["bench"] = {"seq": seq, "sent": time.time()}
            t0 = time.perf_counter()
            publish(group_name(kind, pk), event, data)
            call_ms.append((time.perf_counter() - t0) * 1000)
            sent[group_name(kind, pk)] = sent.get(group_name(kind, pk), 0) + 1
        seq += 1
    Path(args.out).write_text(json.dumps({"sent": sent, "call_ms": call_ms}))


# --- main role ------------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def wait_http(port: int, deadline_s: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.3)
    raise SystemExit(f"web process on port {port} did not answer in {deadline_s:.0f} s")


async def open_sockets(plan: list[tuple[int, str, str]], args):
    """Connect every socket (a few at a time, as browsers arrive) and read until told to stop."""
    import websockets

    received: list[tuple[str, int, float, float]] = []  # group, seq, sent, received
    accepted = 0
    failures: dict[str, int] = {}
    stop = asyncio.Event()
    sockets = []

    async def one(port: int, path: str, cookie: str, group: str):
        nonlocal accepted
        try:
            ws = await websockets.connect(
                f"ws://127.0.0.1:{port}{path}",
                additional_headers={"Cookie": f"sessionid={cookie}"},
                origin=f"http://127.0.0.1:{port}",
                open_timeout=60,
                max_queue=None,
            )
        except Exception as exc:  # noqa: BLE001 - counted and reported
            failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1
            return
        accepted += 1
        sockets.append(ws)
        try:
            async for raw in ws:
                now = time.time()
                data = json.loads(raw).get("data") or {}
                mark = data.get("bench")
                if mark:
                    received.append((group, mark["seq"], mark["sent"], now))
        except websockets.ConnectionClosed as exc:
            if not stop.is_set():
                failures[f"closed {exc.code}"] = failures.get(f"closed {exc.code}", 0) + 1

    tasks = []
    for port, path, cookie, group in plan:
        tasks.append(asyncio.create_task(one(port, path, cookie, group)))
        # Arrive in small waves rather than 500 handshakes at once.
        if len(tasks) % 20 == 0:
            await asyncio.sleep(0.2)
    deadline = time.monotonic() + 120
    while accepted + sum(failures.values()) < len(plan) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return {
        "received": received,
        "accepted": lambda: accepted,
        "failures": failures,
        "stop": stop,
        "sockets": sockets,
        "tasks": tasks,
    }


async def measure(args, plan, groups_file, env, procs):
    state = await open_sockets(plan, args)
    connected = state["accepted"]()
    print(f"connections: {connected}/{len(plan)} accepted; failures {state['failures'] or 'none'}")
    rss_before = {p.pid: rss_mib(p.pid) for p in procs}
    out = Path(groups_file).with_suffix(".sent.json")
    publisher = await asyncio.create_subprocess_exec(
        PYTHON,
        __file__,
        "publish",
        "--groups",
        groups_file,
        "--out",
        str(out),
        "--duration",
        str(args.duration),
        "--interval",
        str(args.interval),
        "--gpus",
        str(args.gpus),
        env=env,
        cwd=str(ROOT),
    )
    await publisher.wait()
    # Give the last events a generous time to arrive before counting what was lost.
    expected_per_group = {}
    log = json.loads(out.read_text())
    deadline = time.monotonic() + 30
    sockets_per_group: dict[str, int] = {}
    for _, _, _, group in plan:
        sockets_per_group[group] = sockets_per_group.get(group, 0) + 1
    for group, n in log["sent"].items():
        expected_per_group[group] = n * sockets_per_group.get(group, 0)
    expected = sum(expected_per_group.values())
    while len(state["received"]) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    rss_after = {p.pid: rss_mib(p.pid) for p in procs}
    state["stop"].set()
    for ws in state["sockets"]:
        await ws.close()
    await asyncio.gather(*state["tasks"], return_exceptions=True)
    return state, log, expected, connected, rss_before, rss_after


def report(args, state, log, expected, connected, rss_before, rss_after, procs, plan):
    received = state["received"]
    lags = [(r - s) * 1000 for _, _, s, r in received]
    print(
        f"messages: {len(received)}/{expected} delivered "
        f"({expected - len(received)} missing) over {args.duration:.0f} s, "
        f"{len(log['sent'])} groups, one event per group every {args.interval} s"
    )
    if lags:
        print(
            f"delivery lag ms: p50 {pct(lags, 50):.1f}  p95 {pct(lags, 95):.1f}  "
            f"p99 {pct(lags, 99):.1f}  max {max(lags):.1f}  (mean {statistics.fmean(lags):.1f})"
        )
    calls = log["call_ms"]
    print(
        f"publish() call ms: p50 {pct(calls, 50):.2f}  p99 {pct(calls, 99):.2f}  "
        f"max {max(calls):.2f}  ({len(calls)} calls)"
    )
    for p in procs:
        print(
            f"web process pid {p.pid}: RSS {rss_before[p.pid]:.0f} MiB with sockets open, "
            f"{rss_after[p.pid]:.0f} MiB after publishing"
        )
    return lags


def main(args) -> int:

    database = benchkit.create_database(args.database_url, "bench_sockets")
    var_dir = tempfile.mkdtemp(prefix="bench-sockets-")
    env = panel_env(args, database, var_dir)
    procs: list[subprocess.Popen] = []
    try:
        subprocess.run(
            [PYTHON, "manage.py", "migrate", "--noinput", "-v0"], env=env, cwd=ROOT, check=True
        )
        seeded = json.loads(
            subprocess.run(
                [PYTHON, __file__, "seed", "--hosts", str(args.hosts), "--runs", str(args.runs)]
                + ["--sessions", str(args.sessions)],
                env=env,
                cwd=ROOT,
                check=True,
                capture_output=True,
                text=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        for i in range(args.processes):
            port = args.port + i
            procs.append(
                subprocess.Popen(
                    [PYTHON, "-m", "uvicorn", "controlpanel.asgi:application"]
                    + ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
                    + ["--no-access-log"],
                    env=env,
                    cwd=ROOT,
                )
            )
        for i in range(args.processes):
            wait_http(args.port + i)
        groups = [("host", pk, f"/ws/hosts/{pk}/") for pk in seeded["hosts"]]
        groups += [("run", pk, f"/ws/benchmarks/{pk}/") for pk in seeded["runs"]]
        plan = []
        for i in range(args.sockets):
            kind, pk, path = groups[i % len(groups)]
            port = args.port + i % args.processes
            cookie = seeded["sessions"][i % len(seeded["sessions"])]
            plan.append((port, path, cookie, f"{kind}-{pk}"))
        groups_file = Path(var_dir) / "groups.json"
        groups_file.write_text(json.dumps(seeded))
        print(
            f"nproc {os.cpu_count()}  CPU {cpu_model()}  load before {os.getloadavg()}  "
            f"python {platform.python_version()}"
        )
        print(
            f"{args.processes} uvicorn web processes (ports {args.port}..), Redis channel layer "
            f"{urllib.parse.urlsplit(args.redis_url)._replace(netloc='…').geturl()}, "
            f"PostgreSQL {database}; {args.sockets} sockets over {len(groups)} groups "
            f"({args.hosts} hosts, {args.runs} runs), {args.sessions} sessions"
        )
        state, log, expected, connected, before, after = asyncio.run(
            measure(args, plan, str(groups_file), env, procs)
        )
        report(args, state, log, expected, connected, before, after, procs, plan)
        print(f"load after {os.getloadavg()}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        benchkit.drop_database(args.database_url, database)
    return 0


if __name__ == "__main__":
    ARGS = parse_args()
    if ARGS.role == "seed":
        seed(ARGS)
    elif ARGS.role == "publish":
        publish_loop(ARGS)
    else:
        sys.exit(main(ARGS))
