"""``/metrics`` in production mode: a real worker process counts its tasks and heartbeats in
Redis, and the web side (this process) reads them there, with the queue's length."""

from __future__ import annotations

import ipaddress
import time

import pytest
import redis
from celery import Celery
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from controlpanel import task_stats
from tests.integration.processes import compose_command, wait_until

pytestmark = pytest.mark.integration

TASK = "hosts.tasks.downsample_telemetry"  # harmless on an empty database


@pytest.fixture
def scrape(settings, redis_url, db):
    settings.REDIS_URL = redis_url
    settings.METRICS_ALLOWED_ADDRESSES = [ipaddress.ip_network("127.0.0.1/32")]
    client = Client(REMOTE_ADDR="127.0.0.1")

    def _scrape() -> dict:
        response = client.get("/metrics")
        assert response.status_code == 200, response.content
        samples = {}
        for family in text_string_to_metric_families(response.content.decode()):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return samples

    return _scrape


def tasks(samples, state) -> float:
    return samples.get(("llmpanel_celery_tasks_total", (("state", state), ("task", TASK))), 0)


def test_a_worker_process_counts_its_tasks_and_heartbeats_in_redis(production_env, start, scrape):
    sender = Celery(broker=production_env["REDIS_URL"], set_as_current=False)
    sender.send_task(TASK)
    sender.send_task(TASK)
    before = scrape()
    assert before[("llmpanel_celery_queue_length", (("queue", "celery"),))] == 2
    assert before[("llmpanel_celery_workers", ())] == 0
    assert tasks(before, "started") == 0

    worker = start("worker", compose_command("worker"), production_env)
    worker.wait_for_output("ready.", timeout=60)
    after = wait_until(
        lambda: (s := scrape()) and tasks(s, "succeeded") == 2 and s,
        30,
        lambda: "the worker's tasks were never counted:\n" + worker.output()[-3000:],
    )
    assert tasks(after, "started") == 2
    assert tasks(after, "failed") == 0
    assert after[("llmpanel_celery_queue_length", (("queue", "celery"),))] == 0
    assert after[("llmpanel_celery_workers", ())] == 1
    # Its heartbeats (every 2 s) keep it in the set, with a score that moves.
    client = redis.Redis.from_url(production_env["REDIS_URL"])
    first = client.zrange(task_stats.WORKERS_KEY, 0, -1, withscores=True)[0][1]
    wait_until(
        lambda: client.zrange(task_stats.WORKERS_KEY, 0, -1, withscores=True)[0][1] > first,
        10,
        "no heartbeat refreshed the worker",
    )

    worker.stop()  # a warm shutdown: the worker takes itself off the list
    assert scrape()[("llmpanel_celery_workers", ())] == 0


def test_signals_in_any_process_count_in_redis_and_stale_workers_drop(settings, redis_url, scrape):
    settings.REDIS_URL = redis_url
    client = redis.Redis.from_url(redis_url)
    client.delete(task_stats.TASKS_KEY, task_stats.WORKERS_KEY)
    task_stats.count_task(TASK, "retried")
    task_stats.count_task(TASK, "retried")
    task_stats.worker_seen("celery@alive")
    task_stats.worker_seen("celery@gone", now=time.time() - task_stats.WORKER_STALE_SECONDS - 5)
    samples = scrape()
    assert tasks(samples, "retried") == 2
    assert samples[("llmpanel_celery_workers", ())] == 1
    # The stale entry was removed, so the set stays as small as the fleet of workers.
    assert client.zrange(task_stats.WORKERS_KEY, 0, -1) == [b"celery@alive"]
    client.delete(task_stats.TASKS_KEY, task_stats.WORKERS_KEY)
