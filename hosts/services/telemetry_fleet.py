"""Telemetry at fleet scale: the hosts of one shard polled concurrently (agents over one
bounded ``httpx.AsyncClient``, SSH and TLS agents on the thread path) and recorded in
batches: one ``bulk_create`` for every GPU sample of the batch, one ``bulk_update`` of the
GPUs' newest readings and one of the hosts' — never a query per GPU or per host.

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

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from controlpanel.realtime import group_name, publish
from hosts.choices import HostStatus, TransportKind
from hosts.models import Gpu, GpuSample, Host
from hosts.services import telemetry as single
from hosts.services.hosts import offer_host_key, set_status
from hosts.services.transports import forget_transport, poll_transport
from hosts.transport.agent import AgentTransport
from hosts.transport.base import AuthError, HostKeyMismatch, TransportError

log = logging.getLogger(__name__)

HOST_FIELDS = [
    "host_readings",
    "telemetry_source",
    "telemetry_note",
    "last_seen_at",
    "last_poll_at",
]


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
    hosts = Host.objects.prefetch_related("gpus", "deployments__gpus")
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
        return poll_hosts(due_hosts(shard, shards))
    finally:
        cache.delete(key)


def poll_hosts(hosts: list[Host], *, deadline: float | None = None) -> ShardResult:
    """Ask every host at once; record what has answered by ``deadline`` seconds in one
    batch, the rest in a second batch as they finish."""
    deadline = settings.TELEMETRY_BATCH_DEADLINE if deadline is None else deadline
    result = ShardResult(hosts=len(hosts))
    if not hosts:
        return result
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
def _fetch_all(hosts: list[Host], answers: queue.Queue) -> None:
    """Put ``(host, reading or exception)`` on ``answers`` for every host, as each answers."""
    plain, threaded = [], []
    for host in hosts:
        try:
            transport = poll_transport(host)  # refuses unbound credentials, as everywhere
        except Exception as exc:  # noqa: BLE001 - reported per host, the rest go on
            answers.put((host, exc))
            continue
        if host.transport == TransportKind.AGENT and not host.agent_tls:
            plain.append((host, transport))
        else:
            threaded.append(host)
    pool = None
    if threaded:
        # SSH (and TLS agents, whose CA the pooled client does not carry) keep their threads.
        pool = ThreadPoolExecutor(max_workers=min(16, len(threaded)))
        for host in threaded:
            pool.submit(_read_in_thread, host, answers)
    if plain:
        asyncio.run(_fetch_agents(plain, answers))
    if pool is not None:
        pool.shutdown(wait=True)
    connection.close()  # this thread's own, if building a transport opened one


def _read_in_thread(host: Host, answers: queue.Queue) -> None:
    try:
        answers.put((host, poll_transport(host).telemetry()))
    except Exception as exc:  # noqa: BLE001 - the main thread applies it to the host
        answers.put((host, exc))
    finally:
        connection.close()


async def _fetch_agents(pairs: list[tuple[Host, AgentTransport]], answers: queue.Queue) -> None:
    limits = httpx.Limits(max_connections=settings.TELEMETRY_POLL_CONNECTIONS)
    timeout = settings.TRANSPORT_TIMEOUT
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:

        async def one(host: Host, transport: AgentTransport) -> None:
            answers.put((host, await _agent_telemetry(client, transport, timeout)))

        await asyncio.gather(*(one(h, t) for h, t in pairs))


async def _agent_telemetry(client: httpx.AsyncClient, transport: AgentTransport, timeout):
    """``GET /v1/telemetry`` with the transport's address and token; the same errors as
    ``AgentTransport`` (401 → AuthError, anything else unusable → TransportError)."""
    where = transport.where
    base = transport._client.base_url  # noqa: SLF001 - the transport's own address and token
    try:
        response = await client.get(
            f"{base}/v1/telemetry",
            headers=dict(transport._client.headers),  # noqa: SLF001
        )
    except httpx.TimeoutException:
        return TransportError(f"the agent at {where} did not answer within {timeout:g} s")
    except httpx.HTTPError as exc:
        return TransportError(f"cannot reach the agent at {where}: {exc}")
    if response.status_code == 401:
        return AuthError(f"the agent at {where} refused the token")
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if response.status_code >= 400 or not isinstance(payload, dict):
        return TransportError(
            f"the agent at {where} answered {response.status_code}: {response.text[:200]!r}"
        )
    return payload


# --- recording ---------------------------------------------------------------------------------
def record_batch(readings: list[tuple[Host, dict]], *, lags: list[float] | None = None) -> int:
    """Store many hosts' readings in one transaction with one insert for all GPU samples;
    then tell each host's live page (one message per host). Returns the samples stored."""
    samples: list[GpuSample] = []
    gpus: list[Gpu] = []
    hosts: list[Host] = []
    engine_work, live = [], []
    for host, reading in readings:
        when = _reading_time(reading)
        known, by_index = single._known_gpus(host, reading)  # noqa: SLF001
        points, holders = [], {}
        for item in reading.get("gpus") or []:
            gpu = known.get(item.get("uuid")) or by_index.get(item.get("index"))
            if gpu is None:
                continue
            holders[gpu.pk] = {p.get("pid") for p in item.get("processes") or []}
            samples.append(
                GpuSample(
                    gpu=gpu, time=when, **{f: item.get(k) for f, k in single.SAMPLE_FIELDS.items()}
                )
            )
            gpu.last_sample = {k: item.get(k) for k in single.LAST_SAMPLE_KEYS}
            gpu.last_sample_at = when
            gpus.append(gpu)
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
        GpuSample.objects.bulk_create(samples)
        if gpus:
            Gpu.objects.bulk_update(gpus, ["last_sample", "last_sample_at"])
        Host.objects.bulk_update(hosts, HOST_FIELDS)
        for host, engines, when, holders in engine_work:
            single._engine_states(host, engines, when, holders)  # noqa: SLF001
    committed = time.time()
    for host, when, points in live:
        if lags is not None:
            lags.append(committed - when.timestamp())
        if host.status != HostStatus.ONLINE:
            set_status(host, HostStatus.ONLINE)
        publish(
            group_name("host", host.pk),
            "telemetry",
            {"t": int(when.timestamp() * 1000), "gpus": points, "host": host.host_readings},
        )
    return len(samples)


def _reading_time(reading: dict) -> datetime:
    stamp = reading.get("time")
    return datetime.fromtimestamp(stamp, tz=UTC) if stamp else timezone.now()
