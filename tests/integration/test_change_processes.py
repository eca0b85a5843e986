"""A change on the production processes: approved in this process, its apply pipeline sent
through Redis to the compose worker (PostgreSQL), which snapshots, applies through a real host
agent supervising the simulator, verifies under a benchmark and publishes every timeline entry
to the change's group on the Redis channel layer."""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest
from celery import Celery
from channels.layers import get_channel_layer

from changes.models import ChangeRequest
from changes.services import apply as change_apply
from changes.services import review
from hosts.models import EngineConfig, EngineOperation
from hosts.services import operations as host_operations
from tests.factories import make_host, make_profile, make_sim_deployment
from tests.hosts.agent.conftest import AgentProcess
from tests.integration.processes import compose_command, group_events, use_redis_channel_layer

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PROFILE = {
    "stages": [{"name": "main", "concurrency": 8, "num_requests": 40}],
    "input_len": {"kind": "fixed", "mean": 256},
    "output_len": {"kind": "fixed", "mean": 32},
    "warmup_requests": 4,
}


# The verification compares two real-time runs (limit +100 %): the machine must keep time.
@pytest.mark.timing
def test_worker_applies_and_verifies_a_change_streaming_its_timeline(
    production_env,  # noqa: F811
    start,  # noqa: F811
    shared_key,  # noqa: F811
    tmp_path,
    settings,
    postgres,
    operator,
    approver,
):
    use_redis_channel_layer(settings, production_env["REDIS_URL"])
    (tmp_path / "agent-home").mkdir()
    agent = AgentProcess(tmp_path / "agent-home", "--simulate", "h100-sxm:1").start()
    try:
        host = make_host(name="change-agent", port=agent.port, agent_token=agent.token)
        deployment = make_sim_deployment(
            host, simulator={"gpu": "h100-sxm", "startup_seconds": 0.3, "time_scale": 0.2}
        )
        good = EngineConfig.objects.create_next(deployment, {"max_model_len": 8192})
        op = EngineOperation.objects.create(deployment=deployment, kind="apply", config=good)
        host_operations.run_operation(EngineOperation.objects.get(pk=op.pk))
        deployment.refresh_from_db()
        assert deployment.active_config == good

        change = review.propose_change(
            operator,
            deployment,
            title="Prefix caching on",
            rationale="shared system prompts",
            settings={"max_model_len": 8192, "enable_prefix_caching": True},
            verify_profile=make_profile(spec=PROFILE),
            # A few ms of simulated ITL on a loaded machine move p95 by 20-40 % between runs:
            # this test is about the worker, the socket and the record, not verdicts.
            thresholds={"max_ttft_p95_regression": 1.0, "max_itl_p95_regression": 1.0},
        )
        review.approve_change(approver, change)
        worker = start("worker", compose_command("worker"), production_env)
        worker.wait_for_output("ready.", timeout=60)
        events = asyncio.run(stream(operator, change, worker, production_env["REDIS_URL"]))
    finally:
        agent.stop()

    change.refresh_from_db()
    # Verified, or (when the loaded machine's noise straddles the limits) applied but not
    # verified: never rolled back on noise.
    verified = change.comparison.get("outcome") == "verified"
    end = "applied" if verified else "unverified"
    assert change.state == end, (change.outcome, worker.output()[-3000:])
    deployment.refresh_from_db()
    assert deployment.active_config == change.applied_config
    assert change.applied_config.settings["enable_prefix_caching"] is True
    assert change.verification_run.status == "succeeded"
    assert change.baseline_run.engine_config == good
    # The page saw every stage live, in order, then the final state.
    stages = [
        (e["data"]["after"]["stage"], e["data"]["after"]["status"])
        for e in events
        if e["type"] == "change.event" and e["data"]["action"] == "stage"
    ]
    compared = "succeeded" if verified else "inconclusive"
    assert stages[0] == ("snapshot", "started") and stages[-1] == ("done", compared)
    assert ("verify", "succeeded") in stages and ("compare", compared) in stages
    states = [e["data"]["state"] for e in events if e["type"] == "change.state"]
    assert states == ["applying", "verifying", end]
    assert ChangeRequest.objects.get(pk=change.pk).pipeline_owner == ""


async def stream(operator, change, worker, redis_url) -> list[dict]:
    """Listen on the change's group (as its page would) while the worker applies it."""
    from asgiref.sync import sync_to_async

    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(f"change-{change.pk}", channel)
    # The service enqueues once its transaction commits; the message goes to Redis (this
    # process's own Celery app stays on its in-memory broker), with the limits it chose.
    broker = Celery(broker=redis_url, set_as_current=False)
    with mock.patch(
        "changes.tasks.apply_change.apply_async",
        side_effect=lambda args, **kw: broker.send_task(
            "changes.tasks.apply_change", args=args, **kw
        ),
    ) as sent:
        await sync_to_async(change_apply.apply_change)(operator, change)
    assert sent.call_args.kwargs["time_limit"] > sent.call_args.kwargs["soft_time_limit"]
    return await group_events(layer, channel, _finished, [worker], "change", timeout=180)


def _finished(message: dict) -> bool:
    return message["type"] == "change.state" and message["data"]["state"] in (
        "applied",
        "unverified",
        "rolled_back",
        "failed",
    )
