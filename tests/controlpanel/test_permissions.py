"""Every view: anonymous → login redirect, a role without the right → 403, the right role → OK."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.urls import get_resolver, reverse

from benchmarks import records
from benchmarks.models import Price, RunRequestLog
from hosts.models import EngineOperation
from tests.factories import make_config, make_deployment, make_finished_run, make_host

# The role matrix: its personas are made once for the module.
pytestmark = pytest.mark.usefixtures("shared_personas")

ALL = ["viewer", "operator", "approver", "admin"]
OPERATORS = ["operator", "approver", "admin"]

# (url name, method, roles allowed); pk-taking views get the object made by `objects`.
MATRIX = [
    ("dashboard", "get", ALL),
    ("audit", "get", ALL),
    ("audit_export", "get", ALL),
    ("hosts:list", "get", ALL),
    ("hosts:detail", "get", ALL),
    ("hosts:checks", "get", ALL),
    ("hosts:create", "get", OPERATORS),
    ("hosts:edit", "get", OPERATORS),
    ("hosts:check", "post", OPERATORS),
    ("hosts:part", "get", ALL),
    ("hosts:telemetry", "get", ALL),
    ("hosts:accept_key", "post", ["admin"]),
    ("hosts:deployment_new", "get", OPERATORS),
    # The guided setup of a host: Operators and Admins (an agent host: the SSH-only and
    # fetch actions answer with an explanation, a redirect).
    ("hosts:onboard", "get", OPERATORS),
    ("hosts:onboard_status", "get", OPERATORS),
    ("hosts:onboard_token", "post", OPERATORS),
    ("hosts:onboard_fetch_certificate", "post", OPERATORS),
    ("hosts:onboard_pin", "post", OPERATORS),
    ("hosts:onboard_ssh_key", "post", OPERATORS),
    ("hosts:onboard_accept_key", "post", ["admin"]),
    ("hosts:restart", "post", OPERATORS),
    # A new deployment's first start on a production host (the rule then also refuses its
    # creator, tests/api/test_deployments_create.py).
    ("hosts:deployment_review", "post", ["approver", "admin"]),
    ("hosts:operation", "get", ALL),
    ("benchmarks:list", "get", ALL),
    ("benchmarks:detail", "get", ALL),
    ("benchmarks:new", "get", OPERATORS),
    ("benchmarks:cancel", "post", OPERATORS),
    ("benchmarks:timeline", "get", ALL),
    ("benchmarks:part", "get", ALL),
    ("benchmarks:compare", "get", ALL),
    ("benchmarks:import", "get", OPERATORS),
    ("benchmarks:import_job", "get", OPERATORS),
    ("benchmarks:import_job_progress", "get", OPERATORS),
    ("benchmarks:export_json", "get", ALL),
    ("benchmarks:export_csv", "get", ALL),
    ("benchmarks:profiles", "get", ALL),
    ("benchmarks:profile", "get", ALL),
    ("benchmarks:profile_create", "get", OPERATORS),
    ("benchmarks:profile_edit", "get", OPERATORS),
    ("benchmarks:profile_from_traffic", "get", OPERATORS),
    ("benchmarks:profile_import", "get", OPERATORS),
    ("benchmarks:profile_export", "get", ALL),
    ("benchmarks:probe_sets", "get", ALL),
    ("benchmarks:probe_set_upload", "get", OPERATORS),
    ("benchmarks:probe_set", "get", ALL),
    ("benchmarks:probe_new", "get", OPERATORS),
    ("benchmarks:probe_run", "get", ALL),
    ("benchmarks:probe_run_part", "get", ALL),
    ("benchmarks:probe_cancel", "post", OPERATORS),
    ("benchmarks:probe_compare", "get", ALL),
    ("benchmarks:quality", "get", ALL),
    ("benchmarks:prices", "get", ALL),
    ("benchmarks:price_create", "get", ["admin"]),
    ("benchmarks:price_edit", "get", ["admin"]),
    ("benchmarks:price_delete", "post", ["admin"]),
    ("changes:list", "get", ALL),
    ("changes:new", "get", OPERATORS),
    ("changes:preview", "post", OPERATORS),
    ("changes:detail", "get", ALL),
    ("changes:timeline", "get", ALL),
    ("changes:part", "get", ALL),
    # Only the proposer (or an Admin) submits or withdraws: the change here has no proposer.
    ("changes:submit", "post", ["admin"]),
    ("changes:approve", "post", ["approver", "admin"]),
    # Approving a change predicted not to start: Admins only (this one is not, so the
    # Admin's post is refused politely with a message: a redirect).
    ("changes:approve_override", "post", ["admin"]),
    ("changes:reject", "post", ["approver", "admin"]),
    ("changes:withdraw", "post", ["admin"]),
    ("changes:comment", "post", OPERATORS),
    ("changes:rebase", "post", OPERATORS),
    ("changes:apply", "post", OPERATORS),
    ("changes:resume", "post", OPERATORS),
    ("changes:rollback", "post", OPERATORS),
    ("changes:all_configs", "get", ALL),
    ("changes:configs", "get", ALL),
    ("changes:propose_rollback", "post", OPERATORS),
    ("changes:advisor_deployment", "get", ALL),
    ("changes:advisor_run", "get", ALL),
    ("changes:advisor_fleet", "get", ALL),
    ("changes:advisor_dismiss", "post", OPERATORS),
    ("cost", "get", ALL),
    ("changes:sweeps", "get", ALL),
    ("changes:sweep_new", "get", OPERATORS),
    ("changes:sweep", "get", ALL),
    ("changes:sweep_part", "get", ALL),
    ("changes:sweep_approve", "post", ["approver", "admin"]),
    ("changes:sweep_reject", "post", ["approver", "admin"]),
    ("changes:sweep_start", "post", OPERATORS),
    ("changes:sweep_cancel", "post", OPERATORS),
    ("changes:sweep_propose", "post", OPERATORS),
    ("scaling:fleet", "get", ALL),
    ("scaling:deployment", "get", ALL),
    ("scaling:policy", "post", OPERATORS),
    ("scaling:signals_json", "get", ALL),
    ("scaling:export", "get", ALL),
    ("scaling:whatif_new", "get", OPERATORS),
    ("scaling:whatif", "get", ALL),
    ("scaling:whatif_status", "get", ALL),
]
# Public on purpose, or Django's own account views, which every logged-in user may use.
PUBLIC = {
    "healthz",
    "favicon",  # tests/home/test_favicon.py
    "login",
    "logout",
    "password_reset",
    "password_reset_done",
    "password_reset_confirm",
    "password_reset_complete",
    "password_change",
    "password_change_done",
    # Its own access (an API token, or an allowed address; 401, not a login redirect):
    # tests/api/test_metrics.py.
    "metrics",
    # The agent zipapp for curl on a GPU server: a signed key bound to the host instead of a
    # login (404 without it): tests/hosts/test_onboarding.py.
    "hosts:agent_download",
}


# Views whose URL takes something other than the object of their app.
ARGS = {
    "audit_export": lambda o: ["csv"],
    "hosts:part": lambda o: [o["hosts"], "facts"],
    "hosts:restart": lambda o: [o["deployment"]],
    "hosts:deployment_review": lambda o: [o["deployment"]],
    "hosts:operation": lambda o: [o["operation"]],
    "benchmarks:part": lambda o: [o["benchmarks"], "results"],
    "benchmarks:profile": lambda o: [o["profile"]],
    "benchmarks:import_job": lambda o: [_import_job(o)],
    "benchmarks:import_job_progress": lambda o: [_import_job(o)],
    "benchmarks:profile_edit": lambda o: [o["profile"]],
    "benchmarks:profile_export": lambda o: [o["profile"]],
    "benchmarks:price_edit": lambda o: [o["price"]],
    "benchmarks:price_delete": lambda o: [o["price"]],
    "benchmarks:probe_set": lambda o: [_probe(o).probe_set_id],
    "benchmarks:probe_run": lambda o: [_probe(o).pk],
    "benchmarks:probe_run_part": lambda o: [_probe(o).pk],
    "benchmarks:probe_cancel": lambda o: [_probe(o).pk],
    "benchmarks:probe_compare": lambda o: [_probe(o).pk, _probe(o).pk],
    "changes:detail": lambda o: [_change(o)],
    "changes:timeline": lambda o: [_change(o)],
    "changes:part": lambda o: [_change(o), "actions"],
    "changes:submit": lambda o: [_change(o)],
    "changes:approve": lambda o: [_change(o)],
    "changes:approve_override": lambda o: [_change(o)],
    "changes:reject": lambda o: [_change(o)],
    "changes:withdraw": lambda o: [_change(o)],
    "changes:comment": lambda o: [_change(o)],
    "changes:rebase": lambda o: [_change(o)],
    "changes:apply": lambda o: [_change(o)],
    "changes:resume": lambda o: [_change(o)],
    "changes:rollback": lambda o: [_change(o)],
    "changes:configs": lambda o: [o["deployment"]],
    "changes:propose_rollback": lambda o: [_config(o)],
    "changes:advisor_deployment": lambda o: [o["deployment"]],
    "changes:advisor_run": lambda o: [o["benchmarks"]],
    "changes:advisor_dismiss": lambda o: [_finding(o)],
    "scaling:deployment": lambda o: [o["deployment"]],
    "scaling:policy": lambda o: [o["deployment"]],
    "scaling:signals_json": lambda o: [o["deployment"]],
    "scaling:export": lambda o: [o["deployment"], "keda.yaml"],
    "scaling:whatif_new": lambda o: [o["deployment"]],
    "scaling:whatif": lambda o: [_whatif(o)],
    "scaling:whatif_status": lambda o: [_whatif(o)],
    **{
        name: lambda o: [_sweep(o)]
        for name in (
            "changes:sweep",
            "changes:sweep_part",
            "changes:sweep_approve",
            "changes:sweep_reject",
            "changes:sweep_start",
            "changes:sweep_cancel",
            "changes:sweep_propose",
        )
    },
}


def _whatif(o) -> int:
    """A what-if of the deployment that failed (its page shows the error, no result)."""
    from scaling.models import WhatIfPlan

    plan, _ = WhatIfPlan.objects.get_or_create(
        deployment_id=o["deployment"], defaults={"status": "failed", "error": "no config"}
    )
    return plan.pk


def _sweep(o) -> int:
    """A sweep pending review on the deployment, made by nobody in the personas."""
    from benchmarks.models import LoadProfile
    from changes.models import Sweep

    sweep, _ = Sweep.objects.get_or_create(
        deployment_id=o["deployment"],
        title="more throughput",
        defaults={
            "state": "pending",
            "required_approvals": 1,
            "load_profile": LoadProfile.objects.get(pk=o["profile"]),
            "space": {"max_num_seqs": [64, 128]},
            "slo": {"ttft_p95_ms": 500, "max_error_rate": 0.01},
        },
    )
    return sweep.pk


PROBE_ITEM = {
    "id": "q1",
    "category": "factual",
    "language": "en",
    "messages": [{"role": "user", "content": "The capital of France?"}],
    "answer": {"scorer": "exact", "expected": "Paris"},
    "reference": "Paris",
}


def _probe(o):
    """A finished quality probe of the deployment (a cancel of it is refused politely)."""
    from benchmarks.models_quality import ProbeRun, ProbeSet

    probe_set = ProbeSet.objects.filter(name="perm-set").first() or ProbeSet.objects.create(
        name="perm-set", items=[PROBE_ITEM], coverage={"factual/en": 1}, item_count=1
    )
    run, _ = ProbeRun.objects.get_or_create(
        deployment_id=o["deployment"],
        probe_set=probe_set,
        defaults={"status": "succeeded", "total": 1, "done": 1},
    )
    return run


def _change(o) -> int:
    """A pending change on the deployment, proposed by nobody in the personas."""
    from changes.models import ChangeRequest

    change, _ = ChangeRequest.objects.get_or_create(
        deployment_id=o["deployment"],
        title="More sequences",
        defaults={
            "rationale": "Queue wait dominates TTFT.",
            "state": "pending",
            "settings": {"max_num_seqs": 512},
        },
    )
    return change.pk


def _finding(o) -> int:
    """An active advisor finding on the deployment (a POST without a reason leaves it so)."""
    from changes.models import Finding

    finding, _ = Finding.objects.get_or_create(
        deployment_id=o["deployment"],
        rule="queue-bound",
        defaults={"severity": "warning", "title": "Requests wait", "seen": "…", "why": "…"},
    )
    return finding.pk


def _import_job(o) -> int:
    """A finished import of a result file into the deployment."""
    from benchmarks.models import ImportJob

    job, _ = ImportJob.objects.get_or_create(
        deployment_id=o["deployment"], filename="bench.json", defaults={"status": "failed"}
    )
    return job.pk


def _config(o) -> int:
    from hosts.models import EngineConfig

    return EngineConfig.objects.filter(deployment_id=o["deployment"]).first().pk


# Views that read their objects from the query string.
QUERY = {
    "benchmarks:compare": lambda o: f"?runs={o['benchmarks']}&runs={o['run2']}",
    "changes:preview": lambda o: f"?deployment={o['deployment']}",
    "benchmarks:quality": lambda o: f"?deployment={o['deployment']}",
}


@pytest.fixture
def objects(db):
    host = make_host()
    deployment = make_deployment(host)
    config = make_config(deployment)
    operation = EngineOperation.objects.create(
        deployment=deployment, kind="apply", config=config, status="failed"
    )
    run = make_finished_run(deployment)
    RunRequestLog.objects.create(run=run, count=0, data=records.encode([]))
    price = Price.objects.create(name="p5.48xlarge", hourly_price=Decimal("98.32"))
    return {
        "hosts": host.pk,
        "benchmarks": run.pk,
        "run2": make_finished_run(deployment).pk,
        "profile": run.load_profile_id,
        "price": price.pk,
        "deployment": deployment.pk,
        "operation": operation.pk,
    }


def url_for(name, objects):
    if name in QUERY:
        return reverse(name) + QUERY[name](objects)
    if name in ARGS:
        return reverse(name, args=ARGS[name](objects))
    try:
        return reverse(name)
    except Exception:
        return reverse(name, args=[objects[name.split(":")[0]]])


def call(client, method, url):
    return client.post(url) if method == "post" else client.get(url)


@pytest.mark.parametrize(("name", "method", "allowed"), MATRIX)
def test_anonymous_is_sent_to_login(client, objects, name, method, allowed):
    url = url_for(name, objects)
    response = call(client, method, url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login") + "?next=")


@pytest.mark.parametrize(("name", "method", "allowed"), MATRIX)
def test_roles(client, personas, objects, name, method, allowed):
    url = url_for(name, objects)
    for role, user in personas.items():
        client.force_login(user)
        status = call(client, method, url).status_code
        if role in allowed:
            assert status in (200, 302), f"{role} should reach {name}, got {status}"
            if method == "get":
                assert status == 200
        else:
            assert status == 403, f"{role} should be refused {name}, got {status}"
        client.logout()


def test_forbidden_page_explains_missing_role(client, nobody):
    client.force_login(nobody)
    response = client.get(reverse("dashboard"))
    assert response.status_code == 403
    assert b"has no role" in response.content


# Pages any signed-in user may use, with a role or without: their own API tokens, the API docs.
SIGNED_IN = {"api:tokens", "api:token_revoke", "api:docs"}


def _api_resource(namespace: str, name: str) -> bool:
    """A JSON resource under /api/v1/ (not a page): its role × method matrix lives in
    tests/api/*_permissions.py, with 401 problem details instead of a login redirect."""
    if namespace != "api" or f"api:{name}" in SIGNED_IN:
        return False
    try:
        return reverse(f"api:{name}").startswith("/api/v1/")
    except Exception:  # noqa: BLE001 - takes arguments: every such route is a resource
        return True


@pytest.mark.parametrize("name", ["api:tokens", "api:docs"])
def test_signed_in_pages_need_a_login_but_no_role(client, personas, name):
    url = reverse(name)
    response = client.get(url)
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    for user in personas.values():
        client.force_login(user)
        assert client.get(url).status_code == 200
        client.logout()


def test_every_url_is_in_the_matrix():
    """A new view must be added to MATRIX (and so get its permission test)."""
    covered = {name for name, _, _ in MATRIX} | PUBLIC | SIGNED_IN
    missing = []
    for namespace, (_, resolver) in get_resolver().namespace_dict.items():
        if namespace == "admin":
            continue
        for name in resolver.reverse_dict:
            if not isinstance(name, str) or _api_resource(namespace, name):
                continue
            if f"{namespace}:{name}" not in covered:
                missing.append(f"{namespace}:{name}")
    for name in get_resolver().reverse_dict:
        if isinstance(name, str) and name not in covered:
            missing.append(name)
    assert not missing, f"views without a permission test: {missing}"


def test_healthz_needs_no_login(client, db):
    response = client.get(reverse("healthz"))
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_password_change_needs_login_but_no_role(client, nobody):
    url = reverse("password_change")
    assert client.get(url).status_code == 302
    client.force_login(nobody)
    assert client.get(url).status_code == 200


def test_admin_site_refuses_non_staff(client, operator):
    client.force_login(operator)
    response = client.get("/admin/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
