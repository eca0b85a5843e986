#!/usr/bin/env python3
"""How fast every main page answers, idle and while a benchmark loads the machine (docs/:
"Performance"; issue 21's target: every page under 300 ms with both cores busy).

Starts the panel as ``make run`` does (``manage.py serve --demo``: embedded, SQLite, the demo
fleet's agents and simulated engines) with a throwaway VAR_DIR, seeds a realistic history into
its database through the ORM (``--runs`` finished runs with a minute of points each and their
JSON summaries, ``--changes`` change requests in every state, some verified by runs), logs in
as the demo admin over HTTP (the demo password is what ``serve`` prints), then fetches each
page ``--repeat`` times over HTTP and prints p50 / p95 / max in milliseconds:

1. idle;
2. under load: a real benchmark started through the "New benchmark" form on the demo fleet
   (a closed loop of ``--concurrency`` streams against a simulated engine, served by this
   same panel's embedded worker) plus one CPU-burner process per core (``--burners``,
   default ``nproc``: a busy loop), as the issue measured with both cores busy.

SQL queries per page are counted in-process: a ``manage.py shell`` against the same database
renders each page with Django's test client inside ``CaptureQueriesContext``; the same pass
gives "cpu ms", the median CPU time of the thread rendering the page (``time.thread_time``),
which a busy shared machine disturbs far less than wall-clock times (it runs idle, before
the load starts).

With ``--hosts N`` (issue 22) the database also gets N more hosts of ``--gpus-per-host`` GPUs
each (default 8), every GPU with a last reading, the hosts with labels (zone, rack) and one in
ten unreachable or refusing credentials, and the hosts list's second page and a filtered view
are timed too; ``--idle-only`` skips the loaded pass (a short run):

    .venv/bin/python scripts/bench_pages.py [--runs 200] [--changes 100] [--repeat 15]
    .venv/bin/python scripts/bench_pages.py --hosts 500 --idle-only --only 'dashboard|hosts'
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

# What a developer's shell may carry that must not reach an embedded demo panel.
NOT_PASSED = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEMO_PASSWORD", "STATIC_ROOT")

SEED = r"""
import json, random
from datetime import timedelta
from decimal import Decimal
from django.contrib.auth import get_user_model
from django.utils import timezone
from benchmarks import records
from benchmarks.models import BenchmarkRun, LoadProfile, RunPoint
from changes.models import ChangeRequest
from hosts.models import Deployment, EngineConfig

RUNS, CHANGES = {runs}, {changes}
rng = random.Random(1)
User = get_user_model()
people = [User.objects.get(username=u) for u in ("admin", "operator", "approver")]
deployments = list(Deployment.objects.select_related("host").order_by("pk"))
profiles = list(LoadProfile.objects.latest())
load = LoadProfile.objects.create_next(
    "bench-pages load",
    {{"stages": [{{"name": "main", "concurrency": {concurrency}, "duration_s": 900}}],
      "input_len": {{"kind": "fixed", "mean": 512}},
      "output_len": {{"kind": "fixed", "mean": 128}}}},
)
configs = {{}}
for d in deployments:
    configs[d.pk] = list(EngineConfig.objects.filter(deployment=d)) or [None]
    for v in range(3):
        configs[d.pk].append(EngineConfig.objects.create_next(d, {{"max_num_seqs": 64 * (v + 2)}}))
