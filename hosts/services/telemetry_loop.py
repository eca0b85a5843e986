"""One asyncio event loop per worker process, in a thread of its own, that every shard task
of the process hands its agent requests to — so the HTTP clients, their keep-alive
connections and the channel layer's Redis connections live as long as the process instead
of being built and torn down every second.

Why one ``httpx.AsyncClient`` per host and not one for all: httpcore's pool looks at every
pooled connection for every request, so one client over 125 hosts spent ~2.7 ms of CPU a
request on that scan alone (measured against the fleet simulator); a client per host
(one origin, one connection) spends ~0.5 ms a request including the JSON parse.

Safe with Celery's prefork pool (a forked child never uses its parent's loop: the state is
dropped in the child and rebuilt on first use) and with the embedded worker's thread pool
(threads submit coroutines to the one loop; each waits only for its own).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import queue
import ssl
import threading
import time
from dataclasses import dataclass, field

import httpx
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings

from controlpanel.realtime import publish
from hosts.transport.agent import AgentTransport
from hosts.transport.base import AuthError, TransportError

log = logging.getLogger(__name__)

IDLE_CLIENT_SECONDS = 600  # a host's client unused this long (host gone, moved shard) closes


@dataclass
class _Loop:
    """The process's loop, its thread and the per-host clients that belong to the loop."""

    pid: int
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    clients: dict[int, tuple[tuple, httpx.AsyncClient, float]] = field(default_factory=dict)
    swept: float = field(default_factory=time.monotonic)


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
    timeout = settings.TRANSPORT_TIMEOUT

    async def one(host, transport: AgentTransport) -> None:
        try:
            async with gate:
                outcome = await _telemetry(_client(state, host.pk, transport), transport, timeout)
        except Exception as exc:  # noqa: BLE001 - reported per host, the rest go on
            outcome = exc
        answers.put((host, outcome))

    await asyncio.gather(*(one(h, t) for h, t in pairs))
    now = time.monotonic()
    if now - state.swept > 60:
        state.swept = now
        for pk, (_key, client, used) in list(state.clients.items()):
            if now - used > IDLE_CLIENT_SECONDS:
                del state.clients[pk]
                await client.aclose()


def _client(state: _Loop, pk: int, transport: AgentTransport) -> httpx.AsyncClient:
    """Host ``pk``'s client, new when its address or token changed (runs on the loop)."""
    base = transport._client.base_url  # noqa: SLF001 - the transport's own address and token
    headers = dict(transport._client.headers)  # noqa: SLF001
    key = (str(base), headers.get("authorization"), transport.timeout)
    cached = state.clients.get(pk)
    if cached is not None and cached[0] == key:
        state.clients[pk] = (key, cached[1], time.monotonic())
        return cached[1]
    if cached is not None:
        state.loop.create_task(cached[1].aclose())
    client = httpx.AsyncClient(
        base_url=base,
        headers=headers,
        timeout=transport.timeout,
        trust_env=False,
        # Plain HTTP only (TLS agents take the threaded path); one context for all clients
        # instead of loading the CA bundle again for each (~18 ms a client).
        verify=_ssl_context(),
        limits=httpx.Limits(max_connections=2, max_keepalive_connections=1),
    )
    state.clients[pk] = (key, client, time.monotonic())
    return client


def close_clients() -> None:
    """Close every per-host client of this process (their connections with them)."""
    state = _state
    if state is None or state.pid != os.getpid() or not state.thread.is_alive():
        return

    async def close_all():
        clients = [client for _key, client, _used in state.clients.values()]
        state.clients.clear()
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)

    run(close_all(), timeout=10)


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    return ssl.create_default_context()


async def _telemetry(client: httpx.AsyncClient, transport: AgentTransport, timeout: float):
    """``GET /v1/telemetry``; the same errors as ``AgentTransport`` (401 → AuthError,
    anything else unusable → TransportError)."""
    where = transport.where
    try:
        response = await client.get("/v1/telemetry")
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


# --- live pages ----------------------------------------------------------------------------------
def publish_many(messages: list[tuple[str, str, dict]]) -> None:
    """``controlpanel.realtime.publish`` for many ``(group, event, data)`` at once: on a
    Redis channel layer all sends go out together on the process's loop (``publish`` pays
    an ``async_to_sync`` a message); ``data`` must be JSON-safe already. Never raises."""
    layer = get_channel_layer()
    if layer is None or not messages:
        return
    if isinstance(layer, InMemoryChannelLayer):
        for group, event, data in messages:
            publish(group, event, data)  # only the web process's loop can deliver these
        return

    async def send_all():
        await asyncio.gather(
            *(layer.group_send(g, {"type": e, "data": d}) for g, e, d in messages),
            return_exceptions=True,
        )

    try:
        run(send_all(), timeout=5)
    except Exception:  # noqa: BLE001 - a missed live update is reloaded; a poll must not fail
        log.warning("could not publish %d telemetry messages", len(messages), exc_info=True)
