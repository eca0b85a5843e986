"""A worker killed mid-job (issue 38 item 5, the fault tests): the compose worker (Redis
broker, PostgreSQL) runs a benchmark, a quality probe and a large sweep's prediction at once
and is killed with SIGKILL (its machine gone: no task gets to say anything). Each job held a
heartbeat claim (``controlpanel.lostwork``); once the claims go stale the one lost-work sweep
ends every job truthfully, releases the deployments they held (both still on their last good
config), and a new worker takes new work on them.

The sweep runs here (beat runs it every minute in production) with LOST_WORK_AFTER_SECONDS
short; waits are on conditions, not sleeps."""

from __future__ import annotations

import os
import signal
from unittest import mock

import pytest
from celery import Celery

from benchmarks.models import BenchmarkRun, ProbeRun
from benchmarks.quality.builtin import SETS_DIR
from benchmarks.services import probes
from benchmarks.services import runs as run_services
from changes.choices import SweepState
from changes.models import Sweep
from changes.services import sweeps
from controlpanel import lostwork
from controlpanel.models import WorkClaim
from hosts.services import occupancy
from tests.factories import (
    make_config,
    make_deployment,
    make_host,
    make_profile,
    make_sim_deployment,
)
from tests.hosts.simulator.conftest import module_sim_server  # noqa: F401 - shared fixture
from tests.integration.processes import compose_command, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# Long enough that each job is still running when its worker dies (each is claimed first).
LONG_RUN = {
    "stages": [{"name": "main", "concurrency": 2, "num_requests": 400}],
    "input_len": {"kind": "fixed", "mean": 64},
    "output_len": {"kind": "fixed", "mean": 256},
    "warmup_requests": 0,
}
SWEEP_LOAD = {
    "stages": [{"name": "main", "request_rate": 10, "num_requests": 100}],
    "input_len": {"kind": "fixed", "mean": 256},
    "output_len": {"kind": "fixed", "mean": 32},
}
# 16 x 16 x 16 = 4,096 points: a prediction of tens of seconds.
BIG_SPACE = {
    "max_num_seqs": list(range(4, 68, 4)),
    "max_num_batched_tokens": list(range(2048, 34816, 2048)),
    "gpu_memory_utilization": [round(0.5 + 0.03 * i, 2) for i in range(16)],
}


def running_deployment(host, engine, name):
    deployment = make_deployment(host, name=name, port=engine.port, engine_version="0.11.0")
    deployment.active_config = make_config(deployment, {"max_num_seqs": 64})
    deployment.status = "running"
    deployment.save()
    return deployment


def test_a_killed_worker_s_jobs_are_ended_and_their_deployments_freed(
    production_env,
    start,
    module_sim_server,  # noqa: F811
    operator,
    settings,
):
    settings.LOST_WORK_AFTER_SECONDS = 3
    env = {**production_env, "LOST_WORK_HEARTBEAT_SECONDS": "0.5"}
    engines = [module_sim_server("vllm") for _ in range(2)]
    host = make_host(name="lost-worker-host")
    benchmarked = running_deployment(host, engines[0], "bench")
    probed = running_deployment(host, engines[1], "probe")
    swept = make_sim_deployment(make_host(name="lost-sweep-host"))
    swept.active_config = make_config(swept, {"max_num_seqs": 8, "max_model_len": 8192})
    swept.save()
    configs = {d.pk: d.active_config_id for d in (benchmarked, probed, swept)}

    run = run_services.start_benchmark(None, benchmarked, make_profile(spec=LONG_RUN))
    lines = (SETS_DIR / "knowledge-en.jsonl").read_bytes()
    probe_set = probes.upload_set(None, "lost-worker", lines)
    probe = probes.start_probe(None, probed, probe_set, concurrency=1, enqueue=False)
    with mock.patch("changes.services.sweeps.enqueue_on_commit"):
        sweep = sweeps.create_sweep(
            operator,
            swept,
            title="lost worker",
            profile=make_profile(spec=SWEEP_LOAD),
            space=BIG_SPACE,
            slo={"ttft_p95_ms": 500},
        )

    worker = start("worker", compose_command("worker"), env)
    worker.wait_for_output("ready.", timeout=60)
    broker = Celery(broker=production_env["REDIS_URL"], set_as_current=False)
    broker.send_task("benchmarks.tasks.run_benchmark", args=[run.pk])
    broker.send_task("benchmarks.tasks.run_probe", args=[probe.pk])
    broker.send_task("changes.tasks.predict_sweep", args=[sweep.pk])
    kinds = {"benchmarks.benchmarkrun", "benchmarks.proberun", "changes.sweep"}

    def all_under_way():
        # Claimed, and past the start of its work (a claim is taken just before it).
        return (
            kinds <= set(WorkClaim.objects.values_list("kind", flat=True))
            and BenchmarkRun.objects.get(pk=run.pk).status == "running"
            and ProbeRun.objects.get(pk=probe.pk).status == "running"
        )

    wait_until(
        all_under_way,
        120,
        lambda: (
            f"not every job was under way: {list(WorkClaim.objects.values())}\n"
            + worker.output()[-3000:]
        ),
    )

    os.killpg(worker.proc.pid, signal.SIGKILL)  # the machine is gone: nothing says goodbye
    worker.proc.wait(30)
    assert BenchmarkRun.objects.get(pk=run.pk).status == "running"
    assert ProbeRun.objects.get(pk=probe.pk).status == "running"
    assert Sweep.objects.get(pk=sweep.pk).state == SweepState.PREDICTING
    assert occupancy.occupants(benchmarked) and occupancy.occupants(probed)

    wait_until(
        lambda: all(lostwork.is_lost(row) for row in (run, probe, sweep)),
        60,
        "the claims never went stale",
    )
    done = lostwork.sweep_lost_work()
    assert sorted(done["ended"]) == sorted(
        [
            f"benchmarks.benchmarkrun #{run.pk}",
            f"benchmarks.proberun #{probe.pk}",
            f"changes.sweep #{sweep.pk}",
        ]
    ), done

    run.refresh_from_db()
    probe.refresh_from_db()
    sweep.refresh_from_db()
    assert run.status == "failed" and "stopped answering" in run.error
    assert probe.status == "failed" and "stopped answering" in probe.error
    assert sweep.state == SweepState.FAILED and "stopped answering" in sweep.outcome
    assert not WorkClaim.objects.exists()
    for deployment in (benchmarked, probed, swept):
        deployment.refresh_from_db()
        assert occupancy.occupants(deployment) == [], deployment
        assert deployment.active_config_id == configs[deployment.pk]  # its last good config

    # A new worker takes new work on the freed deployment.
    again = start("worker-2", compose_command("worker"), env)
    again.wait_for_output("ready.", timeout=60)
    short = make_profile(
        spec={**LONG_RUN, "stages": [{"name": "main", "concurrency": 2, "num_requests": 8}]}
    )
    fresh = run_services.start_benchmark(None, benchmarked, short, enqueue=False)
    broker.send_task("benchmarks.tasks.run_benchmark", args=[fresh.pk])
    wait_until(
        lambda: BenchmarkRun.objects.get(pk=fresh.pk).is_finished,
        120,
        lambda: again.output()[-3000:],
    )
    fresh.refresh_from_db()
    assert fresh.status == "succeeded", (fresh.error, fresh.log)
