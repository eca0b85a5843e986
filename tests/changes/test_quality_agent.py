"""The quality probe in the apply pipeline, against a real host agent supervising real
simulator processes that answer the built-in probe sets from their quality model (the
knowledge file the demo fleet hands them): switching Llama-3.1-8B to its AWQ (INT4) variant
loses on Korean, maths and JSON and is rolled back with the table on the timeline, the model
and config restored; turning on FP8 weights passes with "no significant loss"."""

from __future__ import annotations

from unittest import mock

import pytest

from benchmarks.models import ProbeRun
from benchmarks.services import probes
from changes.models import ChangeRequest
from changes.services import apply as change_apply
from changes.services import pipeline, review
from controlpanel.models import AuditEntry
from hosts.models import EngineConfig, EngineOperation
from hosts.services import operations as host_operations
from tests.factories import make_host, make_sim_deployment
from tests.hosts.agent.conftest import AgentProcess

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

BASE = {"gpu_memory_utilization": 0.9, "max_model_len": 8192, "max_num_seqs": 64}
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
def agent(tmp_path):
    process = AgentProcess(tmp_path, "--simulate", "h100-sxm:1").start()
    yield process
    process.stop()


@pytest.fixture
def deployment(agent, tmp_path, settings):
    settings.CHANGE_HEALTH_TIMEOUT = 10
    settings.CHANGE_HEARTBEAT_SECONDS = 1
    knowledge = tmp_path / "knowledge.jsonl"
    assert probes.write_knowledge(knowledge) > 200
    host = make_host(name="quality-host", port=agent.port, agent_token=agent.token)
    deployment = make_sim_deployment(
        host,
        model=MODEL,
        simulator={
            "gpu": "h100-sxm",
            "startup_seconds": 0.3,
            "time_scale": 0.2,
            "knowledge": str(knowledge),
        },
    )
    config = EngineConfig.objects.create_next(deployment, BASE)
    op = EngineOperation.objects.create(deployment=deployment, kind="apply", config=config)
    host_operations.run_operation(EngineOperation.objects.get(pk=op.pk))
    deployment.refresh_from_db()
    assert deployment.active_config == config, EngineOperation.objects.get(pk=op.pk).error
    return deployment


def applied(operator, approver, deployment, **proposal) -> ChangeRequest:
    change = review.propose_change(
        operator,
        deployment,
        title=proposal.pop("title"),
        rationale="faster and cheaper, if the answers hold",
        settings={**deployment.active_config.settings, **proposal.pop("settings", {})},
        **proposal,
    )
    assert change.probe_set is not None  # it touches what the model answers
    review.approve_change(approver, change)
    with mock.patch("changes.tasks.apply_change.apply_async"):
        change_apply.apply_change(operator, ChangeRequest.objects.get(pk=change.pk))
    pipeline.run_pipeline(change.pk)
    return ChangeRequest.objects.get(pk=change.pk)


def timeline(change) -> dict[str, dict]:
    entries = AuditEntry.objects.filter(object_id=str(change.pk), action__startswith="change.stage")
    return {e.after.get("stage") + ":" + e.after.get("status"): e.after for e in entries}


def test_an_awq_switch_loses_quality_and_is_rolled_back(operator, approver, deployment):
    before = deployment.active_config
    change = applied(operator, approver, deployment, title="INT4 weights", model=f"{MODEL}-AWQ")
    assert change.state == "rolled_back", change.outcome
    assert "quality probe found a loss" in change.outcome
    verdict = change.quality_comparison["change_verdict"]
    assert verdict["verdict"] == "loss"
    lost = {
        g["key"]
        for g in change.quality_comparison["groups"]
        if g["verdict"] == "loss" and ":" in g["key"]
    }
    assert {"language:ko", "category:json"} <= lost, change.quality_comparison["reason"]
    # The table is on the timeline, with the simulated label.
    failed = timeline(change)["quality:failed"]
    assert "language:ko" in failed["detail"] and "simulated" in failed["detail"]
    # Both probes are ordinary probe runs of the same set, labelled simulated.
    runs = ProbeRun.objects.filter(pk__in=[change.quality_baseline_id, change.quality_run_id])
    assert {r.status for r in runs} == {"succeeded"} and all(r.simulated for r in runs)
    assert change.quality_run.model_name == f"{MODEL}-AWQ"
    deployment.refresh_from_db()
    assert deployment.active_config == before and deployment.model == MODEL


def test_fp8_weights_pass_without_a_significant_loss(operator, approver, deployment):
    change = applied(
        operator, approver, deployment, title="FP8 weights", settings={"quantization": "fp8"}
    )
    assert change.state == "applied", change.outcome
    verdict = change.quality_comparison["change_verdict"]
    assert verdict["verdict"] in ("no loss", "no significant loss"), verdict
    assert timeline(change)["quality:succeeded"]["message"].startswith(
        f"{change.quality_run.summary['overall']['accuracy']:.1%}"
    )
    deployment.refresh_from_db()
    assert deployment.active_config.settings["quantization"] == "fp8"
