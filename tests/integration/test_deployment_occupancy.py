"""Issue 14 item 9 under real concurrency on PostgreSQL: requests on one deployment from
threads with their own database connections, released together by a barrier (or held in a
chosen order by events), never ordered by sleeping. Exactly one of a run and a restart asked
together starts; a restart that waited for the row lock sees the run that held it; a restart
during a running benchmark is refused; a change holding the lock and a restart asked together:
one wins."""

from __future__ import annotations

import threading
import time
from unittest import mock

import pytest
from django.db import close_old_connections, connection

from benchmarks.models import BenchmarkRun
from benchmarks.services import runs
from benchmarks.services.points import PointSink
from changes import rules
from changes.models import ChangeRequest
from changes.services import apply as change_apply
from changes.services import review
from hosts.models import EngineOperation
from hosts.services import occupancy, operations
from tests.factories import make_config, make_deployment, make_gpu, make_host, make_profile
from tests.hosts.simulator.conftest import sim_server  # noqa: F401 - shared fixture

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
WAIT_S = 60  # the most any wait for a condition below may take before the test fails


@pytest.fixture(autouse=True)
def no_tasks():
    """Requests are queued, never run by a worker: what is tested is which are accepted."""
    with mock.patch("controlpanel.jobs.enqueue") as enqueue:
        yield enqueue


def new_deployment(port: int | None = None, model: str | None = None):
    host = make_host()
    make_gpu(host)
    extra = {"port": port} if port else {}
    if model:
        extra["model"] = model
    deployment = make_deployment(host, **extra)
    deployment.active_config = make_config(deployment, {"max_num_seqs": 64})
    deployment.save()
    return deployment


def in_thread(name: str, work, outcomes: dict) -> threading.Thread:
    """Run ``work`` on its own thread (its own database connection): its result, or the
    refusal's message, lands in ``outcomes[name]``."""

    def body():
        try:
            outcomes[name] = ("started", work())
        except (runs.RunRefused, operations.OperationRefused, rules.ChangeRefused) as exc:
            outcomes[name] = ("refused", str(exc))
        except Exception as exc:  # noqa: BLE001 - reported by the test, not lost in a thread
            outcomes[name] = ("error", repr(exc))
        finally:
            connection.close()

    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    return thread


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