now = timezone.now()
quantiles = len(records.QUANTILES)
runs = []
for i in range(RUNS):
    d = deployments[i % len(deployments)]
    ttft, itl = rng.lognormvariate(5.3, 0.5), rng.lognormvariate(2.5, 0.3)
    tokens = rng.uniform(300, 6000)
    ok = rng.random() > 0.05
    start = now - timedelta(minutes=30 * (RUNS - i))
    runs.append(BenchmarkRun(
        deployment=d, engine_config=rng.choice(configs[d.pk]), load_profile=rng.choice(profiles),
        label=rng.choice(["", "baseline", "prefix caching on", f"sweep {{i % 20}}"]),
        requested_by=rng.choice(people), status="succeeded" if ok else "failed",
        created_at=start, started_at=start, finished_at=start + timedelta(seconds=60),
        engine=d.engine, engine_version=d.engine_version, model_name=d.model,
        gpu_model="NVIDIA H100 80GB HBM3", gpu_count=1, progress=1.0, duration_s=60.0,
        completed=600, failed=rng.randint(0, 6), error_rate=rng.random() * 0.01,
        ttft_p50_ms=ttft, ttft_p95_ms=ttft * 2.1, ttft_p99_ms=ttft * 3, itl_p50_ms=itl,
        itl_p95_ms=itl * 1.6, itl_p99_ms=itl * 2.4, tpot_p50_ms=itl * 1.05,
        e2el_p99_ms=ttft * 3 + itl * 400, request_throughput=tokens / 200,
        output_tokens_per_s=tokens, input_tokens_total=600 * 512, output_tokens_total=600 * 128,
        goodput_share=rng.uniform(0.7, 1), goodput_rps=tokens / 230,
        hourly_price=Decimal("3.20"), currency="USD",
        cost_per_million_output=3.2 / (tokens * 3600) * 1e6,
        summary={{f"p{{p}}_{{m}}_ms": rng.random() * 500 for p in range(40) for m in "ab"}},
        distributions={{"q": list(records.QUANTILES),
                        "ttft_ms": sorted(rng.random() * 900 for _ in range(quantiles)),
                        "itl_ms": sorted(rng.random() * 40 for _ in range(quantiles))}},
        environment={{"host": {{"name": d.host.name, "cpu_model": "x" * 60}}}},
    ))
runs = BenchmarkRun.objects.bulk_create(runs, batch_size=200)
points = []
for run in runs:
    for t in range(60):
        points.append(RunPoint(run=run, t=float(t), data={{
            "t": float(t), "ttft_p50_ms": rng.random() * 300, "ttft_p95_ms": rng.random() * 600,
            "itl_p50_ms": rng.random() * 20, "tokens_per_s": rng.random() * 4000,
            "in_flight": rng.randint(0, 64), "queue": rng.randint(0, 10),
            "kv_cache_usage": rng.random(), "completed": t * 10, "failed": 0,
            "gpu": [{{"util": rng.random(), "mem_used": rng.random() * 8e10, "power_w": 400}}]}}))
RunPoint.objects.bulk_create(points, batch_size=2000)
states = ["draft", "pending", "approved", "rejected", "withdrawn", "applied", "unverified",
          "rolled_back", "failed"]
changes = []
for i in range(CHANGES):
    d = deployments[i % len(deployments)]
    state = states[i % len(states)]
    verified = state in ("applied", "unverified", "rolled_back")
    changes.append(ChangeRequest(
        deployment=d, state=state, title=f"max-num-seqs {{64 * (i % 8 + 1)}} (#{{i}})",
        rationale="Measured queueing at peak; more sequences should raise throughput. " * 3,
        proposed_by=rng.choice(people), base_config=[c for c in configs[d.pk] if c][0],
        settings={{"max_num_seqs": 64 * (i % 8 + 1), "enable_prefix_caching": bool(i % 2)}},
        verify_profile=rng.choice(profiles),
        baseline_run=rng.choice(runs) if verified else None,
        verification_run=rng.choice(runs) if verified else None,
        comparison={{"ttft_p95_ms": {{"before": 300, "after": 280}}}} if verified else {{}},
    ))
ChangeRequest.objects.bulk_create(changes)
first = ChangeRequest.objects.order_by("-pk").first()
succeeded = BenchmarkRun.objects.filter(status="succeeded").order_by("-pk")
ids = list(succeeded.values_list("pk", flat=True)[:4])
d = deployments[0]
print(json.dumps({{"runs": ids, "change": first.pk, "host": d.host_id, "deployment": d.pk,
                  "load_profile": load.pk,
                  "load_deployment": Deployment.objects.order_by("host__name", "name")[0].pk}}))
