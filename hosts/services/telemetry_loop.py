"""One asyncio event loop per worker process, in a thread of its own, that every shard task
of the process hands its agent requests to — so the HTTP client, its keep-alive connections
and the channel layer's Redis connections live as long as the process instead of being
built and torn down every second.

Why aiohttp and not httpx (the agent transport's client): polling is the worker's hot loop,
and against the fleet simulator httpx's ``AsyncClient`` spent 0.56-0.75 ms of CPU a request
(JSON parse included) where aiohttp spends 0.17-0.24 ms (``scripts/bench_agent_fetch.py``,
2-core AMD EPYC) — a quarter of a core at 500 hosts a second. One session serves
every host: its connector finds a host's kept-alive connection by a dict lookup (httpcore
scanned its whole pool a request, so the httpx version needed a client per host).

Credentials go only where they were stored for: each request carries its own host's token
to the address the transport was built from, redirects are never followed and no proxy is
taken from the environment.

Safe with Celery's prefork pool (a forked child never uses its parent's loop: the state is
dropped in the child and rebuilt on first use) and with the embedded worker's thread pool
(threads submit coroutines to the one loop; each waits only for its own).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from dataclasses import dataclass

import aiohttp
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings

from controlpanel.realtime import publish
from hosts.transport.agent import AgentTransport, decode
from hosts.transport.base import AuthError, TransportError

log = logging.getLogger(__name__)

# A kept-alive connection unused this long closes (a host gone or moved to another shard);
# polled hosts are asked every TELEMETRY_INTERVAL, far more often.
KEEPALIVE_SECONDS = 60


@dataclass
class _Loop:
    """The process's loop, its thread and the HTTP session that belongs to the loop."""

    pid: int
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    session: aiohttp.ClientSession | None = None


_lock = threading.Lock()
_state: _Loop | None = None


def _forget_after_fork() -> None:
    # The loop's thread does not exist in a forked child: its copy of the loop is unusable.
    global _state, _lock
    _state, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def running_loop() -> _Loop:
    """The process's loop, started on first use (or again if its thread died)."""
    global _state
    with _lock:
        if _state is None or _state.pid != os.getpid() or not _state.thread.is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="telemetry-loop", daemon=True)
            thread.start()
            _state = _Loop(os.getpid(), loop, thread)
        return _state


def run(coro, timeout: float | None = None):
    """Run ``coro`` on the process's loop and wait for its result from this thread."""
    return asyncio.run_coroutine_threadsafe(coro, running_loop().loop).result(timeout)


# --- agents --------------------------------------------------------------------------------------
def fetch_agents(pairs: list[tuple[object, AgentTransport]], answers: queue.Queue) -> None:
    """Put ``(host, reading or exception)`` on ``answers`` for every plain-HTTP agent of
    ``pairs`` as each answers; returns when all have. At most
    ``TELEMETRY_POLL_CONNECTIONS`` requests of this call are in flight at once."""
    if pairs:
        run(_fetch(running_loop(), pairs, answers))


async def _fetch(state: _Loop, pairs, answers: queue.Queue) -> None:
    gate = asyncio.Semaphore(settings.TELEMETRY_POLL_CONNECTIONS)
    session = _session(state)

    async def one(host, transport: AgentTransport) -> None:
        try:
            async with gate:
                outcome = await _telemetry(session, transport)
        except Exception as exc:  # noqa: BLE001 - reported per host, the rest go on
            outcome = exc
        answers.put((host, outcome))

    await asyncio.gather(*(one(h, t) for h, t in pairs))


def _session(state: _Loop) -> aiohttp.ClientSession:
    """The loop's session, made on first use (runs on the loop). Plain HTTP only: TLS
    agents, each verified against its own CA, take the threaded path."""
    if state.session is None or state.session.closed:
        connector = aiohttp.TCPConnector(
            limit=0,  # the gate above bounds the requests in flight
            limit_per_host=2,
            keepalive_timeout=KEEPALIVE_SECONDS,
        )
        state.session = aiohttp.ClientSession(
            connector=connector, trust_env=False, auto_decompress=True
        )
    return state.session


def close_clients() -> None:
    """Close this process's HTTP session (its kept-alive connections with it)."""
    state = _state
    if state is None or state.pid != os.getpid() or not state.thread.is_alive():
        return

    async def close():
        session, state.session = state.session, None
        if session is not None:
            await session.close()

    run(close(), timeout=10)


async def _telemetry(session: aiohttp.ClientSession, transport: AgentTransport):
    """``GET /v1/telemetry``; the same errors as ``AgentTransport`` (401 → AuthError,
    anything else unusable → TransportError)."""
    where, timeout = transport.where, transport.timeout
    try:
        async with session.get(
            f"{transport.base_url}/v1/telemetry",
            headers=transport.headers,
            timeout=aiohttp.ClientTimeout(total=timeout),
            allow_redirects=False,  # the token is for this address only
        ) as response:
            status, body = response.status, await response.read()
    except TimeoutError:
        return TransportError(f"the agent at {where} did not answer within {timeout:g} s")
    except aiohttp.ClientError as exc:
        return TransportError(f"cannot reach the agent at {where}: {exc}")
    if status == 401:
        return AuthError(f"the agent at {where} refused the token")
    try:
        payload = decode(body)
    except ValueError:
        payload = None
    if status >= 400 or not isinstance(payload, dict):
        text = body[:200].decode("utf-8", "replace")
        return TransportError(f"the agent at {where} answered {status}: {text!r}")
    return payload


# --- live pages ----------------------------------------------------------------------------------
def publish_many(messages: list[tuple[str, str, dict]]) -> None:
    """``controlpanel.realtime.publish`` for many ``(group, event, data)`` at once: on a
    Redis channel layer all sends go out together on the process's loop (``publish`` pays
    an ``async_to_sync`` a message), and only to groups someone is in; ``data`` must be
    JSON-safe already. Never raises."""
    layer = get_channel_layer()
    if layer is None or not messages:
        return
    if isinstance(layer, InMemoryChannelLayer):
        for group, event, data in messages:
            publish(group, event, data)  # only the web process's loop can deliver these
        return

    async def send_all():
        watched = await _watched(layer, {g for g, _e, _d in messages})
        await asyncio.gather(
            *(layer.group_send(g, {"type": e, "data": d}) for g, e, d in messages if g in watched),
            return_exceptions=True,
        )

    try:
        run(send_all(), timeout=5)
    except Exception:  # noqa: BLE001 - a missed live update is reloaded; a poll must not fail
        log.warning("could not publish %d telemetry messages", len(messages), exc_info=True)


async def _watched(layer, groups: set[str]) -> set[str]:
    """The groups of ``groups`` with a member: one pipelined ZCARD a Redis server instead of
    ``group_send``'s two round trips for every group. Most hosts' live pages are open
    nowhere most of the time; at 500 hosts a second the sends to nobody cost the worker
    ~10 % of its CPU (py-spy) and Redis 1,000 commands a second. Uses channels_redis's
    own key and shard of a group; a layer without them is sent everything."""
    try:
        key, shard, connection = layer._group_key, layer.consistent_hash, layer.connection  # noqa: SLF001
    except AttributeError:
        return groups
    by_shard: dict[int, list[str]] = {}
    for group in groups:
        by_shard.setdefault(shard(group), []).append(group)
    watched = set()
    for index, names in by_shard.items():
        pipe = connection(index).pipeline(transaction=False)
        for name in names:
            pipe.zcard(key(name))
        counts = await pipe.execute()
        watched.update(name for name, count in zip(names, counts, strict=True) if count)
    return watched
