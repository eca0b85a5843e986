"""What the scale benchmarks (bench_fleet, bench_web, bench_sockets, bench_sharded,
bench_signal_lag) share: the machine's name, one percentile rule, the panel's production-like
environment, and the simulated fleet (hosts in the database, the fleet simulator, a Celery
worker and beat polling it). Imported from ``scripts/``; the fleet parts need Django set up."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def pct(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def server_cpu(name: str) -> dict[int, float]:
    """CPU seconds used so far by each running process named ``name`` ("postgres",
    "redis-server"), by pid: pass two of these to ``cpu_used``."""
    import psutil

    seconds = {}
    for proc in psutil.process_iter(["name"]):
        if (proc.info["name"] or "") == name:
            try:
                t = proc.cpu_times()
                seconds[proc.pid] = t.user + t.system
            except psutil.Error:
                pass
    return seconds


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two ``server_cpu`` readings: what each process still running at
    the end used since the first (from its start, if it is newer). A process that exited in
    between takes its seconds with it, so the result is a lower bound where clients open and
    close connections (a PostgreSQL backend each)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def create_database(server_url: str, prefix: str) -> str:
    """A fresh PostgreSQL database ``<prefix>_<pid>`` on ``server_url`` (no database name in
    it); returns its name. drop_database() removes it when the benchmark ends."""
    import psycopg

    name = f"{prefix}_{os.getpid()}"
    with psycopg.connect(f"{server_url}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


def drop_database(server_url: str, name: str) -> None:
    """Drop a benchmark's database, whatever connections its processes left open."""
    import psycopg

    with psycopg.connect(f"{server_url}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def panel_env(database_url: str, redis_url: str, var_dir: str, name: str, **more: str) -> dict:
    """The environment the panel's processes run with, as docker-compose.yml sets it:
    production settings (DEBUG off) on ``database_url`` and ``redis_url``, a throwaway
    ``var_dir``; ``more`` adds or overrides variables (HTTPS, WEB_PORT, TELEMETRY_SHARDS...)."""
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update(
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        SECRET_KEY=f"{name}-" + "x" * 50,
        HTTPS="false",
        DEBUG="false",
        VAR_DIR=var_dir,
        ALLOWED_HOSTS="127.0.0.1,localhost",
        DJANGO_SETTINGS_MODULE="controlpanel.settings",
        ADVISOR_INTERVAL_SECONDS="0",
    )
    env.update(more)
    return env


def create_fleet(hosts: int, gpus: str, base_port: int, token: str) -> int:
    """``hosts`` agent hosts on consecutive ports with the GPUs the fleet simulator reports
    for them (its seeded UUIDs), as onboarding would record them; returns the GPU count."""
    from hosts.agent.simulated import SimulatedGpus, parse_simulate
    from hosts.models import Gpu, Host

    spec, count = parse_simulate(gpus)
    rows = []
    for i in range(hosts):
        # One save each: saving binds the token to its destination (a bulk insert would not).
        host = Host.objects.create(
            name=f"fleet-{i:04d}",
            address="127.0.0.1",
            transport="agent",
            port=base_port + i,
            agent_token=token,
            status="online",
            labels={"rack": f"r{i // 50}", "zone": "bench"},
        )
        for item in SimulatedGpus(spec, count, seed=f"fleet-{i:04d}").inventory_gpus():
            rows.append(
                Gpu(
                    host=host,
                    index=item["index"],
                    uuid=item["uuid"],
                    name=item["name"],
                    memory_bytes=item["memory_total_bytes"],
                    numa_node=item["numa_node"],
                )
            )
    Gpu.objects.bulk_create(rows, batch_size=2000)
    return len(rows)


def start_fleet(
    hosts: int, gpus: str, base_port: int, token: str, concurrency: int, env: dict, logs: Path
) -> list[subprocess.Popen]:
    """The fleet simulator serving ``hosts`` agents, and a Celery worker (``concurrency``) and
    beat that poll them (``TELEMETRY_SHARDS`` from ``env``); logs under ``logs``."""
    fleet = subprocess.Popen(
        [PYTHON, "-m", "hosts.agent.fleet", "--hosts", str(hosts), "--gpus", gpus]
        + ["--base-port", str(base_port), "--token", token],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    if "ready" not in fleet.stdout.readline():
        raise SystemExit("the fleet simulator did not start")
    logs.mkdir(parents=True, exist_ok=True)
    celery = [PYTHON, "-m", "celery", "-A", "controlpanel"]
    # Persistent database connections, as docker-compose.yml gives workers and beat (without,
    # every shard task of every second opened a PostgreSQL connection of its own).
    env = {**env, "DATABASE_CONN_MAX_AGE": env.get("DATABASE_CONN_MAX_AGE") or "60"}
    worker = subprocess.Popen(
        celery + ["worker", "-l", "WARNING", f"--concurrency={concurrency}"],
        cwd=ROOT,
        env=env,
        stdout=open(logs / "worker.log", "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    beat = subprocess.Popen(
        celery + ["beat", "-l", "WARNING", "-s", str(logs / "beat-schedule")],
        cwd=ROOT,
        env=env,
        stdout=open(logs / "beat.log", "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    return [fleet, worker, beat]
