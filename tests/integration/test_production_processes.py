"""Production mode, natively: the web, worker and beat commands of docker-compose.yml run
against real PostgreSQL and Redis, and a request in the browser's path reaches the worker
and comes back over the WebSocket."""

from __future__ import annotations

import asyncio
import json
import os
import re

import httpx
import psutil
import pytest
import websockets
from celery import Celery
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from controlpanel import webserver
from controlpanel.choices import OperationStatus
from hosts.models import HostCheck
from tests.conftest import free_port
from tests.factories import make_host
from tests.integration.processes import compose_command, run_healthcheck, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def finished(check_pk):
    check = HostCheck.objects.get(pk=check_pk)
    return check if check.is_finished else None


def test_worker_command_runs_a_task_sent_through_redis(production_env, start, listener):
    worker = start("worker", compose_command("worker"), production_env)
    worker.wait_for_output("ready.", timeout=60)
    check = HostCheck.objects.create(host=make_host(port=listener))

    sender = Celery(broker=production_env["REDIS_URL"], set_as_current=False)
    sender.send_task("hosts.tasks.check_host", args=[check.pk])

    done = wait_until(lambda: finished(check.pk), 30, "the worker never finished the check")
    assert done.status == OperationStatus.SUCCEEDED and done.reachable is True
    assert "hosts.tasks.check_host" in worker.output()

    # The compose healthcheck of the worker passes against the running worker.
    health = run_healthcheck("worker", production_env)
    assert health.returncode == 0, health.stdout + health.stderr


def login(client: httpx.Client, username: str, password: str) -> None:
    page = client.get("/accounts/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    response = client.post(
        "/accounts/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": token},
    )
    assert response.status_code == 302 and response.headers["location"] == "/", response.text


# "queued" (web process) must reach the socket before "running" (worker): two processes
# racing, which a busy machine can reorder.
@pytest.mark.timing
def test_web_and_worker_commands_serve_check_and_stream_over_redis(
    production_env, start, listener, operator
):
    # The web process knows only the production hashers, not the tests' fast one.
    operator.password = PBKDF2PasswordHasher().encode("op-secret-pw", "integration-salt")
    operator.save()
    host = make_host(name="prod-host", port=listener)
    port = free_port()
    # Two web worker processes: the socket and the check request may land in different ones,
    # and the events still arrive (Redis channel layer, not process memory).
    web_env = {**production_env, "WEB_HOST": "127.0.0.1", "WEB_PORT": str(port)}
    web_env["WEB_CONCURRENCY"] = "2"
    web = start("web", compose_command("web"), web_env)
    start("worker", compose_command("worker"), production_env).wait_for_output("ready.", 60)
    web.wait_for_output("Application startup complete", 60)
    base = f"http://127.0.0.1:{port}"

    # The supervisor and both workers yield the CPU to the telemetry poll (WEB_NICE).
    tier = psutil.Process(web.proc.pid)
    # (WEB_NICE is added to the niceness of what started the tier: `make test` may run this
    # test itself at a lowered priority.)
    lowered = min(19, psutil.Process().nice() + webserver.DEFAULT_NICE)
    assert {p.nice() for p in [tier, *tier.children(recursive=True)]} == {lowered}
    assert len(tier.children(recursive=True)) >= 2
    autogroup = f"/proc/{tier.pid}/autogroup"  # a session of its own: its weight, too
    if os.getsid(tier.pid) == tier.pid and os.path.exists(autogroup):
        with open(autogroup) as group:
            assert group.read().split()[-1] == str(webserver.DEFAULT_NICE)

    with httpx.Client(base_url=base, timeout=10) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/").status_code == 302  # login required
        login(client, operator.username, "op-secret-pw")
        assert "prod-host" in client.get("/hosts/").text
        cookies = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
        csrf = client.cookies["csrftoken"]

        async def watch_and_check():
            url = f"ws://127.0.0.1:{port}/ws/hosts/{host.pk}/"
            headers = {"Cookie": cookies, "Origin": base}
            async with websockets.connect(url, additional_headers=headers) as socket_:
                response = await asyncio.to_thread(
                    client.post,
                    f"/hosts/{host.pk}/check/",
                    headers={"X-CSRFToken": csrf, "HX-Request": "true", "Referer": base + "/"},
                )
                assert response.status_code == 204, response.text
                statuses = []
                while "succeeded" not in statuses:
                    event = json.loads(await asyncio.wait_for(socket_.recv(), 30))
                    if event["event"] != "check.updated":
                        # The check also reports the host's status (the listener is no agent).
                        assert event["event"] == "host.status", event
                        continue
                    statuses.append(event["data"]["status"])
                return statuses, event["data"]

        statuses, last = asyncio.run(watch_and_check())
    # "queued" comes from the web process, "running"/"succeeded" from the worker via Redis.
    assert statuses == ["queued", "running", "succeeded"]
    assert last["reachable"] is True
    check = HostCheck.objects.get(pk=last["id"])
    assert check.requested_by == operator and check.status == OperationStatus.SUCCEEDED


