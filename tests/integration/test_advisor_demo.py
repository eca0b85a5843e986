"""The advisor's "done means" on the demo fleet, end to end through the API: `manage.py serve
--demo` (embedded: SQLite, in-process worker, the demo fleet's simulated engines) as a
newcomer starts it, the built-in "Interactive chat" profile (low, normal and peak stages) on
the demo vLLM deployment, then

1. a fresh diagnosis finds the true bottleneck: the demo's running config (v3) caps the batch
   at 32 sequences, and the peak stage's 48 users queue at that cap while the KV cache is
   nearly empty (queue-bound, with its numbers and a suggested max_num_seqs);
2. exactly that suggestion is proposed (the chat profile verifies it, the diagnosed run is the
   baseline: both ran on a freshly started engine), approved by another person, applied;
3. the verification shows TTFT p95 and the engine's queue wait lower, and a fresh diagnosis
   clears the finding.

About two minutes, most of it the two runs of the profile (a minute each on the simulator).
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.integration import demo
from tests.integration.processes import wait_until

pytestmark = pytest.mark.integration

DEPLOYMENT = "llama-8b"
PROFILE = "Interactive chat"
RULE = "queue-bound"
# The server side of the deployment's newest runs as the advisor reads them (the engine's
# /metrics over each run): the numbers the queue-bound rule judges.
WINDOWS = """
import json
from changes.services.diagnosis import snapshot
from hosts.models import Deployment
runs = snapshot(Deployment.objects.get(name="llama-8b"), live=False).runs
keys = ("waiting_mean", "running_max", "queue_ms", "kv_usage_max")
print(json.dumps({r.run_id: {"current": r.config_current,
                             **{k: getattr(r.server, k, None) for k in keys}} for r in runs}))