"""

FLEET = r"""
import json, random
from decimal import Decimal
from django.utils import timezone
from hosts.models import Gpu, Host

HOSTS, GPUS = {hosts}, {gpus}
rng = random.Random(2)
now = timezone.now()
# No credentials: the embedded poller leaves these hosts alone (it asks hosts it can log in
# to), so the pages read what a polled fleet's rows hold without 500 agents to serve.
statuses = ["online"] * 18 + ["unreachable", "auth_failed"]
hosts = Host.objects.bulk_create(
    [Host(name=f"fleet-{{i:04d}}", address=f"10.{{i // 250}}.{{i % 250}}.1", port=9100,
          labels={{"zone": rng.choice(["eu", "us", "ap"]), "rack": f"r{{i % 40:02d}}"}},
          hourly_price=Decimal("25.00"), status=rng.choice(statuses), last_seen_at=now,
          last_error="")
     for i in range(HOSTS)],
    batch_size=500,
)
def reading():
    used = rng.randint(0, 80 * 2**30)
    return {{"memory_total_bytes": 80 * 2**30, "memory_used_bytes": used,
            "utilization_gpu_pct": rng.randint(0, 100),
            "utilization_memory_pct": rng.randint(0, 100),
            "temperature_c": rng.randint(30, 80), "power_w": rng.uniform(80, 700),
            "power_limit_w": 700.0, "sm_clock_mhz": 1980, "max_sm_clock_mhz": 1980,
            "mem_clock_mhz": 2619, "max_mem_clock_mhz": 2619, "clocks_event_reasons": 0,
            "throttle_reasons": 0, "pcie_tx_kbps": rng.randint(0, 10**6),
            "pcie_rx_kbps": rng.randint(0, 10**6), "ecc_corrected": 0, "ecc_uncorrected": 0,
            "processes": [], "missing": []}}
Gpu.objects.bulk_create(
    [Gpu(host=h, index=g, uuid=f"GPU-bench-{{h.pk}}-{{g}}", name="NVIDIA H100 80GB HBM3",
         memory_bytes=80 * 2**30, numa_node=g * 2 // GPUS, last_sample=reading(),
         last_sample_at=now)
     for h in hosts for g in range(GPUS)],
    batch_size=2000,
)
print(json.dumps({{"hosts": Host.objects.count(), "gpus": Gpu.objects.count()}}))
"""

COUNT = r"""
import json, statistics, time
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
client = Client()
client.force_login(get_user_model().objects.get(username="admin"))
counts = {{}}
for name, url in {pages}:
    client.get(url)
    with CaptureQueriesContext(connection) as queries:
        status = client.get(url).status_code
    # Counted now: the next request's start clears the log the context reads lazily.
    count = len(queries)
    cpu = []
    for _ in range({repeat}):
        start = time.thread_time()
        client.get(url)
        cpu.append((time.thread_time() - start) * 1000)
    counts[name] = [count, status, statistics.median(cpu)]
