"""The OpenAPI schema tells the truth: every GET endpoint it lists is called with real data
and its answer validated against the schema (openapi-core); the main writes too.

The endpoints come from the schema itself, so a new resource is walked as soon as it exists;
one whose path parameter this test has no sample for fails, naming it."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from unittest import mock

import pytest
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from openapi_core import OpenAPI
from openapi_core.testing import MockRequest, MockResponse

from benchmarks.models import Price
from changes.models import Finding
from changes.services import review
from controlpanel.services import audit
from tests.api.sweep_samples import make_done_sweep
from tests.benchmarks.test_probe_pages import make_probe_run, make_probe_set
from tests.factories import (
    make_config,
    make_deployment,
    make_finished_run,
    make_gpu,
    make_host,
    make_profile,
)

pytestmark = pytest.mark.django_db
HOST = "http://testserver"


@pytest.fixture(scope="module")
def schema_document(django_db_blocker):
    with django_db_blocker.unblock():
        schema = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(OpenApiJsonRenderer().render(schema))


@pytest.fixture
def world(admin, operator):
    """One of everything the API shows, with the fields the pages fill in."""
    host = make_host(name="gpu-a", labels={"zone": "eu"})
    gpu = make_gpu(host, index=0, numa_node=0)
    gpu.last_sample = {"utilization_gpu_pct": 50, "memory_used_bytes": 2**30, "power_w": 300.0}
    gpu.last_sample_at = timezone.now()
    gpu.save()
    deployment = make_deployment(host, name="llama", port=8000)
    deployment.gpus.add(gpu)
    v1 = make_config(deployment, {"max_num_seqs": 128}, created_by=admin)
    v2 = make_config(deployment, {"max_num_seqs": 256}, note="more")
    deployment.active_config = v2
    deployment.save()
    profile = make_profile("api-walk")
    baseline = make_finished_run(deployment, load_profile=profile, engine_config=v1)
    run = make_finished_run(deployment, load_profile=profile, engine_config=v2)
    price = Price.objects.create(
        name="p5", hourly_price=Decimal("98.32"), gpu_model="H100", gpu_count=8
    )
    price.hosts.add(host)
    change = review.propose_change(
        operator,
        deployment,
        settings={**v2.settings, "max_num_seqs": 64},
        title="Fewer sequences",
        rationale="KV preemptions at peak.",
    )
    entry = audit(admin, "test.walk", host, after={"name": host.name})
    # An advisor finding, so the diagnosis and the findings list answer with one.
    Finding.objects.create(
        deployment=deployment,
        rule="queue-bound",
        severity="warning",
        title="Requests wait",
        seen="12 waiting",
        why="why",
        evidence={"waiting_mean": 12},
        suggestion={"settings": {"max_num_seqs": 64}, "action": ""},
    )
    # A done tuning sweep (prediction, lane, trials with probes), made row by row.
    sweep = make_done_sweep(deployment, operator, profile)
    # Two quality probes of one set version, made row by row (one simulated).
    probe_set = make_probe_set()
    probe_baseline = make_probe_run(deployment, probe_set, engine_config=v1)
    probe = make_probe_run(deployment, probe_set, wrong={"ko-1"}, engine_config=v2, simulated=True)
    return {
        "quality-probes": probe.pk,
        "probe-sets": probe_set.pk,
        "probe_baseline": probe_baseline.pk,
        "sweeps": sweep.pk,
        "hosts": host.pk,
        "deployments": deployment.pk,
        "profiles": profile.pk,
        "runs": run.pk,
        "changes": change.pk,
        "prices": price.pk,
        "audit": entry.pk,
        "baseline": baseline.pk,
        "configs": v2.pk,
    }


def sample_path(path: str, world: dict) -> str:
    """``/api/v1/runs/{id}/`` → ``/api/v1/runs/7/``: each parameter is the id of the resource
    named by the segment before it."""
    parts = path.strip("/").split("/")
    out = []
    for i, part in enumerate(parts):
        match = re.fullmatch(r"\{(\w+)\}", part)
        if match is None:
            out.append(part)
            continue
        resource = parts[i - 1] if i else ""
        assert resource in world, f"no sample id for {{{match.group(1)}}} in {path}"
        out.append(str(world[resource]))
    return "/" + "/".join(out) + "/"


# Query parameters an endpoint needs to answer 200 at all.
REQUIRED_QUERY = {
    "verdict": lambda world: {"baseline": world["baseline"]},
    "compare": lambda world: {"baseline": world["probe_baseline"]},
}


def validate(spec: OpenAPI, method: str, path: str, answer, query: dict | None = None) -> None:
    request = MockRequest(HOST, method, path, args=query or {})
    body = answer.content
    response = MockResponse(
        body, status_code=answer.status_code, content_type=answer["Content-Type"]
    )
    spec.validate_response(request, response)


def test_every_get_endpoint_answers_as_the_schema_says(schema_document, world, admin, token_for):
    spec = OpenAPI.from_dict(schema_document)
    api = token_for(admin)
    walked, failures = [], []
    for path, operations in sorted(schema_document["paths"].items()):
        if "get" not in operations or path.endswith("/schema/"):
            continue
        url = sample_path(path, world)
        last = url.strip("/").split("/")[-1]
        query = REQUIRED_QUERY[last](world) if last in REQUIRED_QUERY else {}
        answer = api.get(url, query, HTTP_ACCEPT="application/json")
        walked.append(url)
        if answer.status_code != 200:
            failures.append(f"GET {url}: {answer.status_code} {answer.content[:300]!r}")
            continue
        try:
            validate(spec, "get", url, answer, query)
        except Exception as exc:  # noqa: BLE001 - collected, all reported at once
            failures.append(
                f"GET {url}: {type(exc).__name__}: {exc}; {getattr(exc, '__cause__', '')}"
            )
    assert not failures, "\n".join(failures)
    # The resources the issue asks for are all there (and were walked).
    for resource in ("hosts", "deployments", "profiles", "runs", "changes", "prices", "audit"):
        assert any(u.startswith(f"/api/v1/{resource}/") for u in walked), resource
    assert any(u.endswith("/configs/") for u in walked)
    assert any(u.endswith("/timeline/") for u in walked)


def test_starting_a_run_and_proposing_a_change_answer_as_the_schema_says(
    schema_document, world, operator, approver, token_for
):
    spec = OpenAPI.from_dict(schema_document)
    api = token_for(operator)
    with mock.patch("benchmarks.tasks.run_benchmark.apply_async"):
        answer = api.post(
            "/api/v1/runs/",
            {"deployment": world["deployments"], "profile": world["profiles"], "label": "walk"},
            format="json",
        )
    assert answer.status_code == 201, answer.content
    validate(spec, "post", "/api/v1/runs/", answer)
    proposal = api.post(
        "/api/v1/changes/",
        {
            "deployment": world["deployments"],
            "title": "Fewer sequences",
            "rationale": "KV preemptions at peak.",
            "settings": {"max_num_seqs": 32},
        },
        format="json",
    )
    assert proposal.status_code == 201, proposal.content
    validate(spec, "post", "/api/v1/changes/", proposal)
    # Another person approves it: the action answers with the change, as documented.
    change = proposal.json()["id"]
    approve = f"/api/v1/changes/{change}/approve/"
    approved = token_for(approver, "review").post(approve, {"comment": "ok"}, format="json")
    assert approved.status_code == 200, approved.content
    validate(spec, "post", approve, approved)