"""


@pytest.fixture
def demo_panel(tmp_path, migrated_sqlite):
    """`manage.py serve --demo` on free ports with its own var/; (url, env, process)."""
    with demo.demo_panel(tmp_path, database=migrated_sqlite) as started:
        yield started


manage = demo.manage


def client(url: str, env, username: str) -> httpx.Client:
    token = manage(env, "create_api_token", username, "--name", "advisor-demo").strip()
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.Client(base_url=url + "/api/v1/", headers=headers, timeout=60)


# Before/after verdicts on two real-time runs of the simulator: the machine must keep time.
@pytest.mark.timing
def test_a_finding_on_the_demo_becomes_a_verified_change_and_clears(demo_panel):
    url, env, panel = demo_panel
    operator, approver = client(url, env, "operator"), client(url, env, "approver")

    def log():
        return panel.output()[-4000:]

    def running():
        rows = operator.get("deployments/", params={"name": DEPLOYMENT}).json()["results"]
        return rows and rows[0]["status"] == "running" and rows[0]

    deployment = wait_until(running, 90, lambda: "the demo engine never ran:\n" + log(), 0.5)
    profiles = operator.get("profiles/", params={"page_size": 100}).json()["results"]
    profile = next(p for p in profiles if p["name"] == PROFILE)

    # --- the newcomer's run, and what the advisor makes of it -----------------------------
    started = operator.post(
        "runs/", json={"deployment": deployment["id"], "profile": profile["id"], "label": "peak"}
    )
    assert started.status_code == 201, started.text

    def run_finished():
        body = operator.get(started.headers["Location"]).json()
        return body["finished"] and body

    run = wait_until(run_finished, 150, lambda: "the chat run never finished:\n" + log(), 1)
    assert run["status"] == "succeeded", run

    diagnosis = operator.get(
        f"deployments/{deployment['id']}/diagnosis/", params={"refresh": "1"}
    ).json()
    assert diagnosis["engine_status"] == "live", diagnosis
    finding = next((f for f in diagnosis["findings"] if f["rule"] == RULE), None)
    assert finding is not None, diagnosis
    evidence = finding["evidence"]
    cap = deployment["active_config"]["settings"]["max_num_seqs"]
    # Requests waited while every allowed sequence ran and the cache had room: the cap, not
    # memory, held them back.
    assert evidence["max_num_seqs"] == cap and evidence["running_max"] >= 0.9 * cap
    assert evidence["waiting_mean"] >= 1 and evidence["queue_ms"] > 0
    assert evidence["kv_usage_max"] < 0.8
    assert finding["source"] == f"run {run['id']}" and f"run {run['id']}" in finding["seen"]
    suggested = finding["suggestion"]["settings"]
    assert set(suggested) == {"max_num_seqs"} and suggested["max_num_seqs"] > cap
    listed = operator.get("findings/", params={"deployment": deployment["id"]}).json()
    assert finding["id"] in [f["id"] for f in listed["results"]]

    # --- propose exactly the suggestion, approve (four eyes), apply -----------------------
    # More sequences per decode step is the fix's price: ITL p95 rises (19.7 -> 26.3 ms,
    # +34 %, measured here), past the change's default guard of +20 %, which rolls it back.
    # The reviewer who takes the trade bounds ITL by the profile's own TPOT SLO instead.
    slo_tpot = profile["spec"]["slo"]["tpot"]
    itl_limit = int(100 * (slo_tpot / run["results"]["p95_itl_ms"] - 1))
    assert itl_limit > 20, (slo_tpot, run["results"]["p95_itl_ms"])
    proposed = operator.post(
        "changes/",
        json={
            "deployment": deployment["id"],
            "title": finding["title"][:120],
            "rationale": (
                f"{finding['seen']}\n\n{finding['why']}\n\nFrom advisor finding "
                f"#{finding['id']} ({RULE}). ITL p95 may grow up to the profile's "
                f"{slo_tpot} ms TPOT SLO (+{itl_limit} %): the price of a larger batch."
            ),
            "settings": suggested,
            "verify_profile": profile["id"],
            # Measured on this config on a freshly started engine, as the verification will
            # be after the apply's restart: same conditions, and one run less to wait for.
            "baseline_run": run["id"],
            "max_itl_p95_regression": itl_limit,
        },
    )
    assert proposed.status_code == 201, proposed.text
    change = proposed.json()
    assert [row["flag"] for row in change["diff"]] == ["max_num_seqs"], change["diff"]
    approved = approver.post(f"changes/{change['id']}/approve/", json={"comment": "go"})
    assert approved.status_code == 200, approved.text
    applied = approver.post(f"changes/{change['id']}/apply/", json={})
    assert applied.status_code == 200, applied.text

    def change_finished():
        body = operator.get(f"changes/{change['id']}/").json()
        return body["state"] in ("applied", "unverified", "rolled_back", "failed") and body

    change = wait_until(change_finished, 150, lambda: "the change never ended:\n" + log(), 1)
    assert change["state"] in ("applied", "unverified"), (change["state"], change["verdict"])

    # --- the verification shows the improvement on what the finding was about ------------
    verification = operator.get(f"runs/{change['verification_run_id']}/").json()
    before, after = run["results"], verification["results"]
    assert verification["config_version"] == run["config_version"] + 1
    assert after["completed"] == before["completed"] and after["failed"] == 0
    # TTFT p95 carries the queue wait: the peak stage's 48 users no longer wait for one of
    # 32 slots (about 1.8 s before, under 1 s after on an idle machine).
    assert after["p95_ttft_ms"] < 0.8 * before["p95_ttft_ms"], (before, after)
    ttft = next(c for c in change["verdict"]["checks"] if c["metric"] == "ttft_p95_ms")
    assert ttft["after"] < ttft["baseline"], change["verdict"]
    if change["state"] == "applied":
        assert change["verdict"]["outcome"] == "verified", change["verdict"]
    # else "unverified": the verdict could not tell on this machine (noise); the numbers
    # above are the evidence then.

    # The engine's side of the same runs: the queue the finding was about has drained (mean
    # wait about 770 -> 50 ms, on average 4.4 -> 0.3 requests waiting), and the new cap is no
    # longer reached (48 of 64 ran at peak).
    windows = json.loads(manage(env, "shell", "-c", WINDOWS).strip().splitlines()[-1])
    old, new = windows[str(run["id"])], windows[str(verification["id"])]
    assert new["current"] and not old["current"], windows
    assert new["queue_ms"] < 0.5 * old["queue_ms"], windows
    assert new["waiting_mean"] < 1 <= old["waiting_mean"], windows
    assert new["running_max"] < 0.9 * suggested["max_num_seqs"], windows

    # --- and the finding is gone ----------------------------------------------------------
    # (It may have cleared already: a beat sweep after the apply found no run of the new
    # config yet, so no evidence of the queue. This diagnosis reads the verification run.)
    diagnosis = operator.get(
        f"deployments/{deployment['id']}/diagnosis/", params={"refresh": "1"}
    ).json()
    assert RULE not in [f["rule"] for f in diagnosis["findings"]], diagnosis
    listed = operator.get("findings/", params={"deployment": deployment["id"]}).json()
    assert finding["id"] not in [f["id"] for f in listed["results"]]
    history = operator.get(
        "findings/", params={"deployment": deployment["id"], "include": "cleared"}
    ).json()
    cleared = next(f for f in history["results"] if f["id"] == finding["id"])
    assert cleared["cleared_at"] is not None and cleared["state"] == "cleared", cleared
    operator.close()
    approver.close()
