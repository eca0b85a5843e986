#!/usr/bin/env python3
"""`make test`: each test once, in parallel, with the tests that time the machine kept apart.

Two lanes run side by side:

- **The bulk**, everything not marked ``timing``, spread over ``TEST_WORKERS`` pytest-xdist
  workers by file (``--dist loadfile``: a module's servers and data are set up once, on one
  worker), in two steps:
  1. the whole suite on PostgreSQL (+ Redis, Celery, OpenSSH, Chromium). Each worker has its
     own test database (copies of one migrated database, made before and dropped after),
     VAR_DIR, Redis database and port range (tests/workers.py);
  2. the tests marked ``sqlite`` (dialect-sensitive code: raw SQL, JSON queries, locking,
     migrations) again on SQLite, the embedded default.
- **The timing lane**: the tests marked ``timing`` (they assert how quickly the machine did
  something), one at a time, in one process. A failure is run again up to twice; one that then
  passes is listed as a flake ("rerun test summary info"), not hidden.

The timing lane must not share the CPU with the bulk as an equal, so the bulk runs at a low CPU
weight: in a cgroup of its own with ``cpu.shares`` 64 (a default group has 1024; this holds
every process the bulk starts, whatever session it makes), or where no cgroup can be made,
at niceness 10. When the timing lane wants the CPU it gets nearly all of it; the rest of the
time the bulk has it all. ``TEST_TIMING=after`` runs the timing lane after the bulk instead,
on an otherwise quiet machine (longer).

With CI=true a missing service fails the run. Without PostgreSQL (not under CI) step 1 and
the timing lane run on SQLite and step 2 is left out; tests that need a missing service skip
with the reason. Every step runs even when another failed; the exit code is the first failure's.

Extra arguments go to pytest in every step (e.g. `scripts/run_tests.py -k roles`).
``TEST_WORKERS=0`` runs the bulk in one process. ``TEST_REPORT_DIR=<dir>`` writes each step's
JUnit XML report (every test's time) there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/controlpanel"
# Measured on the 2-core CI machine (docs/development.md "Tests"): the suite waits on processes and
# sockets as much as it computes, so more workers than cores pay, up to a point.
DEFAULT_WORKERS = 4
NO_TESTS = 5  # pytest's exit code when a selection is empty
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller
BULK_SHARES = 64
BULK_NICE = 10
SUMMARY = re.compile(
    r"^=+ (.*\b(?:passed|failed|error|errors|deselected|skipped)\b.*) in ([\d.]+)s"
)


def postgres_reachable(url: str) -> str | None:
    """None when PostgreSQL answers, else the reason."""
    try:
        import psycopg

        with psycopg.connect(admin_url(url), connect_timeout=3):
            return None
    except Exception as exc:  # noqa: BLE001 - reported to the user
        return str(exc).strip().splitlines()[0]


def admin_url(url: str) -> str:
    return url.rsplit("/", 1)[0] + "/postgres"


def test_database_copies(url: str, workers: int, env: dict) -> list[str]:
    """Migrate the test database once (``test_<name>``, pytest-django's name) and give each
    xdist worker a copy of it (``CREATE DATABASE ... TEMPLATE``, pytest-django's ``_gw<n>``
    names): the steps reuse them (``--reuse-db``) instead of every worker migrating its own.
    Returns the names, for ``drop_databases`` at the end."""
    import psycopg

    name = "test_" + url.rsplit("/", 1)[1]
    names = [name, *(f"{name}_gw{n}" for n in range(workers))]
    drop_databases(url, names)
    with psycopg.connect(admin_url(url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    migrate = {**env, "DATABASE_URL": url.rsplit("/", 1)[0] + "/" + name}
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v0"],
        cwd=ROOT,
        env=migrate,
        check=True,
    )
    with psycopg.connect(admin_url(url), autocommit=True) as conn:
        for copy in names[1:]:
            conn.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{name}"')
    return names


def demo_template(env: dict) -> Callable[[], bool]:
    """Start making the var/ every demo panel of the run starts from (``TEST_DEMO_VAR``: a
    migrated SQLite database and the collected static files, tests/integration/demo.py):
    once for all workers instead of once in each (~10 s of CPU each). Returns a wait for it:
    True when it was made."""
    folder = Path(env["TEST_DEMO_VAR"])
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    demo = {k: v for k, v in env.items() if k not in ("STATIC_ROOT", "DJANGO_SETTINGS_MODULE")}
    demo["VAR_DIR"] = str(folder)
    collect = "from controlpanel import static_collect; static_collect.collect_if_changed()"
    steps = (["migrate", "--no-input", "-v0"], ["shell", "-v0", "-c", collect])
    codes = []

    def make() -> None:
        for step in steps:
            codes.append(subprocess.run([sys.executable, "manage.py", *step], cwd=ROOT, env=demo))
            if codes[-1].returncode:
                return

    thread = threading.Thread(target=make, name="demo-template")
    thread.start()

    def wait() -> bool:
        thread.join()
        return len(codes) == len(steps) and not any(c.returncode for c in codes)

    return wait


def drop_databases(url: str, names: list[str]) -> None:
    import psycopg

    with psycopg.connect(admin_url(url), autocommit=True) as conn:
        for name in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def low_weight_group() -> Path | None:
    """A cgroup with a low CPU weight for the bulk, or None where none can be made (no cgroup
    v1 cpu controller, or not root)."""
    group = CPU_CGROUP / f"controlpanel-tests-{os.getpid()}"
    try:
        group.mkdir()
        (group / "cpu.shares").write_text(str(BULK_SHARES))
    except OSError:
        return None
    return group


def into(group: Path | None):
    """What the bulk's pytest runs before exec: join ``group``, or else lower its niceness in
    a session of its own (with autogroup scheduling a niceness counts within its session)."""

    def prepare() -> None:
        if group is not None:
            (group / "cgroup.procs").write_text("0")
            return
        os.nice(BULK_NICE)
        try:
            Path("/proc/self/autogroup").write_text(str(BULK_NICE))
        except OSError:
            pass

    return prepare


def files_marked(marker: str, extra: list[str]) -> list[str]:
    """The test files that can hold tests marked ``marker``: those that name it (``mark.timing``
    in a decorator or a ``pytestmark``). A step that selects by the mark then collects a few
    dozen files instead of all 400 (about 12 s of CPU a process). Empty, meaning "collect
    everything", when the run was narrowed to paths (extra arguments that are not options) or
    a conftest could add the mark. ``timing_count_problem`` checks that no test was lost."""
    if any(not arg.startswith("-") for arg in extra):
        return []
    named = re.compile(rf"\bmark\.{marker}\b")
    tests = ROOT / "tests"
    if any("add_marker" in c.read_text() for c in tests.rglob("conftest.py")):
        return []  # a hook may mark tests anywhere
    found = [f for f in sorted(tests.rglob("test_*.py")) if named.search(f.read_text())]
    return [str(f.relative_to(ROOT)) for f in found]


def counts(summary: str) -> dict[str, int]:
    """pytest's closing counts by outcome ("3 passed, 1 failed, 7 deselected")."""
    out: dict[str, int] = {}
    for number, word in re.findall(r"(\d+) (\w+)", summary):
        out[word] = out.get(word, 0) + int(number)
    return out


def timing_count_problem(bulk_summary: str, lane_summary: str) -> str | None:
    """The bulk leaves out (deselects) exactly the tests the timing lane runs; anything else
    means a timing test was in a file the lane did not collect, and ran nowhere."""
    left_out = counts(bulk_summary).get("deselected")
    lane = counts(lane_summary)
    ran = sum(
        lane.get(k, 0)
        for k in ("passed", "failed", "skipped", "error", "errors", "xfailed", "xpassed")
    )
    if left_out is None or left_out == ran:
        return None
    return (
        f"the bulk left {left_out} timing tests to the lane, which ran {ran}: a test marked"
        " timing outside the files scripts/run_tests.py found (files_marked)"
    )


def pytest(args: list[str], env: dict, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pytest", *args], cwd=ROOT, env=env, **popen)


def summary_of(text: str) -> tuple[str, float | None]:
    """pytest's closing line ("12 passed, 1 failed") and its seconds, or what stands in."""
    for line in reversed(text.splitlines()):
        match = SUMMARY.match(line.strip())
        if match:
            return match.group(1), float(match.group(2))
    return "no summary (see above)", None


def main(extra: list[str]) -> int:
    ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    base["VAR_DIR"] = tempfile.mkdtemp(prefix="controlpanel-test-")
    base.setdefault("SECRET_KEY", "test-only-" + "x" * 50)
    workers = int(os.environ.get("TEST_WORKERS", DEFAULT_WORKERS))
    timing_after = os.environ.get("TEST_TIMING", "").lower() == "after"

    pg_url = os.environ.get("TEST_DATABASE_URL", DEFAULT_PG)
    problem = postgres_reachable(pg_url)
    whole = dict(base)
    if problem is None:
        whole["DATABASE_URL"] = pg_url
        where = f"PostgreSQL ({pg_url.rsplit('@', 1)[-1]})"
    elif ci:
        print(f"PostgreSQL is required under CI=true but not reachable at {pg_url}: {problem}")
        return 1
    else:
        where = f"SQLite (PostgreSQL not reachable: {problem})"

    base["TEST_DEMO_VAR"] = str(Path(base["VAR_DIR"]) / "demo-template")
    whole["TEST_DEMO_VAR"] = base["TEST_DEMO_VAR"]
    template = demo_template(base)
    databases = []
    reuse = []
    if problem is None:
        started = time.monotonic()
        databases = test_database_copies(pg_url, workers, whole)
        reuse = ["--reuse-db"]
        print(
            f"=== test databases: migrated once, copied {workers} times "
            f"({time.monotonic() - started:.0f} s) ===",
            flush=True,
        )

    if not template():
        print("could not make the demo panels' template var/ (output above)")
        if databases:
            drop_databases(pg_url, databases)
        return 1

    parallel = ["-n", str(workers), "--dist", "loadfile"] if workers > 0 else []
    bulk = [
        (
            f"1. the suite on {where}",
            whole,
            [*parallel, "-m", "not timing", "--durations=30", *reuse],
        )
    ]
    if problem is None:
        bulk.append(
            (
                "2. dialect-sensitive tests on SQLite",
                base,
                # Unit tests, all computing: a worker a core (each migrates its own database).
                [
                    *("-n", str(min(workers, 2)), "--dist", "loadfile"),
                    *("-m", "sqlite and not timing", *files_marked("sqlite", extra)),
                ],
            )
        )
    timing_label = f"timing lane: tests marked timing, one at a time, on {where}"
    timing_args = [
        *("-m", "timing", "--reruns", "2", "-rR", "--rerun-show-tracebacks", *reuse),
        *files_marked("timing", extra),
    ]
    timing_log = Path(base["VAR_DIR"]) / "timing-lane.log"
    reports = os.environ.get("TEST_REPORT_DIR")
    if reports:
        # Every test's time, per step, for tools (docs/development.md "Tests": where the time goes).
        Path(reports).mkdir(parents=True, exist_ok=True)
        bulk = [
            (label, env, [*args, f"--junitxml={reports}/step{n}.xml"])
            for n, (label, env, args) in enumerate(bulk, 1)
        ]
        timing_args.append(f"--junitxml={reports}/timing.xml")

    group = None if timing_after else low_weight_group()
    results = []  # (label, exit code, seconds, summary)
    started = time.monotonic()
    timing = None
    if not timing_after:
        weight = f"cgroup {group}, cpu.shares {BULK_SHARES}" if group else f"nice {BULK_NICE}"
        print(
            f"=== {timing_label}: started beside the bulk (bulk at low CPU weight: "
            f"{weight}); its output follows the bulk's ===",
            flush=True,
        )
        with open(timing_log, "w") as log:
            # Its browser tests last, after the bulk's (tests/conftest.py).
            lane = {**whole, "TEST_BROWSER_LAST": "1"}
            if group is not None:
                # The lane's CPU burners (tests/benchmarks/test_client_limited_busy.py) load
                # the bulk's share, not the bulk's browsers out of theirs.
                lane["TEST_BURNER_CGROUP"] = str(group)
            timing = pytest([*timing_args, *extra], lane, stdout=log, stderr=subprocess.STDOUT)
    try:
        for label, env, args in bulk:
            print(f"\n=== {label} ===", flush=True)
            step_started = time.monotonic()
            proc = pytest(
                [*args, *extra],
                env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                preexec_fn=into(group),
            )
            lines = []
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()  # a CI log shows progress as it comes
                lines.append(line)
            code = proc.wait()
            if code == NO_TESTS and label.startswith("2."):
                code = 0  # a narrowed run (-k, a path) may select none of them
            results.append(
                (label, code, time.monotonic() - step_started, summary_of("".join(lines))[0])
            )
        if timing_after:
            print(f"\n=== {timing_label} ===", flush=True)
            with open(timing_log, "w") as log:
                timing = pytest([*timing_args, *extra], whole, stdout=log, stderr=subprocess.STDOUT)
        code = timing.wait()
        if code == NO_TESTS:
            code = 0
        text = timing_log.read_text()
        print(f"\n=== {timing_label} ===\n{text}", flush=True)
        summary, seconds = summary_of(text)  # its own time: it ran beside the bulk
        # Only a whole run can be counted: -k or a path deselects non-timing tests too.
        lost = timing_count_problem(results[0][3], summary) if results and not extra else None
        if lost:
            print(lost)
            code = code or 1
        results.append((timing_label, code, seconds or 0.0, summary))
    finally:
        if timing is not None and timing.poll() is None:
            timing.kill()
        if databases:
            drop_databases(pg_url, databases)
        if group is not None:
            try:
                group.rmdir()
            except OSError:
                pass  # a process the bulk left behind is still in it

    print("\n=== make test ===")
    total = {"passed": 0, "failed": 0, "skipped": 0}
    for label, code, seconds, summary in results:
        print(f"{label}: {summary} ({seconds:.0f} s, exit {code})")
        for number, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", summary):
            total["failed" if word.startswith("error") else word] += int(number)
    print(f"all steps: {time.monotonic() - started:.0f} s")
    print(f"{total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return next((code for _, code, _, _ in results if code), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
