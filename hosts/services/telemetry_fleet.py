"""Telemetry at fleet scale: the hosts of one shard polled concurrently (plain-HTTP agents
on the worker process's persistent event loop and its keep-alive HTTP session,
``hosts.services.telemetry_loop``; SSH and TLS agents on the thread path) and recorded in
batches: one ``COPY`` of every GPU sample of the batch, one ``UPDATE … FROM
json_to_recordset(…)`` of the GPUs' newest readings and one of the hosts'
(``hosts.services.telemetry_sql``; the ORM's bulk statements on SQLite) — never a query per
GPU or per host. Which GPU a reading names comes from a per-process map of the fleet's GPUs,
rebuilt when a GPU is saved or deleted.

Why shards: one process cannot poll and store 500 hosts x 8 GPUs every second on its own.
Beat's ``poll_telemetry`` enqueues ``TELEMETRY_SHARDS`` shard tasks a second, each for the
hosts with ``id % shards == shard``, so the work spreads over however many Celery workers
run. A shard still running when its next second comes skips (a cache lock) rather than
piling up polls of the same hosts.

Why waves: a batch waits for its slowest member, so one host that answers late would hold
back every other host's samples. The shard records what has arrived at
``TELEMETRY_BATCH_DEADLINE`` seconds, then the stragglers as they come (up to the transport
timeout) in a second batch.

What a reading means (host status, engine states, interrupted operations, backoff for hosts
that are down) is ``hosts.services.telemetry``'s: its helpers do the same here.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from controlpanel.realtime import group_name
from hosts.choices import HostStatus, TransportKind
from hosts.credentials import SECRET_FIELDS
from hosts.models import Gpu, Host, without_secrets
from hosts.models_telemetry import GPU_MAP_VERSION_KEY
from hosts.services import telemetry as single
from hosts.services import telemetry_loop, telemetry_sql
from hosts.services.hosts import offer_host_key, set_status
from hosts.services.transports import forget_transport, has_poll_transport, poll_transport
from hosts.transport.base import AuthError, HostKeyMismatch, TransportError

log = logging.getLogger(__name__)

# (GpuSample column, how its value is made, the reading's key), in the COPY's column order.
SAMPLE_COLUMNS = [
    (name, kind, single.SAMPLE_FIELDS[name]) for name, kind in telemetry_sql.SAMPLE_COLUMNS
]
GPU_MAP_TTL = 60.0  # seconds: a map is rebuilt this often even when no change was signalled


@dataclass
class ShardResult:
    """What one shard's second did: hosts asked, samples stored, batches written."""

    hosts: int = 0
    samples: int = 0
    batches: int = 0
    failed: int = 0
    skipped: bool = False
    lags: list[float] = field(default_factory=list)  # commit time − reading time, seconds


def shard_hosts(shard: int, shards: int):
    """The hosts of ``shard`` out of ``shards``: every host in exactly one shard."""
    # The GPUs come from the process's map (gpu_map), not from a query a second; the secrets
    # only where a host's transport is built (hosts.services.transports.poll_transport).
    hosts = without_secrets(Host.objects.prefetch_related("deployments__gpus"))
    if shards > 1:
        hosts = hosts.alias(shard=F("id") % shards).filter(shard=shard)
    return hosts


def due_hosts(shard: int, shards: int) -> list[Host]:
    """The shard's hosts that can be asked now (the single path's rules: credentials, no
    host-key question open, and a host that is down only every ``POLL_BACKOFF``)."""
    now = timezone.now()
    return [
        host
        for host in shard_hosts(shard, shards)
        if host.has_credentials
        and host.status not in (HostStatus.HOST_KEY, HostStatus.HOST_KEY_CHANGED)
        and (
            host.status == HostStatus.ONLINE
            or host.last_poll_at is None
            or now - host.last_poll_at >= single.POLL_BACKOFF
        )
    ]


def poll_shard(shard: int, shards: int) -> ShardResult:
    """The shard task's body: poll the shard's due hosts and record them in waves."""
    key = f"telemetry-shard:{shards}:{shard}"
    # The lock outlives a crashed worker by no more than the task's own hard limit.
    if not cache.add(key, 1, timeout=30):
        return ShardResult(skipped=True)
    try:
        return poll_hosts(not_just_polled(due_hosts(shard, shards)))
    finally:
        cache.delete(key)


def not_just_polled(hosts: list[Host], now: datetime | None = None) -> list[Host]:
    """Leave out the online hosts read less than half a poll interval ago. A busy worker
    starts a shard's tasks late and then back to back (the lock lets one run at a time); the
    late ones must not read the same hosts again within the second, so under load the poll
    slows down to what the worker can do instead of its tasks expiring unstarted (measured
    with scripts/bench_web.py: 1,300 of 4,000 samples/s while pages were served)."""
    now = now or timezone.now()
    recent = now - timedelta(seconds=settings.TELEMETRY_INTERVAL / 2)
    return [
        host
        for host in hosts
        if host.status != HostStatus.ONLINE
        or host.last_poll_at is None
        or host.last_poll_at <= recent
    ]