print(json.dumps(counts))
"""


def free_port(*, block: int = 1) -> int:
    """A port with ``block`` free ports from it (the demo fleet takes base..base+101)."""
    import random
    import socket

    for _ in range(100):
        base = random.randint(20000, 40000)
        try:
            for port in {base, base + block - 1, base + 100, base + 101} if block > 1 else {base}:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise SystemExit("no free ports")


@contextmanager
def demo_panel(var_dir: Path):
    """``manage.py serve --demo`` (what `make run` runs) on a free port with its own var/;
    yields (url, env, log) and stops it (and its demo fleet) after."""
    env = {k: v for k, v in os.environ.items() if k not in NOT_PASSED}
    env.update(
        VAR_DIR=str(var_dir / "var"),
        HOST_CHECK_INTERVAL_SECONDS="0",
        DEMO_FLEET_PORT=str(free_port(block=2)),
    )
    port = free_port()
    log_path = var_dir / "panel.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--demo", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 300
            while "Uvicorn running on" not in log_path.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the panel did not start:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.5)
            yield f"http://127.0.0.1:{port}", env, log_path
        finally:
            proc.terminate()  # serve stops its fleet on SIGTERM
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--changes", type=int, default=100)
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--concurrency", type=int, default=32, help="the benchmark's streams")
    p.add_argument("--burners", type=int, default=os.cpu_count(), help="busy-loop processes")
    p.add_argument("--only", help="a regular expression: only the pages whose name matches")
    p.add_argument("--hosts", type=int, default=0, help="more hosts in the fleet (issue 22)")
    p.add_argument("--gpus-per-host", type=int, default=8)
    p.add_argument("--idle-only", action="store_true", help="no loaded pass (a short run)")
    return p.parse_args()


def shell(env: dict, script: str) -> dict:
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode:
        raise SystemExit(f"manage.py shell failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def pages(ids: dict, fleet: bool) -> list[tuple[str, str]]:
    runs = ids["runs"]
    compare = "/benchmarks/compare/?"
    hosts = [("hosts list", "/hosts/")]
    if fleet:
        hosts += [
            ("hosts list page 2", "/hosts/?page=2"),
            ("hosts filtered", "/hosts/?label=zone%3Deu&gpu=H100&status=online&page=2"),
        ]
    return [
        ("dashboard", "/"),
        *hosts,
        ("host page", f"/hosts/{ids['host']}/"),
        ("history (runs list)", "/benchmarks/"),
        ("run page", f"/benchmarks/{runs[0]}/"),
        ("compare 2 runs", compare + "&".join(f"runs={pk}" for pk in runs[:2])),
        # Four is the most the compare page takes (five is refused with a 400).
        ("compare 4 runs", compare + "&".join(f"runs={pk}" for pk in runs[:4])),
        ("cost page", "/cost/"),
        ("changes list", "/changes/"),
        ("change page", f"/changes/{ids['change']}/"),
        ("sweeps list", "/changes/sweeps/"),
        ("advisor findings", "/changes/advisor/fleet/"),
        ("scaling fleet", "/scaling/"),
        ("scaling page", f"/scaling/deployments/{ids['deployment']}/"),
        ("audit log", "/audit/"),
        ("profile list", "/benchmarks/profiles/"),
    ]


def log_in(client: httpx.Client, password: str) -> None:
    form = client.get("/accounts/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    answer = client.post(
        "/accounts/login/",
        data={"username": "admin", "password": password, "csrfmiddlewaretoken": token},
    )
    if answer.status_code != 302:
        raise SystemExit(f"log-in failed: {answer.status_code}")


def csrf(client: httpx.Client, url: str) -> str:
    page = client.get(url)
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)


def time_pages(client: httpx.Client, cases, repeat: int, log_path: Path) -> dict:
    results = {}
    for name, url in cases:
        client.get(url)  # templates compiled, the database's pages cached
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - start) * 1000)
            size = len(response.content)
            if response.status_code != 200:
                log = log_path.read_text(errors="replace")[-4000:]
                raise SystemExit(f"{name}: {url} answered {response.status_code}\n{log}")
        times.sort()
        p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
        results[name] = (statistics.median(times), p95, times[-1], size)
    return results


def latest_point(client: httpx.Client, run_url: str) -> tuple[str, dict]:
    """The run's status and its newest point (the timeline comes in pages)."""
    since, last = -1.0, {}
    while True:
        answer = client.get(run_url.rstrip("/") + "/timeline.json", params={"since": since})
        timeline = answer.json()
        if timeline.get("points"):
            last = timeline["points"][-1]
            since = last["t"]
        if not timeline.get("more"):
            return timeline.get("status"), last


def burn() -> None:
    while True:
        pass


