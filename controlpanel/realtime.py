"""Publishing live events to browsers: the one helper workers use to reach the channel layer.

Each object has its own group (``host-7``, ``run-12``); a message's ``type`` is the event name
and the consumer has one handler per event type. In embedded mode the channel layer lives in
memory inside the web process and its queues belong to the server's event loop, so a worker
thread must hand the send to that loop instead of running it on a loop of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.core.serializers.json import DjangoJSONEncoder

log = logging.getLogger(__name__)

_server_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def group_name(kind: str, pk) -> str:
    return f"{kind}-{pk}"


def session_group(session_key: str) -> str:
    """The group every socket opened with one login session joins (closed at its logout).

    Named by a hash: group names are visible to whoever can list the channel layer's keys, and
    a session key is as good as the password.
    """
    return "session-" + hashlib.sha256(session_key.encode()).hexdigest()[:40]


def bind_server_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Remember the ASGI server's loop (called by consumers on connect)."""
    global _server_loop
    with _lock:
        _server_loop = loop


def publish(group: str, event: str, data: dict) -> None:
    """Send ``event`` (e.g. ``check.updated``) with JSON-safe ``data`` to every socket in ``group``.

    Never raises: a page that misses a live update can reload, but a worker must not fail an
    operation because nobody was watching or the layer hiccupped.
    """
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": event, "data": json.loads(json.dumps(data, cls=DjangoJSONEncoder))}
    try:
        loop = _server_loop
        if isinstance(layer, InMemoryChannelLayer):
            if loop is None or not loop.is_running():
                return  # nobody has connected to this process: nothing to deliver to
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                loop.create_task(layer.group_send(group, message))
            else:
                asyncio.run_coroutine_threadsafe(layer.group_send(group, message), loop).result(5)
        else:
            async_to_sync(layer.group_send)(group, message)
    except Exception:  # noqa: BLE001 - see docstring
        log.warning("could not publish %s to %s", event, group, exc_info=True)