def poll_hosts(hosts: list[Host], *, deadline: float | None = None) -> ShardResult:
    """Ask every host at once; record what has answered by ``deadline`` seconds in one
    batch, the rest in a second batch as they finish."""
    deadline = settings.TELEMETRY_BATCH_DEADLINE if deadline is None else deadline
    result = ShardResult(hosts=len(hosts))
    if not hosts:
        return result
    _read_secrets_to_build(hosts)
    answers: queue.Queue = queue.Queue()
    fetcher = threading.Thread(target=_fetch_all, args=(hosts, answers), daemon=True)
    fetcher.start()
    started = time.monotonic()
    remaining = len(hosts)
    first_wave = True
    while remaining:
        wave: list[tuple[Host, object]] = []
        wait_until = started + deadline if first_wave else None
        while remaining:
            timeout = None if wait_until is None else max(0.0, wait_until - time.monotonic())
            try:
                wave.append(answers.get(timeout=timeout))
            except queue.Empty:
                break
            remaining -= 1
            if not first_wave:
                # Later waves take whatever has queued up meanwhile, then write.
                while remaining and not answers.empty():
                    wave.append(answers.get_nowait())
                    remaining -= 1
                break
        first_wave = False
        readings = [(h, r) for h, r in wave if isinstance(r, dict)]
        result.failed += sum(1 for h, r in wave if _failed(h, r))
        if readings:
            result.samples += record_batch(readings, lags=result.lags)
            result.batches += 1
    fetcher.join()
    return result


def _failed(host: Host, outcome: object) -> bool:
    """Apply a failed poll to the host as the single path does; True when it failed."""
    if isinstance(outcome, dict):
        return False
    if isinstance(outcome, HostKeyMismatch):
        forget_transport(host.pk)
        offer_host_key(host, outcome)
    elif isinstance(outcome, AuthError):
        forget_transport(host.pk)
        set_status(host, HostStatus.AUTH_FAILED, str(outcome))
    elif isinstance(outcome, TransportError):
        forget_transport(host.pk)
        set_status(host, HostStatus.UNREACHABLE, str(outcome))
    else:
        log.error("telemetry of %s failed: %r", host.name, outcome)
    return True


# --- fetching ----------------------------------------------------------------------------------
def _read_secrets_to_build(hosts: list[Host]) -> None:
    """The secrets of the hosts (read ``without_secrets``) whose poll transport is still to be
    built, in one query here: the fetching thread would otherwise read each one deferred, a
    query per secret from a thread of its own."""
    unbuilt = {host.pk: host for host in hosts if not has_poll_transport(host)}
    if not unbuilt:
        return
    for row in Host.objects.filter(pk__in=unbuilt).only(*SECRET_FIELDS):
        for name in SECRET_FIELDS:
            setattr(unbuilt[row.pk], name, getattr(row, name))


def _fetch_all(hosts: list[Host], answers: queue.Queue) -> None:
    """Put ``(host, reading or exception)`` on ``answers`` for every host, as each answers."""
    plain, threaded, leases = [], [], []
    try:
        for host in hosts:
            try:
                lease = poll_transport(host)  # refuses unbound credentials, as everywhere
            except Exception as exc:  # noqa: BLE001 - reported per host, the rest go on
                answers.put((host, exc))
                continue
            if host.transport == TransportKind.AGENT and not host.agent_tls:
                leases.append(lease)
                plain.append((host, lease.transport))
            else:
                lease.release()  # its thread takes its own
                threaded.append(host)
        pool = None
        if threaded:
            # SSH (and TLS agents, whose CA the pooled client does not carry) keep their
            # threads.
            pool = ThreadPoolExecutor(max_workers=min(16, len(threaded)))
            for host in threaded:
                pool.submit(_read_in_thread, host, answers)
        if plain:
            telemetry_loop.fetch_agents(plain, answers)
        if pool is not None:
            pool.shutdown(wait=True)
    finally:
        for lease in leases:
            lease.release()
        connection.close()  # this thread's own, if building a transport opened one


def _read_in_thread(host: Host, answers: queue.Queue) -> None:
    try:
        with poll_transport(host) as transport:
            reading = transport.telemetry()
        answers.put((host, reading))
    except Exception as exc:  # noqa: BLE001 - the main thread applies it to the host
        answers.put((host, exc))
    finally:
        connection.close()


# --- recording ---------------------------------------------------------------------------------
class GpuRef(NamedTuple):
    """What recording needs of a GPU row (``_live_point`` reads these three)."""

    pk: int
    index: int
    memory_bytes: int


@dataclass
class _GpuMap:
    version: object
    loaded: float
    by_host: dict[int, tuple[dict[str, GpuRef], dict[int, GpuRef]]]


