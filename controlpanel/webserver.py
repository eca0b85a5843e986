"""The production web tier: `python -m controlpanel.webserver` runs uvicorn with several workers.

One uvicorn process runs Django on one event loop and one CPU; a page that takes 20 ms of CPU
caps a process near 50 page views/s whatever the machine has. Several worker processes behind
one port (the kernel hands each accepted connection to one of them) use every CPU. WebSockets
keep working across processes because Channels publishes through the Redis channel layer, not
in-process memory (REDIS_URL is required in production for that reason).

Why uvicorn's own supervisor (`--workers`) rather than gunicorn with uvicorn's worker class:
since 0.30 it restarts a worker that dies, pings each worker and replaces one that stops
answering (--timeout-worker-healthcheck, gunicorn's --timeout), recycles workers after a
number of requests with jitter (--limit-max-requests, gunicorn's --max-requests), waits for
requests in flight on SIGTERM (--timeout-graceful-shutdown) and restarts workers one by one
on SIGHUP; so it covers what gunicorn would give us without another dependency, and without
gunicorn's own flag set for the proxy headers.

This module only builds the command line (no Django import, so it starts before settings are
read) and replaces itself with uvicorn.
"""

import os
import sys

# Inside the container: the published port reaches it only on all interfaces.
DEFAULT_BIND_HOST = "0.0.0.0"  # noqa: S104
DEFAULT_PORT = 8000
# Recycle a worker after this many requests (with jitter so they do not all restart at once):
# a slow leak in a library cannot grow a long-lived process without bound.
MAX_REQUESTS = 10_000
MAX_REQUESTS_JITTER = 1_000
# Requests in flight get this long to finish on a restart/stop; compose stops after 10 s.
GRACEFUL_SHUTDOWN_SECONDS = 8
# Database connections each worker process may hold (psycopg's pool, DATABASE_POOL_SIZE): under
# ASGI each request runs in its own thread, and persistent per-thread connections
# (DATABASE_CONN_MAX_AGE) pile up until PostgreSQL refuses clients; a pool bounds them. Ten
# covers the requests one process runs at once (its CPU is the limit before that, see
# scripts/bench_web.py) and keeps 2-4 workers far below PostgreSQL's 100 connections.
DEFAULT_POOL_SIZE = 10


# The web processes' niceness: on a machine they share with the Celery workers, a burst of page
# views must not starve the 1 Hz telemetry poll. Measured with scripts/bench_web.py (2 cores,
# 4,000 GPUs polled, 20 viewers, 2 web workers at niceness 0): the web tier took 115 % of the
# CPU and the poll fell to ~1,000 of 4,000 samples/s, its shard tasks expiring unstarted.
# Niceness only matters where processes compete for a CPU; a web tier on machines of its own
# runs as fast at 5 as at 0.
DEFAULT_NICE = 5


def cpu_count() -> int:
    """CPUs this process may run on (a container's cpuset, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _whole_number(environ, name: str, default, low: int, high: int | None = None) -> int:
    """``environ[name]`` as a whole number in low..high, ``default()`` when unset; a bad value
    stops the server with a message naming the variable."""
    environ = os.environ if environ is None else environ
    raw = (environ.get(name) or "").strip()
    if not raw:
        return default()
    try:
        value = int(raw)
    except ValueError:
        raise SystemExit(f"{name} must be a whole number, not {raw!r}") from None
    if value < low:
        raise SystemExit(f"{name} must be at least {low}, not {value}")
    if high is not None and value > high:
        raise SystemExit(f"{name} must be between {low} and {high}, not {value}")
    return value


def web_concurrency(environ: dict[str, str] | None = None) -> int:
    """Worker processes: WEB_CONCURRENCY when set (the convention uvicorn and gunicorn share),
    else one per CPU: the workers are async, so one process keeps one CPU busy."""
    return _whole_number(environ, "WEB_CONCURRENCY", cpu_count, 1)


def web_nice(environ: dict[str, str] | None = None) -> int:
    """How much to lower the web processes' CPU priority: WEB_NICE (0-19), else DEFAULT_NICE."""
    return _whole_number(environ, "WEB_NICE", lambda: DEFAULT_NICE, 0, 19)


def uvicorn_argv(environ: dict[str, str] | None = None) -> list[str]:
    """The uvicorn command line for the production web tier."""
    environ = os.environ if environ is None else environ
    return [
        "uvicorn",
        "controlpanel.webapp:application",
        "--host",
        environ.get("WEB_HOST") or DEFAULT_BIND_HOST,
        "--port",
        str(int(environ.get("WEB_PORT") or DEFAULT_PORT)),
        "--workers",
        str(web_concurrency(environ)),
        # X-Forwarded-For is believed only from these addresses (login throttling per address
        # and the audit log's addresses depend on it): the TLS proxy's, never "*" by default.
        "--proxy-headers",
        "--forwarded-allow-ips",
        environ.get("FORWARDED_ALLOW_IPS") or "127.0.0.1",
        "--limit-max-requests",
        str(MAX_REQUESTS),
        "--limit-max-requests-jitter",
        str(MAX_REQUESTS_JITTER),
        "--timeout-graceful-shutdown",
        str(GRACEFUL_SHUTDOWN_SECONDS),
    ]


def server_environ(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the web workers run with: a database connection pool unless
    DATABASE_POOL_SIZE says otherwise (0 turns it off)."""
    environ = dict(os.environ if environ is None else environ)
    if not (environ.get("DATABASE_POOL_SIZE") or "").strip():
        environ["DATABASE_POOL_SIZE"] = str(DEFAULT_POOL_SIZE)
    return environ


# Linux with autogroup scheduling (sched_autogroup_enabled) shares the CPU between sessions
# first, and a process's niceness counts only against its own session's other processes: a
# web tier in a session of its own (a service, a container's first process) must lower its
# session's weight instead (man 7 sched, "The autogroup feature"). Measured: WEB_NICE=19 alone
# left the poll at 1,600 of 4,000 samples/s under page load.
AUTOGROUP = "/proc/self/autogroup"


def lower_priority(nice: int) -> None:
    """This process's niceness, and its session's where it leads one (the whole session is
    the web tier then)."""
    if not nice:
        return
    os.nice(nice)
    if os.getsid(0) != os.getpid():
        return
    try:
        with open(AUTOGROUP, "w") as autogroup:
            autogroup.write(str(nice))
    except OSError:
        pass  # no autogroup (another kernel, or it is off): the niceness is what counts


def main() -> None:
    argv = uvicorn_argv()
    # Lowered before exec: uvicorn's supervisor and every worker it forks inherit it.
    lower_priority(web_nice())
    # exec: uvicorn's supervisor takes this process's place and gets compose's signals.
    os.execvpe(sys.executable, [sys.executable, "-m", *argv], server_environ())  # noqa: S606


if __name__ == "__main__":
    main()