def test_beat_command_schedules_checks_that_the_worker_runs(production_env, start, listener):
    host = make_host(port=listener)
    env = {**production_env, "HOST_CHECK_INTERVAL_SECONDS": "1"}
    worker = start("worker", compose_command("worker"), env)
    worker.wait_for_output("ready.", 60)
    cmd = [
        part.replace("/var/lib/controlpanel", env["VAR_DIR"]) for part in compose_command("beat")
    ]
    os.makedirs(env["VAR_DIR"], exist_ok=True)
    beat = start("beat", cmd, env)
    beat.wait_for_output("beat: Starting", 60)

    def scheduled_and_done():
        checks = HostCheck.objects.filter(
            host=host, requested_by=None, status=OperationStatus.SUCCEEDED
        )
        return checks.count() >= 2

    wait_until(
        scheduled_and_done,
        40,
        lambda: (
            "beat never produced two finished checks:\n"
            + beat.output()[-3000:]
            + worker.output()[-3000:]
        ),
    )
    health = run_healthcheck("beat", env)
    assert health.returncode == 0, health.stdout + health.stderr


def test_web_tier_pools_database_connections_under_concurrent_requests(
    production_env, start, operator
):
    # Under ASGI each request runs in its own thread; with compose's persistent connections
    # (DATABASE_CONN_MAX_AGE) every finished request's thread used to leave an open connection
    # behind, until PostgreSQL answered "too many clients" (scripts/bench_web.py found it).
    # The web tier pools them (DATABASE_POOL_SIZE, default 10 per worker process).
    operator.password = PBKDF2PasswordHasher().encode("op-secret-pw", "integration-salt")
    operator.save()
    for i in range(3):
        make_host(name=f"pool-host-{i}")
    port = free_port()
    web_env = {**production_env, "WEB_HOST": "127.0.0.1", "WEB_PORT": str(port)}
    web_env.update(WEB_CONCURRENCY="1", DATABASE_CONN_MAX_AGE="60")
    web = start("web", compose_command("web"), web_env)
    web.wait_for_output("Application startup complete", 60)
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, timeout=30) as client:
        login(client, operator.username, "op-secret-pw")
        cookies = dict(client.cookies)

    async def burst() -> list[int]:
        async with httpx.AsyncClient(base_url=base, cookies=cookies, timeout=60) as many:
            answers = await asyncio.gather(*(many.get("/hosts/") for _ in range(40)))
        return [a.status_code for a in answers]

    for _ in range(2):
        assert asyncio.run(burst()) == [200] * 40
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            [production_env["PGAPPNAME"]],
        )
        held = cursor.fetchone()[0]
    # 80 requests, 40 at a time, served by one process: at most its pool's 10 connections.
    assert 1 <= held <= 10, f"the web process holds {held} database connections"
