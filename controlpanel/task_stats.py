"""Celery's side of ``/metrics``: tasks by state, workers alive, queue lengths.

Tasks run in worker processes, often on other machines, while ``/metrics`` is answered by a
web process: so with ``REDIS_URL`` set the counts go to Redis (a hash the workers
``HINCRBY``, a sorted set of worker names by last heartbeat), and the web process reads them
there. Embedded, the worker is a thread of the web process and they stay in memory.

The receivers are connected when this module is imported: Celery workers import it at start
(``CELERY_IMPORTS`` in settings), ``/metrics`` imports it to read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

import redis
from celery import signals
from django.conf import settings
from kombu.exceptions import ChannelError

log = logging.getLogger(__name__)

TASKS_KEY = "llmpanel:metrics:celery-tasks"  # hash: "<task>|<state>" → count
WORKERS_KEY = "llmpanel:metrics:celery-workers"  # sorted set: worker name → last beat (unix s)
# Workers send a heartbeat every 2 s from their main process, busy or not; one unheard of for
# this long is gone (killed, or started --without-heartbeat: then only its start counts).
WORKER_STALE_SECONDS = 30.0
# kombu's Redis transport keeps a queue's messages of priority p > 0 in "<queue>\x06\x16<p>".
PRIORITY_SEPARATOR = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)

_lock = threading.Lock()
_tasks: Counter[tuple[str, str]] = Counter()
_workers: dict[str, float] = {}
_clients: dict[str, redis.Redis] = {}


def _redis() -> redis.Redis | None:
    url = settings.REDIS_URL
    if not url:
        return None
    with _lock:  # one client per URL for the process's threads (it connects lazily)
        client = _clients.get(url)
        if client is None:
            # Short timeouts: counting must not hold up a task, nor a scrape, when Redis is
            # slow.
            client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
            _clients[url] = client
    return client


# --- recording (worker side) --------------------------------------------------------------
def count_task(task: str, state: str) -> None:
    client = _redis()
    if client is None:
        with _lock:
            _tasks[(task, state)] += 1
        return
    try:
        client.hincrby(TASKS_KEY, f"{task}|{state}", 1)
    except redis.RedisError as exc:  # a lost count, never a failed task
        log.warning("could not count task %s %s: %s", task, state, exc)


def worker_seen(hostname: str, now: float | None = None) -> None:
    now = time.time() if now is None else now
    client = _redis()
    if client is None:
        with _lock:
            _workers[hostname] = now
        return
    try:
        client.zadd(WORKERS_KEY, {hostname: now})
    except redis.RedisError as exc:
        log.warning("could not record worker %s: %s", hostname, exc)


def worker_gone(hostname: str) -> None:
    client = _redis()
    if client is None:
        with _lock:
            _workers.pop(hostname, None)
        return
    try:
        client.zrem(WORKERS_KEY, hostname)
    except redis.RedisError as exc:
        log.warning("could not forget worker %s: %s", hostname, exc)


def _task_name(sender) -> str:
    return getattr(sender, "name", None) or str(sender)


def _on_prerun(sender=None, **kwargs):
    count_task(_task_name(sender), "started")


def _on_success(sender=None, **kwargs):
    count_task(_task_name(sender), "succeeded")


def _on_failure(sender=None, **kwargs):
    count_task(_task_name(sender), "failed")


def _on_retry(sender=None, **kwargs):
    count_task(_task_name(sender), "retried")


def _on_worker_init(sender=None, **kwargs):
    worker_seen(sender.hostname)


def _on_heartbeat(sender=None, **kwargs):
    worker_seen(sender.eventer.hostname)


def _on_worker_shutdown(sender=None, **kwargs):
    worker_gone(sender.hostname)


for _signal, _receiver in (
    (signals.task_prerun, _on_prerun),
    (signals.task_success, _on_success),
    (signals.task_failure, _on_failure),
    (signals.task_retry, _on_retry),
    (signals.worker_init, _on_worker_init),
    (signals.heartbeat_sent, _on_heartbeat),
    (signals.worker_shutdown, _on_worker_shutdown),
):
    _signal.connect(_receiver, weak=False, dispatch_uid=f"task_stats.{_receiver.__name__}")


# --- reading (the web process) ------------------------------------------------------------
def task_counts() -> dict[tuple[str, str], int]:
    """(task name, state) → how many times, since Redis (or this process) started."""
    client = _redis()
    if client is None:
        with _lock:
            return dict(_tasks)
    counts = {}
    for field, value in client.hgetall(TASKS_KEY).items():
        task, _, state = field.decode().rpartition("|")
        counts[(task, state)] = int(value)
    return counts


def workers_alive(now: float | None = None) -> int:
    now = time.time() if now is None else now
    cutoff = now - WORKER_STALE_SECONDS
    client = _redis()
    if client is None:
        # The embedded worker is a thread (and sends no heartbeats): it is there until its
        # worker_shutdown, or the process is gone and nobody is asking.
        with _lock:
            return len(_workers)
    pipe = client.pipeline()
    pipe.zremrangebyscore(WORKERS_KEY, "-inf", f"({cutoff}")  # keeps the set small
    pipe.zcard(WORKERS_KEY)
    return int(pipe.execute()[1])


def queue_names(app) -> list[str]:
    """The queues the panel sends to: the default one (no task is routed elsewhere today)
    and any declared in ``CELERY_TASK_QUEUES``."""
    names = {app.conf.task_default_queue}
    names.update(q.name for q in app.conf.task_queues or ())
    return sorted(names)


def queue_lengths(app) -> dict[str, int]:
    """Messages waiting in each queue (not those a worker has taken and not yet acked)."""
    names = queue_names(app)
    client = _redis()
    if client is not None:
        pipe = client.pipeline()
        for name in names:
            for step in PRIORITY_STEPS:
                pipe.llen(name if step == 0 else f"{name}{PRIORITY_SEPARATOR}{step}")
        lengths = pipe.execute()
        n = len(PRIORITY_STEPS)
        return {name: sum(lengths[i * n : (i + 1) * n]) for i, name in enumerate(names)}
    # Embedded: kombu's in-memory transport keeps its queues in this process; asking it
    # through a connection is a dictionary look-up.
    lengths = {}
    with app.connection_for_read() as conn:
        channel = conn.default_channel
        for name in names:
            try:
                lengths[name] = channel.queue_declare(queue=name, passive=True).message_count
            except ChannelError:  # not declared yet: nothing sent to it
                lengths[name] = 0
    return lengths
