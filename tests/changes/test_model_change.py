"""A change that switches the model (to its AWQ or FP8 variant): validated, shown in the diff,
pinned on the new config version, made the deployment's model when that version runs, put
back by a rollback; and a change touching what the model answers is given the quality probe
(with its set, item count and time on the proposal), one that does not is not."""

from __future__ import annotations

import pytest

from benchmarks.services import probes
from changes.rules import ChangeRefused
from changes.services import facts, review
from changes.services.quality import needs_probe
from changes.services.stages import NewVersion
from hosts.models import EngineConfig, EngineOperation
from hosts.services import operations
from tests.factories import make_host, make_sim_deployment

pytestmark = pytest.mark.django_db

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
BASE = {"max_num_seqs": 64, "max_model_len": 8192}


@pytest.fixture
def deployment():
    deployment = make_sim_deployment(make_host(name="model-host"), model=MODEL)
    deployment.active_config = EngineConfig.objects.create_next(deployment, BASE)
    deployment.save()
    return deployment


def propose(user, deployment, **kw):
    return review.propose_change(
        user,
        deployment,
        title=kw.pop("title", "switch"),
        rationale="cheaper",
        settings={**BASE, **kw.pop("settings", {})},
        **kw,
    )


def test_every_version_pins_its_model(deployment):
    assert deployment.active_config.model == MODEL
    assert deployment.active_config.launch_config().model == MODEL


def test_a_model_switch_is_a_diff_and_gets_the_quality_probe(operator, deployment):
    change = propose(operator, deployment, model=f"{MODEL}-AWQ")
    assert change.diff() == {"model": (MODEL, f"{MODEL}-AWQ")}
    assert change.probe_set is not None and change.probe_set.name == "panel-core"
    # The prediction runs the new model for "after".
    shown = facts.review_facts(deployment, deployment.active_config, {**_proposal(change)})
    assert shown["quality"]["why"] == ["the model"]
    assert shown["quality"]["items"] == change.probe_set.item_count
    assert shown["quality"]["estimate_s"] > 0 and "guess" in shown["quality"]["estimate_basis"]


def _proposal(change) -> dict:
    return {
        "settings": change.settings,
        "env": change.env,
        "placement": change.placement,
        "model": change.model,
    }


def test_the_same_model_is_no_change_of_model(operator, deployment):
    change = propose(operator, deployment, model=MODEL, settings={"max_num_seqs": 32})
    assert change.model == "" and "model" not in change.diff()
    assert change.probe_set is None  # max_num_seqs does not change the answers


def test_a_model_name_that_could_reach_a_command_line_is_refused(operator, deployment):
    with pytest.raises(ChangeRefused, match="model"):
        propose(operator, deployment, model="x; rm -rf /")


@pytest.mark.parametrize(
    "diff, why",
    [
        ({"quantization": (None, "fp8")}, ["--quantization"]),
        ({"kv_cache_dtype": ("auto", "fp8")}, ["--kv-cache-dtype"]),
        ({"dtype": ("auto", "float16")}, ["--dtype"]),
        ({"max_num_seqs": (64, 128)}, []),
        ({"model": ("a", "b")}, ["the model"]),
    ],
)
def test_what_needs_a_quality_probe(diff, why):
    assert needs_probe("vllm", diff) == why


def test_the_new_version_serves_the_new_model_and_a_rollback_restores_it(
    operator, approver, deployment
):
    change = propose(operator, deployment, model=f"{MODEL}-AWQ")
    change.applied_by = operator
    NewVersion().run(change)
    new = change.applied_config
    assert new.model == f"{MODEL}-AWQ" and new.launch_config().model == f"{MODEL}-AWQ"
    # Activating a version makes its model the deployment's (as operations do on ready).
    old = deployment.active_config
    operation = EngineOperation.objects.create(
        deployment=deployment, kind="apply", config=new, previous_config=old, status="succeeded"
    )
    operations._activate(operation)
    deployment.refresh_from_db()
    assert deployment.model == f"{MODEL}-AWQ" and deployment.active_config == new
    # Going back to the old version is a change of model back, and restores it.
    rollback = review.propose_rollback(operator, old, rationale="Korean answers got worse")
    assert rollback.model == MODEL
    assert rollback.diff()["model"] == (f"{MODEL}-AWQ", MODEL)
    back = EngineOperation.objects.create(
        deployment=deployment, kind="apply", config=old, previous_config=new, status="succeeded"
    )
    operations._activate(back)
    deployment.refresh_from_db()
    assert deployment.model == MODEL


def test_estimates_come_from_the_last_probe_when_there_is_one(deployment):
    from benchmarks.models import ProbeRun

    probe_set = probes.default_set()
    ProbeRun.objects.create(
        deployment=deployment,
        probe_set=probe_set,
        status="succeeded",
        total=100,
        concurrency=16,
        duration_s=50.0,
        finished_at=deployment.created_at,
    )
    seconds, basis = probes.estimate_seconds(probe_set, deployment, 16)
    assert seconds == pytest.approx(0.5 * probe_set.item_count)
    assert basis.startswith("from probe #")