_map_lock = threading.Lock()
_map: _GpuMap | None = None


def gpu_map() -> dict[int, tuple[dict[str, GpuRef], dict[int, GpuRef]]]:
    """Every host's GPUs by UUID and by index, from this process's map: rebuilt (one query
    for the fleet) when ``GPU_MAP_VERSION_KEY`` changed — a GPU saved or deleted anywhere —
    or after ``GPU_MAP_TTL`` seconds (a change made without signals, e.g. a bulk insert)."""
    global _map
    version = cache.get(GPU_MAP_VERSION_KEY)  # read before the rows: a change after it shows
    current = _map
    if (
        current is not None
        and current.version == version
        and time.monotonic() - current.loaded < GPU_MAP_TTL
    ):
        return current.by_host
    by_host: dict[int, tuple[dict[str, GpuRef], dict[int, GpuRef]]] = {}
    rows = Gpu.objects.order_by().values_list("pk", "host_id", "uuid", "index", "memory_bytes")
    for pk, host_id, uuid, index, memory in rows:
        by_uuid, by_index = by_host.setdefault(host_id, ({}, {}))
        by_uuid[uuid] = by_index[index] = GpuRef(pk, index, memory)
    with _map_lock:
        _map = _GpuMap(version, time.monotonic(), by_host)
    return by_host


def forget_gpu_map() -> None:
    """Drop this process's map: the next batch rebuilds it."""
    global _map
    with _map_lock:
        _map = None


def record_batch(readings: list[tuple[Host, dict]], *, lags: list[float] | None = None) -> int:
    """Store many hosts' readings in one transaction with one insert for all GPU samples;
    then tell each host's live page (one message per host). Returns the samples stored.

    A GPU deleted since the map was built fails the insert (its foreign key): the batch is
    then written once more with a freshly built map."""
    try:
        return _record(readings, lags)
    except IntegrityError:
        log.warning("telemetry batch refused (a GPU changed): retrying with a fresh GPU map")
        forget_gpu_map()
        return _record(readings, lags)


def _record(readings: list[tuple[Host, dict]], lags: list[float] | None) -> int:
    samples: list[tuple] = []
    newest: list[tuple[int, dict, datetime]] = []
    hosts: list[Host] = []
    engine_work, live = [], []
    maps = gpu_map()
    for host, reading in readings:
        when = _reading_time(reading)
        items = reading.get("gpus") or []
        known, by_index = maps.get(host.pk) or ({}, {})
        if any(i.get("uuid") not in known and i.get("index") not in by_index for i in items):
            # A GPU the map does not know (a new host or card): the single path's lookup,
            # which learns the inventory if the database does not know it either.
            known, by_index = single._known_gpus(host, reading)  # noqa: SLF001
            forget_gpu_map()
        points, holders = [], {}
        for item in items:
            gpu = known.get(item.get("uuid")) or by_index.get(item.get("index"))
            if gpu is None:
                continue
            holders[gpu.pk] = {p.get("pid") for p in item.get("processes") or []}
            samples.append(
                (
                    gpu.pk,
                    when,
                    *(
                        telemetry_sql.sample_value(kind, item.get(k))
                        for _f, kind, k in SAMPLE_COLUMNS
                    ),
                )
            )
            newest.append((gpu.pk, {k: item.get(k) for k in single.LAST_SAMPLE_KEYS}, when))
            points.append(single._live_point(gpu, item))  # noqa: SLF001
        host.host_readings = reading.get("host") or {}
        host.telemetry_source = (reading.get("source") or "")[:20]
        host.telemetry_note = (reading.get("note") or "")[:300]
        host.last_seen_at = host.last_poll_at = when
        hosts.append(host)
        # Engine states need the host's deployments (prefetched): none, no queries.
        if host.deployments.all():
            engine_work.append((host, reading.get("engines") or {}, when, holders))
        live.append((host, when, points))
    with transaction.atomic():
        telemetry_sql.insert_samples(samples)
        telemetry_sql.update_gpus(newest)
        telemetry_sql.update_hosts(hosts)
        for host, engines, when, holders in engine_work:
            single._engine_states(host, engines, when, holders)  # noqa: SLF001
    committed = time.time()
    messages = []
    for host, when, points in live:
        if lags is not None:
            lags.append(committed - when.timestamp())
        if host.status != HostStatus.ONLINE:
            set_status(host, HostStatus.ONLINE)
        messages.append(
            (
                group_name("host", host.pk),
                "telemetry",
                {"t": int(when.timestamp() * 1000), "gpus": points, "host": host.host_readings},
            )
        )
    telemetry_loop.publish_many(messages)
    return len(samples)


def _reading_time(reading: dict) -> datetime:
    stamp = reading.get("time")
    return datetime.fromtimestamp(stamp, tz=UTC) if stamp else timezone.now()