def start_load(client: httpx.Client, ids: dict, burners: int) -> list:
    token = csrf(client, "/benchmarks/new/")
    answer = client.post(
        "/benchmarks/new/",
        data={
            "deployment": ids["load_deployment"],
            "load_profile": ids["load_profile"],
            "label": "bench-pages load",
            "csrfmiddlewaretoken": token,
        },
    )
    if answer.status_code != 302:
        raise SystemExit(f"the benchmark did not start: {answer.status_code}\n{answer.text[:2000]}")
    run_url = answer.headers["location"]
    # Wait until the load generator is past its warm-up: the main stage's streams all busy.
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        status, point = latest_point(client, run_url)
        if point.get("stage") == "main":
            break
        time.sleep(2)
    else:
        raise SystemExit(f"the benchmark {run_url} never reached its main stage: {status}")
    procs = [multiprocessing.Process(target=burn, daemon=True) for _ in range(burners)]
    for proc in procs:
        proc.start()
    return [run_url, *procs]


def main() -> int:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-pages-") as scratch:
        with demo_panel(Path(scratch)) as (url, env, log_path):
            password = re.search(r"password: (\S+)", log_path.read_text()).group(1)
            started = time.perf_counter()
            ids = shell(
                env,
                SEED.format(runs=args.runs, changes=args.changes, concurrency=args.concurrency),
            )
            fleet = None
            if args.hosts:
                fleet = shell(env, FLEET.format(hosts=args.hosts, gpus=args.gpus_per_host))
            seeded = time.perf_counter() - started
            cases = pages(ids, bool(args.hosts))
            if args.only:
                cases = [(n, u) for n, u in cases if re.search(args.only, n)]
            counts = shell(env, COUNT.format(pages=repr(cases), repeat=args.repeat))
            loaded, load_note = {}, "no loaded pass (--idle-only)"
            with httpx.Client(base_url=url, timeout=60, follow_redirects=False) as client:
                log_in(client, password)
                idle = time_pages(client, cases, args.repeat, log_path)
                if not args.idle_only:
                    loaded, load_note = loaded_pass(client, ids, cases, args, log_path)
    fleet_note = f" · fleet: {fleet['hosts']} hosts, {fleet['gpus']} GPUs (SQLite)" if fleet else ""
    load = (
        f"{args.concurrency}-stream benchmark on the demo fleet + {args.burners} busy-loop "
        "processes"
    )
    print(
        f"{os.cpu_count()} CPUs · {args.runs} runs + {args.changes} changes seeded in "
        f"{seeded:.0f} s{fleet_note} · {args.repeat} requests a page"
        + ("" if args.idle_only else f" · load: a {load}")
    )
    print(load_note)
    head = (
        f"{'page':<22}{'queries':>8}{'cpu ms':>7}{'KiB':>6} | {'idle p50':>9}{'p95':>7}{'max':>7} |"
    )
    print(head + f" {'load p50':>9}{'p95':>7}{'max':>7}")
    for name, _ in cases:
        i, lo = idle[name], loaded.get(name)
        under_load = f" {lo[0]:>9.0f}{lo[1]:>7.0f}{lo[2]:>7.0f}" if lo else f" {'—':>9}"
        print(
            f"{name:<22}{counts[name][0]:>8}{counts[name][2]:>7.0f}{i[3] / 1024:>6.0f} |"
            f" {i[0]:>9.0f}{i[1]:>7.0f}{i[2]:>7.0f} |" + under_load
        )
    return 0


def loaded_pass(client: httpx.Client, ids: dict, cases, args, log_path: Path):
    """The pages again while a real benchmark and the busy loops load the machine."""
    run_url, *procs = start_load(client, ids, args.burners)
    try:
        loaded = time_pages(client, cases, args.repeat, log_path)
        # The load was real to the end: the run still running, requests served.
        status, last = latest_point(client, run_url)
        load_note = (
            f"benchmark {status} at the end, {last.get('t', 0):.0f} s in: "
            f"{last.get('in_flight')} requests in flight, "
            f"{last.get('requests_per_s', 0):.1f} requests/s, "
            f"{last.get('output_tokens_per_s', 0):.0f} output tokens/s"
        )
    finally:
        for proc in procs:
            proc.terminate()
        token = csrf(client, run_url)
        client.post(run_url + "cancel/", data={"csrfmiddlewaretoken": token})
    return loaded, load_note


if __name__ == "__main__":
    sys.exit(main())
