"""Base WebSocket consumer: one object, one group, permission checked on connect and after.

A socket outlives the page that opened it, so the login behind it is checked again: the socket
joins its session's group, which a logout closes at once (``controlpanel.signals``), and before
forwarding an event it re-reads the session (expired, flushed, password changed elsewhere) and
the user's permission at most every ``recheck_seconds``: the same rules as a page request
(``controlpanel.session_checks``), shared by one login's sockets and batched across logins.
"""

from __future__ import annotations

import asyncio
import threading
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from controlpanel import realtime_stats, session_checks
from controlpanel.realtime import bind_server_loop, group_name, session_group

# Close codes (4000-4999 are the application's): the browser's live.js stops reconnecting.
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_SESSION_ENDED = 4401

# Rechecks of a login in flight or recently answered in this process, shared by that login's
# sockets: (session key, user pk, permission) -> (loop, monotonic start, future of the verdict).
# A browser holds several sockets (dashboard, host, run pages) and each used to re-read the
# session on its own; with 500 sockets over two processes the rechecks queued on the one
# database thread of each process every 5 s and held events back over a second (issue 22).
_rechecks: dict[tuple, tuple[asyncio.AbstractEventLoop, float, asyncio.Future]] = {}
# Event loops of other threads (a second ASGI server in the process, tests) share the dict:
# its sweep and insert happen under this lock (two sweeps deleting one key raised KeyError).
_rechecks_lock = threading.Lock()
# Rechecks of different logins asked while one batch is being read wait for the next
# (controlpanel.session_checks: ~4 queries for the whole batch, one thread hop): one login per
# socket made 500 separate reads every 5 s, p99 delivery 4.4 s.
_batches: dict[asyncio.AbstractEventLoop, dict[tuple, asyncio.Future]] = {}


@database_sync_to_async
def _read_verdicts(checks: list[tuple]) -> dict[tuple, bool]:
    return session_checks.verdicts(checks)


def _batched_verdict(key: tuple) -> asyncio.Future:
    """A future of ``key``'s verdict, read in one batch with every other check asked in the
    same turn of the event loop or while the previous batch was being read."""
    loop = asyncio.get_running_loop()
    waiting = _batches.get(loop)
    if waiting is None:
        waiting = _batches[loop] = {}
        asyncio.ensure_future(_read_batches(loop, waiting))
    if key not in waiting:
        waiting[key] = loop.create_future()
    return waiting[key]


async def _read_batches(loop: asyncio.AbstractEventLoop, waiting: dict) -> None:
    """Read ``waiting`` (one query set for all), then what was asked meanwhile, until nothing
    waits; one reader per loop, so batches never queue on the database thread."""
    try:
        await asyncio.sleep(0)  # the rest of this turn's checks join the first batch
        while waiting:
            _batches[loop] = asked_meanwhile = {}
            try:
                answers = await _read_verdicts(list(waiting))
            except Exception as exc:  # noqa: BLE001 - handed to every socket that waits on it
                answers = exc
            for key, future in waiting.items():
                if future.done():
                    continue
                if isinstance(answers, Exception):
                    future.set_exception(answers)
                else:
                    future.set_result(answers[key])
            waiting = asked_meanwhile
    finally:
        _batches.pop(loop, None)


class ObjectConsumer(AsyncJsonWebsocketConsumer):
    """Streams the events of one object to a browser.

    Subclasses set ``model``, ``group_kind`` and ``permission`` and define one handler per
    event type, each usually ``forward``-ing the event as it is.
    """

    model = None
    group_kind = ""
    permission = ""
    # How stale the last check of the session may be when an event is forwarded.
    recheck_seconds = 5.0

    async def connect(self):
        bind_server_loop(asyncio.get_running_loop())
        self.joined: list[str] = []
        self.ended = False
        user = self.scope.get("user")
        session_key = getattr(self.scope.get("session"), "session_key", None)
        pk = self.scope["url_route"]["kwargs"].get("pk")
        if not await self._allowed(user, pk):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.user_pk = user.pk
        # Through the ASGI application the user always comes from a session (channels'
        # AuthMiddlewareStack); only a scope built by hand (tests) carries a user without one.
        self.session_key = session_key
        self.checked_at = time.monotonic()
        groups = [group_name(self.group_kind, pk)]
        if session_key:
            groups.append(session_group(session_key))
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
            self.joined.append(group)
        await self.accept()
        realtime_stats.opened(self)

    async def disconnect(self, code):
        realtime_stats.closed(self)
        await self._leave()

    async def _leave(self):
        for group in getattr(self, "joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        self.joined = []

    @database_sync_to_async
    def _allowed(self, user, pk) -> bool:
        if user is None or not user.is_authenticated or not user.has_perm(self.permission):
            return False
        return self.model.objects.filter(pk=pk).exists()

    async def _shared_recheck(self) -> tuple[float, bool]:
        """The verdict of a recheck of this login begun at most ``recheck_seconds`` ago (as
        fresh as each socket checking alone allowed), running one if there is none.

        Returns when that recheck started (the socket's new ``checked_at``) and its verdict.
        """
        loop = asyncio.get_running_loop()
        key = (self.session_key, self.user_pk, self.permission)
        now = time.monotonic()
        with _rechecks_lock:  # no await inside: held for a few dict operations
            entry = _rechecks.get(key)
            if entry is None or entry[0] is not loop or now - entry[1] >= self.recheck_seconds:
                for old_key, (old_loop, old_start, _) in list(_rechecks.items()):
                    if old_loop is not loop or now - old_start >= self.recheck_seconds:
                        del _rechecks[old_key]
                entry = (loop, now, _batched_verdict(key))
                _rechecks[key] = entry
        _, started, verdict = entry
        try:
            # Shielded: one socket closing mid-check must not cancel the others' answer.
            return started, await asyncio.shield(verdict)
        except Exception:
            # A failed read (database down) is not a verdict to hand to the next socket.
            with _rechecks_lock:
                if _rechecks.get(key) is entry:
                    del _rechecks[key]
            raise

    async def end_session(self):
        """Stop streaming for good: leave the groups, then close the socket."""
        if self.ended:
            return
        self.ended = True
        await self._leave()
        await self.close(code=CLOSE_SESSION_ENDED)

    async def session_ended(self, message):
        await self.end_session()

    async def forward(self, message):
        if self.ended:
            return
        if self.session_key and time.monotonic() - self.checked_at >= self.recheck_seconds:
            started, valid = await self._shared_recheck()
            if not valid:
                await self.end_session()
                return
            self.checked_at = started
        await self.send_json({"event": message["type"], "data": message.get("data", {})})

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        # Browsers only listen on these sockets; commands go through forms (CSRF, audit). Not
        # decoded: whatever arrives, JSON or not, gets the same answer and no traceback.
        await self.send_json({"error": "this socket is read-only"})


class NoRouteConsumer(AsyncJsonWebsocketConsumer):
    """Any /ws/ path no route matches (``/ws/hosts/abc/``): refused, not a server error."""

    async def connect(self):
        await self.close(code=CLOSE_NOT_FOUND)