def waiting_on_a_lock() -> int:
    """Backends of this database waiting for a lock another transaction holds."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def active_holders(deployment) -> list[str]:
    ops = EngineOperation.objects.filter(deployment=deployment, status__in=["queued", "running"])
    busy = BenchmarkRun.objects.filter(deployment=deployment, status__in=["queued", "running"])
    return [f"operation {o.pk}" for o in ops] + [f"run {r.pk}" for r in busy]


def test_a_run_and_a_restart_requested_together_exactly_one_wins(postgres, operator):
    profile = make_profile()
    for _ in range(5):  # each round a fresh deployment, both requests released at once
        deployment = new_deployment()
        barrier = threading.Barrier(2)
        outcomes: dict = {}

        def run(deployment=deployment, barrier=barrier):
            barrier.wait(WAIT_S)
            return runs.start_benchmark(operator, deployment, profile)

        def restart(deployment=deployment, barrier=barrier):
            barrier.wait(WAIT_S)
            return operations.request_operation(operator, deployment, "restart")

        threads = [in_thread("run", run, outcomes), in_thread("restart", restart, outcomes)]
        for thread in threads:
            thread.join(WAIT_S)
        kinds = sorted(kind for kind, _ in outcomes.values())
        assert kinds == ["refused", "started"], outcomes
        winner = "run" if outcomes["run"][0] == "started" else "restart"
        loser = outcomes["restart" if winner == "run" else "run"][1]
        named = "Benchmark #" if winner == "run" else "Restart engine #"
        assert named in loser and f"{deployment} now" in loser, loser
        assert len(active_holders(deployment)) == 1


def test_a_restart_that_waited_for_the_lock_sees_the_run_that_held_it(postgres, operator):
    # The worst interleaving, forced: the run has checked and holds the row lock, not yet
    # committed; the restart arrives and waits on the lock. When the run commits, the restart
    # must see it (a check made before taking the lock would not).
    deployment = new_deployment()
    checked, release = threading.Event(), threading.Event()
    real = occupancy.require_free

    def hold_after_checking(d, purpose, *, owner=None):
        real(d, purpose, owner=owner)
        if threading.current_thread().name == "run":
            checked.set()
            assert release.wait(WAIT_S), "the test never released the run"

    outcomes: dict = {}
    with mock.patch.object(occupancy, "require_free", hold_after_checking):
        run_thread = in_thread(
            "run", lambda: runs.start_benchmark(operator, deployment, make_profile()), outcomes
        )
        assert checked.wait(WAIT_S)
        restart_thread = in_thread(
            "restart",
            lambda: operations.request_operation(operator, deployment, "restart"),
            outcomes,
        )
        wait_for(lambda: waiting_on_a_lock() >= 1, "the restart waiting on the row lock")
        release.set()
        for thread in (run_thread, restart_thread):
            thread.join(WAIT_S)
    close_old_connections()
    assert outcomes["run"][0] == "started", outcomes
    assert outcomes["restart"][0] == "refused", outcomes
    run = outcomes["run"][1]
    assert f"Benchmark #{run.pk}" in outcomes["restart"][1]
    assert active_holders(deployment) == [f"run {run.pk}"]


def test_a_restart_during_a_running_benchmark_is_refused(
    postgres,
    sim_server,  # noqa: F811
    operator,
):
    server = sim_server("vllm", "--gpu", "h100-sxm", "--time-scale", "0.2")
    deployment = new_deployment(server.port, server.model)
    long = {
        "stages": [{"name": "main", "concurrency": 4, "num_requests": 100_000}],
        "input_len": {"kind": "fixed", "mean": 64},
        "output_len": {"kind": "fixed", "mean": 16},
        "warmup_requests": 0,
    }
    run = runs.start_benchmark(operator, deployment, make_profile(spec=long))
    measuring = threading.Event()
    put = PointSink.put

    def seen(sink, point):
        if point["completed"] >= 1:
            measuring.set()
        put(sink, point)

    outcomes: dict = {}
    with mock.patch.object(PointSink, "put", seen):
        worker = in_thread(
            "worker", lambda: runs.execute_run(BenchmarkRun.objects.get(pk=run.pk)), outcomes
        )
        try:
            assert measuring.wait(WAIT_S), "the run never measured a request"
            with pytest.raises(operations.OperationRefused) as refused:
                operations.request_operation(operator, deployment, "restart")
            assert f"Benchmark #{run.pk}" in str(refused.value) and "is running" in str(
                refused.value
            )
        finally:
            runs.cancel_benchmark(operator, BenchmarkRun.objects.get(pk=run.pk))
            worker.join(WAIT_S)
    run.refresh_from_db()
    assert run.status == "cancelled" and run.completed >= 1
    assert not EngineOperation.objects.filter(deployment=deployment).exists()
    # Once the run is over, the engine is free again.
    assert operations.request_operation(operator, deployment, "restart").status == "queued"


def test_a_change_and_a_restart_requested_together_exactly_one_wins(postgres, operator, approver):
    deployment = new_deployment()
    change = review.propose_change(
        operator, deployment, title="seqs", rationale="r", settings={"max_num_seqs": 128}
    )
    review.approve_change(approver, change)
    barrier = threading.Barrier(2)
    outcomes: dict = {}

    def apply():
        barrier.wait(WAIT_S)
        return change_apply.apply_change(operator, ChangeRequest.objects.get(pk=change.pk))

    def restart():
        barrier.wait(WAIT_S)
        return operations.request_operation(operator, deployment, "restart")

    threads = [in_thread("change", apply, outcomes), in_thread("restart", restart, outcomes)]
    for thread in threads:
        thread.join(WAIT_S)
    assert sorted(kind for kind, _ in outcomes.values()) == ["refused", "started"], outcomes
    change.refresh_from_db()
    if outcomes["change"][0] == "started":
        assert change.state == "applying"
        assert f"locked by change #{change.pk}" in outcomes["restart"][1]
        assert active_holders(deployment) == []
    else:
        assert change.state == "approved"
        assert "Restart engine #" in outcomes["change"][1]
        assert len(active_holders(deployment)) == 1


def test_a_benchmark_from_outside_the_pipeline_while_a_change_holds_the_lock_is_refused(
    postgres, operator, approver
):
    deployment = new_deployment()
    change = review.propose_change(
        operator, deployment, title="seqs", rationale="r", settings={"max_num_seqs": 128}
    )
    review.approve_change(approver, change)
    change_apply.apply_change(operator, ChangeRequest.objects.get(pk=change.pk))
    outcomes: dict = {}
    profile = make_profile()
    barrier = threading.Barrier(2)

    def outsider():
        barrier.wait(WAIT_S)
        return runs.start_benchmark(operator, deployment, profile)

    def pipeline():
        barrier.wait(WAIT_S)
        change_row = ChangeRequest.objects.get(pk=change.pk)
        return runs.start_benchmark(operator, deployment, profile, owner=change_row)

    threads = [in_thread("outsider", outsider, outcomes), in_thread("pipeline", pipeline, outcomes)]
    for thread in threads:
        thread.join(WAIT_S)
    assert outcomes["outsider"][0] == "refused", outcomes
    assert f"locked by change #{change.pk}" in outcomes["outsider"][1]
    # Whichever took the row lock first, the outsider is refused and the pipeline's own run
    # (owner: the change) starts.
    assert outcomes["pipeline"][0] == "started", outcomes
