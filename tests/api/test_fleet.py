"""The fleet endpoints: hosts, deployments and their config history, load profiles, prices and
the audit log — their shapes, filters, masking, errors and query counts."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from benchmarks.models import LoadProfile, Price
from changes.choices import ChangeState
from changes.models import ChangeRequest
from controlpanel.models import AuditEntry
from controlpanel.services import audit
from hosts.models import EngineOperation, HostCheck
from tests.factories import (
    make_config,
    make_deployment,
    make_gpu,
    make_host,
    make_profile,
    ssh_private_key,
)

pytestmark = pytest.mark.django_db

AGENT_TOKEN = "agent-token-SECRET-0123456789"
PASSPHRASE = "passphrase-SECRET-0123456789"
API_KEY = "sk-engine-SECRET-0123456789"
HF_TOKEN = "hf_SECRET_0123456789abcdef"


@pytest.fixture
def api(viewer, token_for):
    return token_for(viewer)


@pytest.fixture
def fleet(admin):
    """Two hosts (agent and SSH, with every kind of credential), GPUs with a reading, a
    deployment with two config versions holding secret settings, a price and a profile."""
    key = ssh_private_key()
    agent = make_host(name="gpu-a", agent_token=AGENT_TOKEN, labels={"zone": "eu", "tier": "gold"})
    ssh = make_host(
        name="gpu-b",
        transport="ssh",
        port=22,
        agent_token="",
        ssh_username="ops",
        ssh_private_key=key,
        ssh_key_passphrase=PASSPHRASE,
        labels={"zone": "us"},
        status="online",
    )
    gpu0 = make_gpu(agent, index=0, numa_node=1, cpu_affinity="0-15")
    make_gpu(agent, index=1)
    make_gpu(ssh, index=0, name="NVIDIA A100-SXM4-80GB", uuid="GPU-a100")
    gpu0.last_sample = {
        "utilization_gpu_pct": 87,
        "memory_used_bytes": 60 * 2**30,
        "power_w": 512.0,
        "pcie_tx_kbps": 1200.0,
        "throttle_reasons": ["idle", "sw_power_cap"],
    }
    gpu0.last_sample_at = timezone.now()
    gpu0.save()
    deployment = make_deployment(agent, name="llama", port=8000)
    deployment.gpus.add(gpu0)
    v1 = make_config(deployment, {"max_num_seqs": 128, "api_key": API_KEY}, created_by=admin)
    v2 = make_config(
        deployment,
        {"max_num_seqs": 256, "api_key": API_KEY},
        env={"HF_TOKEN": HF_TOKEN},
        note="more sequences",
    )
    deployment.active_config = v2
    deployment.save()
    other = make_deployment(ssh, name="qwen", engine="sglang", model="Qwen/Qwen2.5-7B", port=8001)
    price = Price.objects.create(
        name="p5.48xlarge", hourly_price=Decimal("98.32"), gpu_model="H100", gpu_count=8
    )
    price.hosts.add(agent)
    return {
        "agent": agent,
        "ssh": ssh,
        "key": key,
        "gpu": gpu0,
        "deployment": deployment,
        "other": other,
        "v1": v1,
        "v2": v2,
        "price": price,
    }


def names(answer) -> list[str]:
    assert answer.status_code == 200, answer.content
    return [row["name"] for row in answer.json()["results"]]


def assert_problem(answer, status: int, field: str | None = None):
    assert answer.status_code == status, answer.content
    assert answer["Content-Type"] == "application/problem+json"
    body = answer.json()
    assert body["status"] == status and body["title"] and body["detail"]
    if field:
        assert field in body["errors"], body
        assert field in body["detail"]
    return body


# --- hosts -------------------------------------------------------------------------------------
def test_host_list_and_detail_shapes(api, fleet):
    body = api.get("/api/v1/hosts/").json()
    assert body["count"] == 2 and body["next"] is None and body["previous"] is None
    first = body["results"][0]
    assert first["name"] == "gpu-a" and first["id"] == fleet["agent"].pk
    assert first["labels"] == {"zone": "eu", "tier": "gold"}
    assert first["has_credentials"] is True
    assert [g["index"] for g in first["gpus"]] == [0, 1]
    assert first["deployments"] == [
        {
            "id": fleet["deployment"].pk,
            "name": "llama",
            "engine": "vllm",
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "status": "unknown",
        }
    ]
    HostCheck.objects.create(
        host=fleet["agent"],
        reachable=False,
        latency_ms=1.5,
        detail="refused",
        outcome="auth_failed",
    )
    detail = api.get(f"/api/v1/hosts/{fleet['agent'].pk}/").json()
    assert detail["transport"] == "agent" and detail["port"] == 9100
    assert detail["status"] == "unknown" and detail["status_label"] == "Not contacted yet"
    assert "protection" in detail and detail["credential_problem"] == ""
    assert detail["last_check"]["reachable"] is False
    assert detail["last_check"]["outcome"] == "auth_failed"  # what it found, not that it ran
    assert detail["last_check"]["latency_ms"] == 1.5
    gpu = detail["gpus"][0]
    assert gpu["model"] == "NVIDIA H100 80GB HBM3" and gpu["numa_node"] == 1
    assert gpu["cpu_affinity"] == "0-15" and gpu["memory_bytes"] == 80 * 2**30
    # The newest reading, as the host page shows it; idle is no clock event.
    assert gpu["telemetry"]["utilization_gpu_pct"] == 87
    assert gpu["telemetry"]["pcie_tx_kbps"] == 1200.0
    assert gpu["telemetry_at"] is not None
    assert gpu["clock_events"] == ["sw_power_cap"]
    assert detail["gpus"][1]["telemetry"] == {} and detail["gpus"][1]["telemetry_at"] is None
    ssh = api.get(f"/api/v1/hosts/{fleet['ssh'].pk}/").json()
    assert ssh["ssh_username"] == "ops" and ssh["transport"] == "ssh"


@pytest.mark.parametrize(
    "query, expected",
    [
        ("", ["gpu-a", "gpu-b"]),
        ("?label=zone=eu", ["gpu-a"]),
        ("?label=zone", ["gpu-a", "gpu-b"]),
        ("?label=tier", ["gpu-a"]),
        ("?label=zone=us&label=tier", []),
        ("?label=contains=eu", []),
        ("?status=online", ["gpu-b"]),
        ("?status=unknown", ["gpu-a"]),
        ("?gpu=A100", ["gpu-b"]),
        ("?gpu=h100", ["gpu-a"]),
        ("?q=-B", ["gpu-b"]),
        ("?q=gpu&status=online", ["gpu-b"]),
    ],
)
def test_host_filters(api, fleet, query, expected):
    assert names(api.get("/api/v1/hosts/" + query)) == expected


def test_host_gpu_filter_lists_a_host_once(api, fleet):
    """A host with two matching GPUs is still one row."""
    assert names(api.get("/api/v1/hosts/?gpu=H100")) == ["gpu-a"]
    assert api.get("/api/v1/hosts/?gpu=H100").json()["count"] == 1


@pytest.mark.parametrize(
    "query, field",
    [
        ("?status=bogus", "status"),
        ("?label=Not%20A%20Key", "label"),
        ("?label==x", "label"),
    ],
)
def test_bad_host_filters_are_400_naming_the_parameter(api, fleet, query, field):
    assert_problem(api.get("/api/v1/hosts/" + query), 400, field)


def test_hosts_paginate(api, fleet):
    body = api.get("/api/v1/hosts/?page_size=1").json()
    assert body["count"] == 2 and len(body["results"]) == 1
    assert "page=2" in body["next"]
    assert names(api.get("/api/v1/hosts/?page_size=1&page=2")) == ["gpu-b"]
    assert_problem(api.get("/api/v1/hosts/?page=9"), 404)


# --- deployments -------------------------------------------------------------------------------
def test_deployment_list_and_detail(api, fleet):
    body = api.get("/api/v1/deployments/").json()
    assert body["count"] == 2
    llama = body["results"][0]
    assert {k: llama[k] for k in ("name", "host", "host_name", "engine", "engine_version")} == {
        "name": "llama",
        "host": fleet["agent"].pk,
        "host_name": "gpu-a",
        "engine": "vllm",
        "engine_version": "0.11.0",
    }
    assert llama["model"] == "meta-llama/Llama-3.1-8B-Instruct" and llama["port"] == 8000
    assert llama["launch_style"] == "process"
    assert llama["gpus"] == [{"id": fleet["gpu"].pk, "index": 0, "model": "NVIDIA H100 80GB HBM3"}]
    active = llama["active_config"]
    assert active["id"] == fleet["v2"].pk and active["version"] == 2
    assert active["settings"] == {"max_num_seqs": 256, "api_key": "•••"}
    assert active["env"] == {"HF_TOKEN": "•••"}
    assert body["results"][1]["active_config"] is None
    detail = api.get(f"/api/v1/deployments/{fleet['deployment'].pk}/").json()
    assert detail["lock"] is None
    assert detail["status"] == "unknown" and detail["status_label"] == "Unknown"
    assert detail["active_config"] == active


def test_deployment_detail_names_the_lock_holder(api, fleet):
    change = ChangeRequest.objects.create(
        deployment=fleet["deployment"], title="more seqs", rationale="r", state="applying"
    )
    detail = api.get(f"/api/v1/deployments/{fleet['deployment'].pk}/").json()
    assert detail["lock"] == {"change": change.pk, "title": "more seqs", "state": "applying"}


@pytest.mark.parametrize(
    "query, expected",
    [
        ("?name=llama", ["llama"]),
        ("?name=llama&host=gpu-a", ["llama"]),
        ("?name=llama&host=gpu-b", []),
        ("?host=gpu-b", ["qwen"]),
        ("?engine=sglang", ["qwen"]),
        ("?model=Qwen/Qwen2.5-7B", ["qwen"]),
        ("?model=Qwen", []),
        ("?name=nope", []),
    ],
)
def test_deployment_filters(api, fleet, query, expected):
    assert names(api.get("/api/v1/deployments/" + query)) == expected


def test_the_gate_resolves_a_deployment_by_name_and_host(api, fleet):
    """The contract the gate CLI relies on: a paginated list, one row per name on a host."""
    body = api.get("/api/v1/deployments/", {"name": "llama", "host": "gpu-a"}).json()
    assert set(body) >= {"count", "next", "previous", "results"} and body["count"] == 1
    row = body["results"][0]
    assert row["id"] == fleet["deployment"].pk and row["host_name"] == "gpu-a"
    assert {"id", "name", "host", "host_name", "engine", "engine_version", "model"} <= set(row)


def test_bad_engine_filter_is_400(api, fleet):
    assert_problem(api.get("/api/v1/deployments/?engine=trt"), 400, "engine")


# --- config history ----------------------------------------------------------------------------
def test_config_history_newest_first_with_diffs_and_outcomes(api, fleet, admin):
    deployment, v1, v2 = fleet["deployment"], fleet["v1"], fleet["v2"]
    change = ChangeRequest.objects.create(
        deployment=deployment,
        title="t",
        rationale="r",
        state=ChangeState.APPLIED,
        applied_config=v2,
    )
    EngineOperation.objects.create(
        deployment=deployment, kind="apply", config=v1, outcome="failed", status="failed"
    )
    EngineOperation.objects.create(
        deployment=deployment, kind="apply", config=v2, outcome="ready", status="succeeded"
    )
    body = api.get(f"/api/v1/deployments/{deployment.pk}/configs/").json()
    assert body["count"] == 2
    new, old = body["results"]
    assert (new["id"], new["version"], old["version"]) == (v2.pk, 2, 1)
    assert new["running"] is True and old["running"] is False
    assert new["change"] == change.pk and new["change_state"] == "applied"
    assert old["change"] is None and old["change_state"] is None
    assert new["outcome"] == "ready" and old["outcome"] == "failed"
    assert new["created_by"] is None and old["created_by"] == admin.username
    assert new["note"] == "more sequences"
    assert new["settings"] == {"max_num_seqs": 256, "api_key": "•••"}
    assert new["env"] == {"HF_TOKEN": "•••"}
    assert new["diff_from_version"] == 1 and old["diff_from_version"] is None
    assert new["diff"] == [
        {"key": "env.HF_TOKEN", "old": None, "new": "•••"},
        {"key": "max_num_seqs", "old": 128, "new": 256},
    ]
    assert {"key": "api_key", "old": None, "new": "•••"} in old["diff"]


def test_config_history_paginates_and_diffs_across_pages(api, fleet):
    """The last row of a page is diffed against a version on the next page."""
    body = api.get(f"/api/v1/deployments/{fleet['deployment'].pk}/configs/?page_size=1").json()
    assert body["count"] == 2 and body["results"][0]["version"] == 2
    assert {"key": "max_num_seqs", "old": 128, "new": 256} in body["results"][0]["diff"]


def test_config_history_of_an_unknown_deployment_is_404(api, fleet):
    assert_problem(api.get("/api/v1/deployments/999999/configs/"), 404)


# --- profiles and prices -----------------------------------------------------------------------
def test_profiles_newest_version_first_within_a_name(api, admin):
    make_profile("steady", note="first", created_by=admin)
    newest = make_profile("steady", note="second", description="d")
    make_profile("steady-other")
    body = api.get("/api/v1/profiles/", {"name": "steady"}).json()
    assert body["count"] == 2
    assert [(r["name"], r["version"]) for r in body["results"]] == [("steady", 2), ("steady", 1)]
    row = body["results"][0]
    assert row["id"] == newest.pk and row["note"] == "second" and row["description"] == "d"
    assert row["spec"]["stages"][0]["concurrency"] == 8
    assert row["created_by"] is None and body["results"][1]["created_by"] == admin.username
    assert api.get(f"/api/v1/profiles/{newest.pk}/").json() == row
    assert api.get("/api/v1/profiles/", {"name": "nope"}).json()["count"] == 0


def test_prices_list_and_detail(api, fleet):
    body = api.get("/api/v1/prices/").json()
    assert body["count"] == 1
    row = body["results"][0]
    assert row == api.get(f"/api/v1/prices/{fleet['price'].pk}/").json()
    assert row["name"] == "p5.48xlarge" and row["pricing"] == "on_demand"
    assert row["hourly_price"] == "98.3200" and row["per_gpu_hour"] == "12.2900"
    assert row["per_month"] == "71773.6000"
    assert row["hosts"] == [{"id": fleet["agent"].pk, "name": "gpu-a"}]
    assert row["gpu_model"] == "H100" and row["gpu_count"] == 8


# --- the audit log -----------------------------------------------------------------------------
def test_audit_list_filters_and_redaction(api, admin, fleet):
    audit(admin, "host.update", fleet["agent"], before={"port": 1}, after={"port": 2})
    audit(None, "deployment.status", fleet["deployment"])
    # An entry written before secrets were masked at write time: masked when read.
    AuditEntry.objects.create(
        actor_name="someone",
        action="config.legacy",
        object_repr="legacy",
        after={"api_key": API_KEY, "max_num_seqs": 8},
    )
    body = api.get("/api/v1/audit/", {"action": "host."}).json()
    assert body["count"] == 1
    entry = body["results"][0]
    assert entry["actor"] == admin.username and entry["action"] == "host.update"
    assert entry["object_type"] == "hosts.host" and entry["object_id"] == str(fleet["agent"].pk)
    assert entry["object"] == "gpu-a" and entry["via"] == "" and entry["remote_addr"] is None
    assert entry["before"] == {"port": 1} and entry["after"] == {"port": 2}
    assert entry["changes"] == [{"field": "port", "before": "1", "after": "2"}]
    assert api.get(f"/api/v1/audit/{entry['id']}/").json() == entry
    legacy = api.get("/api/v1/audit/", {"action": "config.legacy"}).json()["results"][0]
    assert legacy["after"] == {"api_key": "•••", "max_num_seqs": 8}
    system = api.get("/api/v1/audit/", {"actor": "system"}).json()["results"]
    assert [e["action"] for e in system] == ["deployment.status"]
    by_object = api.get(
        "/api/v1/audit/",
        {"object_type": "hosts.deployment", "object_id": str(fleet["deployment"].pk)},
    ).json()
    assert by_object["count"] == 1
    assert api.get("/api/v1/audit/", {"q": "legac"}).json()["count"] == 1
    today = timezone.localdate()
    dated = {"date_from": today.isoformat(), "date_to": today.isoformat(), "action": "host."}
    assert api.get("/api/v1/audit/", dated).json()["count"] == 1
    later = (today + timedelta(days=1)).isoformat()
    assert api.get("/api/v1/audit/", {"date_from": later}).json()["count"] == 0


@pytest.mark.parametrize(
    "query, field",
    [
        ({"date_from": "notadate"}, "date_from"),
        ({"date_to": "2026-13-40"}, "date_to"),
        ({"date_from": "2026-02-02", "date_to": "2026-01-01"}, "date_to"),
        ({"actor": "no-such-user"}, "actor"),
        ({"object_type": "hosts.nothing"}, "object_type"),
        ({"object_id": "3"}, "object_id"),
    ],
)
def test_bad_audit_filters_are_400_naming_the_parameter(api, admin, fleet, query, field):
    audit(admin, "host.update", fleet["agent"])
    assert_problem(api.get("/api/v1/audit/", query), 400, field)


# --- unknown ids, secrets, query counts --------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    [
        "hosts/999999/",
        "hosts/abc/",
        "deployments/999999/",
        "deployments/x/configs/",
        "profiles/999999/",
        "prices/999999/",
        "audit/999999/",
    ],
)
def test_unknown_ids_are_404_problems(api, path):
    assert_problem(api.get("/api/v1/" + path), 404)


def test_no_secret_appears_in_any_answer(admin, token_for, fleet):
    """Every endpoint, list and detail, read by the role that may see the most: none of the
    host credentials nor a secret engine setting is in the bytes of any answer."""
    client = token_for(admin)
    audit(admin, "config.x", fleet["v2"], after={"api_key": API_KEY, "env": {"HF_TOKEN": "x"}})
    AuditEntry.objects.create(action="config.legacy", after={"api_key": API_KEY})
    d = fleet["deployment"].pk
    paths = [
        "hosts/",
        f"hosts/{fleet['agent'].pk}/",
        f"hosts/{fleet['ssh'].pk}/",
        "deployments/",
        f"deployments/{d}/",
        f"deployments/{d}/configs/",
        "profiles/",
        "prices/",
        f"prices/{fleet['price'].pk}/",
        "audit/",
    ]
    secrets = [AGENT_TOKEN, PASSPHRASE, API_KEY, HF_TOKEN, fleet["key"].strip()]
    secrets += [line for line in fleet["key"].splitlines() if len(line) > 20 and "---" not in line]
    for path in paths:
        answer = client.get("/api/v1/" + path)
        assert answer.status_code == 200, (path, answer.content)
        for secret in secrets:
            assert secret.encode() not in answer.content, (path, secret[:12])
        for field in (
            "agent_token",
            "ssh_private_key",
            "ssh_key_passphrase",
            "credential_bindings",
        ):
            assert f'"{field}"'.encode() not in answer.content, (path, field)
    assert "•••".encode() in client.get(f"/api/v1/deployments/{d}/").content


def _fleet_of(n: int) -> None:
    for _ in range(n):
        host = make_host(labels={"zone": "x"})
        gpu = make_gpu(host, index=0)
        make_gpu(host, index=1)
        deployment = make_deployment(host)
        deployment.gpus.add(gpu)
        deployment.active_config = make_config(deployment, {"api_key": API_KEY})
        deployment.save()


def _queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


@pytest.mark.parametrize("url", ["/api/v1/hosts/", "/api/v1/deployments/"])
def test_list_queries_do_not_grow_with_the_rows(api, url, django_assert_max_num_queries):
    _fleet_of(2)
    api.get(url)  # the permission cache and the token's last use are warmed once
    few = _queries(api, url)
    _fleet_of(18)
    assert api.get(url).json()["count"] == 20
    with django_assert_max_num_queries(few):
        api.get(url)
    assert few <= 8


# --- saving load profiles ----------------------------------------------------------------------
SPEC = {
    "stages": [{"name": "main", "concurrency": 4, "num_requests": 10}],
    "input_len": {"kind": "fixed", "mean": 128},
    "output_len": {"kind": "fixed", "mean": 32},
}


def test_a_new_profile_is_saved_by_the_pages_service_and_audited_via_the_token(operator, token_for):
    client = token_for(operator, "ci")
    answer = client.post(
        "/api/v1/profiles/",
        {"name": "api-load", "spec": SPEC, "description": "from CI", "note": "first"},
        format="json",
    )
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert (body["name"], body["version"], body["source"]) == ("api-load", 1, "manual")
    assert body["description"] == "from CI" and body["note"] == "first"
    assert body["created_by"] == operator.username
    # The document as the load generator's validator normalised it.
    assert body["spec"]["stages"] == SPEC["stages"]
    assert body["spec"]["endpoint"] == "/v1/completions"
    entry = AuditEntry.objects.get(action="profile.create", object_id=str(body["id"]))
    assert entry.actor == operator and entry.via == "token ci"


def test_the_next_version_leaves_the_old_one_and_keeps_the_description(operator, token_for):
    client = token_for(operator)
    base = make_profile("steady", description="the usual")
    answer = client.post(
        f"/api/v1/profiles/{base.pk}/versions/",
        {"spec": {**SPEC, "warmup_requests": 3}, "note": "warmer"},
        format="json",
    )
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert (body["name"], body["version"], body["note"]) == ("steady", 2, "warmer")
    assert body["description"] == "the usual" and body["spec"]["warmup_requests"] == 3
    kept = LoadProfile.objects.get(pk=base.pk)
    assert kept.version == 1 and kept.spec == base.spec and kept.spec["warmup_requests"] == 2
    listed = client.get("/api/v1/profiles/", {"name": "steady"}).json()["results"]
    assert [r["version"] for r in listed] == [2, 1]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"name": "taken", "spec": SPEC}, "name"),
        ({"name": "", "spec": SPEC}, "name"),
        ({"spec": SPEC}, "name"),
        ({"name": "x"}, "spec"),
        ({"name": "x", "spec": ["not", "an", "object"]}, "spec"),
        ({"name": "x", "spec": {"stages": "many"}}, "spec"),
        ({"name": "x", "spec": {"stages": [{"concurrency": -1}]}}, "spec"),
        ({"name": "x", "spec": {"warmup_requests": [1]}}, "spec"),
        ({"name": "x", "spec": SPEC, "version": 7}, "version"),
        ({"name": "x", "spec": SPEC, "note": "n" * 201}, "note"),
    ],
)
def test_a_refused_profile_is_400_naming_the_field_and_saves_nothing(
    operator, token_for, body, field
):
    make_profile("taken")
    before = LoadProfile.objects.count()
    answer = token_for(operator).post("/api/v1/profiles/", body, format="json")
    assert_problem(answer, 400, field)
    assert LoadProfile.objects.count() == before


def test_a_nul_in_a_profile_is_refused_when_the_body_is_read(operator, token_for):
    """PostgreSQL stores no NUL: the API's body parser (controlpanel.userjson) refuses it
    before any serializer runs, saying where it was."""
    before = LoadProfile.objects.count()
    answer = token_for(operator).post(
        "/api/v1/profiles/", {"name": "x", "spec": {"note\u0000": 1}}, format="json"
    )
    body = assert_problem(answer, 400)
    assert "NUL" in body["detail"] and "spec" in body["detail"]
    assert LoadProfile.objects.count() == before


def test_a_new_version_of_an_unknown_profile_is_404(operator, token_for):
    answer = token_for(operator).post(
        "/api/v1/profiles/999999/versions/", {"spec": SPEC}, format="json"
    )
    assert_problem(answer, 404)


def test_a_new_version_refuses_what_the_page_refuses(operator, token_for):
    base = make_profile("steady")
    client = token_for(operator)
    bad = client.post(
        f"/api/v1/profiles/{base.pk}/versions/", {"spec": {"stages": 1}}, format="json"
    )
    assert_problem(bad, 400, "spec")
    renamed = client.post(
        f"/api/v1/profiles/{base.pk}/versions/", {"spec": SPEC, "name": "other"}, format="json"
    )
    assert_problem(renamed, 400, "name")
    assert LoadProfile.objects.filter(name="steady").count() == 1
