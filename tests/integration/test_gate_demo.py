"""The CI gate end to end: `manage.py serve --demo` (embedded: SQLite, in-process worker, the
demo fleet's simulated engines), a token from `manage.py create_api_token`, and
`python -m benchmarks.gate` as a subprocess, as a CI job runs it.

1. No baseline yet: exit 2, saying so (and no run is started).
2. A baseline run through the API, then the gate on the same state: exit 0 ("verified", or
   "inconclusive" accepted with --allow-inconclusive when a loaded machine makes the runs'
   noise straddle a limit: never "within limits" on evidence that cannot tell).
3. A regression: a baseline seeded as the gate's run's copy with a quarter of its TTFT (same profile
   version, same engine state and cache, as fast as the engine once was), so the gate's real
   run is +300 % on TTFT p95: exit 1.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import httpx
import pytest

from tests.integration import demo
from tests.integration.processes import ROOT, wait_until

pytestmark = pytest.mark.integration

DEPLOYMENT = "sim-h100-01/llama-8b"
PROFILE = "gate-demo"
# One request at a time, fixed lengths, enough successful requests for a p95 (the verdict
# wants 20): about five seconds on the simulated H100.
SEED = """
import json
from benchmarks.models import LoadProfile
profile = LoadProfile.objects.create_next("gate-demo", {
    "stages": [{"name": "main", "concurrency": 1, "num_requests": 24}],
    "input_len": {"kind": "fixed", "mean": 128},
    "output_len": {"kind": "fixed", "mean": 16},
    "warmup_requests": 2,
})
print(json.dumps({"profile": profile.pk}))
"""
# The run RUN_ID again, four times faster: what a better engine measured earlier.
FAST_COPY = """
import json
from datetime import timedelta
from django.utils import timezone
from benchmarks.models import BenchmarkRun
run = BenchmarkRun.objects.get(pk=RUN_ID)
run.pk = run.id = None
run._state.adding = True
run.label = "seeded fast baseline"
run.created_at = timezone.now()
run.started_at = run.started_at + timedelta(milliseconds=1)
for column in ("ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms"):
    setattr(run, column, getattr(run, column) / 4)
run.save()
print(json.dumps({"run": run.pk, "ttft_p95_ms": run.ttft_p95_ms}))
"""


@pytest.fixture
def demo_panel(tmp_path, migrated_sqlite):
    """`manage.py serve --demo` on free ports with its own var/; (url, env, process)."""
    with demo.demo_panel(tmp_path, database=migrated_sqlite) as started:
        yield started


manage = demo.manage


def seed(env, script: str) -> dict:
    return json.loads(manage(env, "shell", "-c", script).strip().splitlines()[-1])


def gate(url, token_file, tmp_path, *extra) -> subprocess.CompletedProcess:
    args = [
        sys.executable,
        "-m",
        "benchmarks.gate",
        "--panel",
        url,
        "--token-file",
        str(token_file),
        "--deployment",
        DEPLOYMENT,
        "--profile",
        PROFILE,
        "--poll",
        "0.5",
        "--timeout",
        "120",
        "--result-filename",
        str(tmp_path / "gate.json"),
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


# The gate compares two real-time runs: on a starved machine the same state reads as a regression.
@pytest.mark.timing
def test_the_gate_passes_the_same_state_and_fails_a_regression(demo_panel, tmp_path):
    url, env, panel = demo_panel
    ids = seed(env, SEED)
    token = manage(env, "create_api_token", "operator", "--name", "ci-gate").strip()
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    api = httpx.Client(
        base_url=url + "/api/v1/", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )

    def log():
        return panel.output()[-4000:]

    # The demo engine must be up: the first run waits for its readiness anyway, but a
    # deployment still being started is busy.
    def running():
        rows = api.get("deployments/", params={"name": "llama-8b"}).json()["results"]
        return rows and rows[0]["status"] == "running" and rows[0]

    deployment = wait_until(running, 90, lambda: "the demo engine never ran:\n" + log(), 0.5)

    # 1. Nothing to compare with yet.
    first = gate(url, token_file, tmp_path)
    assert first.returncode == 2, first.stdout + first.stderr
    assert "no succeeded run of gate-demo v1" in first.stderr
    assert token not in first.stdout + first.stderr
    assert api.get("runs/", params={"profile": ids["profile"]}).json()["count"] == 0

    # 2. A baseline through the API, then the gate on the same state. The engine's first
    # run primes its prefix cache (the profile's prompts repeat from run to run: 0 % hits,
    # then 87.5 %), which the verdict rightly calls different conditions: a warm-up first.
    def measure(label: str) -> dict:
        body = {"deployment": deployment["id"], "profile": ids["profile"], "label": label}
        started = api.post("runs/", json=body)
        assert started.status_code == 201, started.text

        def finished():
            body = api.get(started.headers["Location"]).json()
            return body["finished"] and body

        run = wait_until(finished, 90, lambda: f"the {label} run never finished:\n" + log(), 0.5)
        assert run["status"] == "succeeded", run
        return run

    measure("warm-up")
    baseline = measure("baseline")
    assert baseline["results"]["completed"] == 24 and baseline["results"]["p95_ttft_ms"] > 0

    passed = gate(url, token_file, tmp_path, "--allow-inconclusive")
    out = passed.stdout
    assert passed.returncode == 0, out + passed.stderr
    assert re.search(r"^(verified|inconclusive): ", out, re.M), out
    assert f"baseline: run {baseline['id']}" in out
    assert "check" in out and "TTFT p95" in out and "Load profile" in out
    saved = json.loads((tmp_path / "gate.json").read_text())
    assert saved["run"]["status"] == "succeeded" and saved["run"]["results"]["completed"] == 24
    assert saved["verdict"]["outcome"] in ("verified", "inconclusive")
    assert token not in out + passed.stderr

    # 3. Against a baseline four times faster on TTFT: a regression.
    fast = seed(env, FAST_COPY.replace("RUN_ID", str(saved["run"]["id"])))
    failed = gate(
        url, token_file, tmp_path, "--baseline", str(fast["run"]), "--max-regression",
        "ttft_p95=10%,itl_p95=50%,error_rate=1pp",
    )  # fmt: skip
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "regressed: TTFT p95" in failed.stdout
    saved = json.loads((tmp_path / "gate.json").read_text())
    assert saved["verdict"]["outcome"] == "regressed"
    assert saved["verdict"]["baseline"] == fast["run"]
    ttft = next(c for c in saved["verdict"]["checks"] if c["metric"] == "ttft_p95_ms")
    assert ttft["ok"] is False and ttft["change"] > 1.0
    api.close()
