#!/usr/bin/env python3
"""The production web tier under load: page views/s and latency with concurrent viewers
(issue 22), 1 vs N worker processes behind one port, optionally while a fleet is polled.

Production mode as ``docker-compose.yml`` runs it, on this machine:

1. a fresh PostgreSQL database (dropped at the end), Redis (``--redis-url``, flushed: pick a db
   number nobody else uses) as cache, broker and channel layer, ``collectstatic`` into a
   throwaway VAR_DIR (the manifest storage production uses), ``HTTPS=true`` with every request
   carrying ``X-Forwarded-Proto: https`` from 127.0.0.1 as the TLS proxy sends it;
2. seeds a history through the ORM (``seed`` role: ``--hosts`` hosts with a deployment each,
   then bench_pages.py's history seed: ``--runs`` finished runs with a minute of points each
   and ``--changes`` change requests) and ``--viewers`` Viewer-role logins (database
   sessions, as the login form makes them);
3. with ``--fleet N``: N more hosts × ``--gpus`` from the fleet simulator
   (``hosts.agent.fleet``) polled every second by a real Celery worker and beat
   (``TELEMETRY_SHARDS``), so pages are served while the telemetry path writes;
4. for each value of ``--workers`` (e.g. ``1,2``) starts ``python -m controlpanel.webserver``
   with that ``WEB_CONCURRENCY`` and measures:

   a. closed loop: ``--viewers`` concurrent viewers, each fetching the main pages (dashboard,
      hosts list, host page — of a polled host with ``--fleet`` — history, run page) one
      after the other with no think time for
      ``--seconds``: page views/s the tier sustains and p50/p95/p99 per page;
   b. open loop at ``--rate`` page views/s (arrivals on a fixed schedule, each page fetched
      when due whatever is still in flight): whether the tier keeps that rate and its p95.

   Latency is measured by the client from the request's start (open loop: from the time it
   was due, so a late client counts against the tier). Non-200 answers are counted and
   printed; CPU of the web processes, the worker and PostgreSQL over each window.

    .venv/bin/python scripts/bench_web.py --workers 1,2 [--fleet 500] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
import benchkit  # noqa: E402 - after the path it is found on
from benchkit import cpu_model, pct  # noqa: E402

from controlpanel import webserver  # noqa: E402 - no Django import: only the command line

PYTHON = sys.executable

PAGE_NAMES = ("dashboard", "hosts list", "host page", "history", "run page")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("role", nargs="?", default="main", choices=("main", "seed"))
    p.add_argument("--workers", default="1,2", help="WEB_CONCURRENCY values to measure")
    p.add_argument("--viewers", type=int, default=20)
    p.add_argument("--seconds", type=float, default=30.0, help="each measuring window")
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument(
        "--rate", type=float, default=100.0, help="open-loop page views/s (0: closed loop only)"
    )
    p.add_argument("--hosts", type=int, default=20, help="hosts with a deployment (history)")
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--changes", type=int, default=100)
    p.add_argument("--fleet", type=int, default=0, help="simulated agent hosts polled at 1 Hz")
    p.add_argument("--gpus", default="h100-sxm:8")
    p.add_argument("--shards", type=int, default=4, help="TELEMETRY_SHARDS with --fleet")
    p.add_argument("--worker-concurrency", type=int, default=2)
    p.add_argument("--base-port", type=int, default=21000, help="the fleet's first port")
    p.add_argument("--port", type=int, default=8790, help="the web tier's port")
    p.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/11")
    p.add_argument("--token", default="", help="(seed role) the fleet's agent token")
    return p.parse_args(argv)


def panel_env(args, database: str, var_dir: str) -> dict:
    return benchkit.panel_env(
        f"{args.database_url}/{database}",
        args.redis_url,
        var_dir,
        "bench-web",
        HTTPS="true",
        TELEMETRY_SHARDS=str(args.shards),
        WEB_HOST="127.0.0.1",
        WEB_PORT=str(args.port),
    )


# --- seed role (runs with the panel's environment) -----------------------------------------


def seed(args) -> None:
    import django

    django.setup()
    from bench_pages import SEED
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.test import Client

    from tests import factories

    User = get_user_model()
    groups = {g.name: g for g in Group.objects.all()}
    for name, role in (("admin", "Admin"), ("operator", "Operator"), ("approver", "Approver")):
        User.objects.create_user(username=name, password=None).groups.add(groups[role])
    for _ in range(args.hosts):
        factories.make_deployment(factories.make_host())
    factories.make_profile()
    # bench_pages' history: runs with points and summaries, changes in every state.
    out = {}
    exec(  # noqa: S102 - our own seed script, formatted with our own numbers
        SEED.format(runs=args.runs, changes=args.changes, concurrency=8),
        {"print": lambda text: out.update(json.loads(text))},
    )
    if args.fleet:
        out["fleet_gpus"] = benchkit.create_fleet(args.fleet, args.gpus, args.base_port, args.token)
        # The host page viewed is a polled one: its GPUs' last 10 minutes are on the page.
        from hosts.models import Host

        out["host"] = Host.objects.get(name="fleet-0000").pk
    from django.middleware.csrf import CSRF_ALLOWED_CHARS, CSRF_SECRET_LENGTH
    from django.utils.crypto import get_random_string

    sessions, cookies = [], []
    for i in range(args.viewers):
        user = User.objects.create_user(username=f"bench-viewer-{i}", password=None)
        user.groups.add(groups["Viewer"])
        client = Client()
        client.force_login(user)
        # A browser sends back the CSRF cookie it was given (the Secure cookie over the TLS
        # proxy); a client without one makes Django mint a new secret on every page with a
        # form (32 os.urandom calls: 7.5 % of the web tier's py-spy samples in this bench).
        csrf = get_random_string(CSRF_SECRET_LENGTH, CSRF_ALLOWED_CHARS)
        sessions.append(client.cookies[settings.SESSION_COOKIE_NAME].value)
        cookies.append(
            f"{settings.SESSION_COOKIE_NAME}={sessions[-1]}; {settings.CSRF_COOKIE_NAME}={csrf}"
        )
    out["sessions"], out["cookies"] = sessions, cookies
    print(json.dumps(out))


# --- measuring ------------------------------------------------------------------------------


def cpu_seconds(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in [proc, *proc.children(recursive=True)]:
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            pass
    return total


def page_urls(seeded: dict) -> list[tuple[str, str]]:
    return list(
        zip(
            PAGE_NAMES,
            (
                "/",
                "/hosts/",
                f"/hosts/{seeded['host']}/",
                "/benchmarks/",
                f"/benchmarks/{seeded['runs'][0]}/",
            ),
            strict=True,
        )
    )


def client_for(base: str, cookie: str):
    import httpx

    return httpx.AsyncClient(
        base_url=base,
        # What the TLS proxy in front of the tier adds; uvicorn believes it from 127.0.0.1.
        headers={"X-Forwarded-Proto": "https", "Cookie": cookie},
        timeout=60,
        limits=httpx.Limits(max_connections=64),
    )


async def closed_loop(base, cookies, pages, viewers, seconds):
    """``viewers`` viewers each fetching the pages in turn without pause: (page, ms, status)."""
    results: list[tuple[str, float, int]] = []
    end = time.monotonic() + seconds

    async def viewer(i: int) -> None:
        async with client_for(base, cookies[i % len(cookies)]) as client:
            n = i  # viewers start on different pages
            while time.monotonic() < end:
                name, url = pages[n % len(pages)]
                n += 1
                t0 = time.perf_counter()
                try:
                    status = (await client.get(url)).status_code
                except Exception:  # noqa: BLE001 - a failed request is a result, counted
                    status = 0
                results.append((name, (time.perf_counter() - t0) * 1000, status))

    await asyncio.gather(*(viewer(i) for i in range(viewers)))
    return results


async def open_loop(base, cookies, pages, rate, seconds):
    """Pages due at ``rate`` per second on a fixed schedule; latency counted from when each
    was due. Returns (results, requests still unanswered at the end, max lateness s)."""
    results: list[tuple[str, float, int]] = []
    clients = [client_for(base, c) for c in cookies]
    start = time.perf_counter() + 0.2
    total = int(rate * seconds)
    late = 0.0

    async def one(k: int, due: float) -> None:
        name, url = pages[k % len(pages)]
        try:
            status = (await clients[k % len(clients)].get(url)).status_code
        except Exception:  # noqa: BLE001
            status = 0
        results.append((name, (time.perf_counter() - due) * 1000, status))

    tasks = []
    for k in range(total):
        due = start + k / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        late = max(late, time.perf_counter() - due)
        tasks.append(asyncio.create_task(one(k, due)))
    done, pending = await asyncio.wait(tasks, timeout=60)
    for task in pending:
        task.cancel()
    for client in clients:
        await client.aclose()
    return results, len(pending), late


def summarize(title: str, results, seconds: float) -> dict:
    ok = [r for r in results if r[2] == 200]
    bad = len(results) - len(ok)
    codes: dict[int, int] = {}
    for r in results:
        if r[2] != 200:
            codes[r[2]] = codes.get(r[2], 0) + 1
    print(
        f"  {title}: {len(results)} page views in {seconds:.0f} s = "
        f"{len(results) / seconds:.1f}/s; non-200: {bad} "
        f"{dict(sorted(codes.items())) if codes else ''}(0 = no answer)"
    )
    row = {"views_per_s": len(results) / seconds, "errors": bad}
    for name in PAGE_NAMES:
        ms = [r[1] for r in ok if r[0] == name]
        if ms:
            print(
                f"    {name:11s} n={len(ms):5d}  p50 {pct(ms, 50):6.0f}  p95 {pct(ms, 95):6.0f}"
                f"  p99 {pct(ms, 99):6.0f}  max {max(ms):6.0f} ms"
            )
            row[name] = {
                "p50": pct(ms, 50),
                "p95": pct(ms, 95),
                "p99": pct(ms, 99),
            }
    every = [r[1] for r in ok]
    print(
        f"    {'all pages':11s} n={len(every):5d}  p50 {pct(every, 50):6.0f}  "
        f"p95 {pct(every, 95):6.0f}  p99 {pct(every, 99):6.0f} ms"
    )
    row["all"] = {
        "p50": pct(every, 50),
        "p95": pct(every, 95),
        "p99": pct(every, 99),
    }
    return row


def wait_http(port: int, proc: subprocess.Popen, deadline_s: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the web tier exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"the web tier on port {port} did not answer in {deadline_s:.0f} s")


def measure_tier(args, env, seeded, workers: int, background: list[int], fleet: list[int]) -> dict:
    """``background``: the panel's worker and beat; ``fleet``: the simulated agents (in
    production they run on the GPU hosts, not beside the panel)."""
    base = f"http://127.0.0.1:{args.port}"
    tier = subprocess.Popen(
        [PYTHON, "-m", "controlpanel.webserver"],
        env={**env, "WEB_CONCURRENCY": str(workers)},
        cwd=ROOT,
        stdout=open(Path(env["VAR_DIR"]) / f"web-{workers}.log", "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    pages = page_urls(seeded)
    cookies = seeded["cookies"]
    out = {"workers": workers}
    try:
        wait_http(args.port, tier)
        # Every worker process compiles its templates and opens its connections first.
        asyncio.run(closed_loop(base, cookies, pages, args.viewers, args.warmup))
        print(
            f"\nWEB_CONCURRENCY={workers}, WEB_NICE={webserver.web_nice(env)}"
            f" (load before {os.getloadavg()[0]:.1f})"
        )
        windows = [
            (
                f"closed loop, {args.viewers} viewers",
                lambda: (closed_loop(base, cookies, pages, args.viewers, args.seconds), None),
            ),
            (
                f"open loop at {args.rate:.0f}/s",
                lambda: (open_loop(base, cookies, pages, args.rate, args.seconds), "open"),
            ),
        ]
        for label, run in windows if args.rate > 0 else windows[:1]:
            coro, kind = run()
            web0, bg0 = cpu_seconds([tier.pid]), cpu_seconds(background)
            pg0, redis0 = benchkit.server_cpu("postgres"), benchkit.server_cpu("redis-server")
            fleet0 = cpu_seconds(fleet)
            stored0 = sample_count(env) if fleet else 0
            me0 = time.process_time()
            t0 = time.monotonic()
            answer = asyncio.run(coro)
            wall = elapsed = time.monotonic() - t0
            if kind == "open":
                results, pending, late = answer
                wall = args.seconds
            else:
                results, pending, late = answer, 0, 0.0
            row = summarize(label, results, wall)
            if kind == "open":
                print(
                    f"    unanswered at the end: {pending}; the client's own send lateness max"
                    f" {late * 1000:.0f} ms"
                )
                row.update(pending=pending)
            web = cpu_seconds([tier.pid]) - web0
            pg = benchkit.cpu_used(pg0, benchkit.server_cpu("postgres"))
            redis = benchkit.cpu_used(redis0, benchkit.server_cpu("redis-server"))
            print(
                f"    CPU over the window: web {100 * web / wall:.0f} %, worker/beat"
                f" {100 * (cpu_seconds(background) - bg0) / wall:.0f} %, fleet simulator"
                f" {100 * (cpu_seconds(fleet) - fleet0) / wall:.0f} %, postgres"
                f" {100 * pg / wall:.0f} %, redis {100 * redis / wall:.0f} %, this client"
                f" {100 * (time.process_time() - me0) / wall:.0f} % of a core;"
                f" load {os.getloadavg()[0]:.1f}; web CPU per page view"
                f" {1000 * web / max(len(results), 1):.1f} ms"
            )
            row["web_cpu_ms_per_view"] = 1000 * web / max(len(results), 1)
            if fleet:
                # What the poll kept up while the pages were served (not after: the load gone).
                row["samples_per_s"] = (sample_count(env) - stored0) / elapsed
                print(
                    f"    fleet during the window: {row['samples_per_s']:.0f} samples/s stored"
                    f" (of {seeded['fleet_gpus']} GPUs at 1 Hz)"
                )
            out["closed" if kind is None else "open"] = row
    finally:
        tier.terminate()
        try:
            tier.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(tier.pid, 9)
    return out


def sample_count(env: dict) -> int:
    import psycopg

    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM hosts_gpusample").fetchone()[0]


def samples_per_s(env: dict, seconds: float = 10.0) -> float:
    first = sample_count(env)
    time.sleep(seconds)
    return (sample_count(env) - first) / seconds


def main(args) -> int:
    import redis

    database = benchkit.create_database(args.database_url, "bench_web")
    var_dir = tempfile.mkdtemp(prefix="bench-web-")
    env = panel_env(args, database, var_dir)
    redis.Redis.from_url(args.redis_url).flushdb()  # this benchmark's db only
    token = secrets.token_urlsafe(24)
    background: list[subprocess.Popen] = []
    try:
        for step in (["migrate", "--noinput", "-v0"], ["collectstatic", "--noinput", "-v0"]):
            subprocess.run([PYTHON, "manage.py", *step], env=env, cwd=ROOT, check=True)
        seed_argv = [PYTHON, __file__, "seed", "--token", token]
        for flag in ("hosts", "runs", "changes", "viewers", "fleet", "gpus", "base_port"):
            seed_argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        seeded = subprocess.run(
            seed_argv, env=env, cwd=ROOT, check=True, capture_output=True, text=True
        )
        seeded = json.loads(seeded.stdout.strip().splitlines()[-1])
        print(
            f"nproc {os.cpu_count()}  CPU {cpu_model()}  python {platform.python_version()}  "
            f"load before {os.getloadavg()}"
        )
        print(
            f"PostgreSQL {database}, Redis {args.redis_url.rsplit('/', 1)[-1]}; "
            f"{args.hosts} hosts with deployments, {args.runs} runs, {args.changes} changes, "
            f"{args.viewers} viewers"
        )
        if args.fleet:
            background = benchkit.start_fleet(
                args.fleet,
                args.gpus,
                args.base_port,
                token,
                args.worker_concurrency,
                env,
                Path(var_dir),
            )
            # The pages start once the poll is steady (its worker processes warm up first),
            # or after a minute whatever it does.
            deadline, rate = time.monotonic() + 60, 0.0
            while time.monotonic() < deadline and rate < 0.9 * seeded["fleet_gpus"]:
                rate = samples_per_s(env, 5.0)
            print(
                f"fleet: {args.fleet} hosts, {seeded['fleet_gpus']} GPUs polled at 1 Hz by "
                f"{args.shards} shards, worker concurrency {args.worker_concurrency}: "
                f"{rate:.0f} samples/s stored before the pages"
            )
        rows = []
        for workers in [int(w) for w in args.workers.split(",")]:
            # start_fleet's processes: the simulator first, then the worker and beat.
            panel, simulator = [p.pid for p in background[1:]], [p.pid for p in background[:1]]
            rows.append(measure_tier(args, env, seeded, workers, panel, simulator))
        if args.fleet:
            print(f"\nfleet while measured: {samples_per_s(env):.0f} samples/s stored at the end")
        print(f"\nload after {os.getloadavg()}")
        print(json.dumps(rows))
    finally:
        for proc in reversed(background):
            proc.terminate()
        for proc in background:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        benchkit.drop_database(args.database_url, database)
        print(f"logs in {var_dir}")
    return 0


if __name__ == "__main__":
    ARGS = parse_args()
    if ARGS.role == "seed":
        seed(ARGS)
    else:
        sys.exit(main(ARGS))
