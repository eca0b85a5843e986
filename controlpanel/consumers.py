"""Base WebSocket consumer: one object, one group, permission checked on connect and after.

A socket outlives the page that opened it, so the login behind it is checked again: the socket
joins its session's group, which a logout closes at once (``controlpanel.signals``), and before
forwarding an event it re-reads the session (expired, flushed, password changed elsewhere) and
the user's permission at most every ``recheck_seconds``.
"""

from __future__ import annotations

import asyncio
import time
from importlib import import_module
from types import SimpleNamespace

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib import auth

from controlpanel import realtime_stats
from controlpanel.realtime import bind_server_loop, group_name, session_group

# Close codes (4000-4999 are the application's): the browser's live.js stops reconnecting.
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_SESSION_ENDED = 4401


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

    @database_sync_to_async
    def _session_still_valid(self) -> bool:
        """The session still logs in the same, active user, who still holds the permission.

        ``auth.get_user`` applies the same rules as a page request: the session must exist and
        be unexpired, and its password hash must still match the user's.
        """
        store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=self.session_key)
        user = auth.get_user(SimpleNamespace(session=store))
        return user.is_authenticated and user.pk == self.user_pk and user.has_perm(self.permission)

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
            if not await self._session_still_valid():
                await self.end_session()
                return
            self.checked_at = time.monotonic()
        await self.send_json({"event": message["type"], "data": message.get("data", {})})

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        # Browsers only listen on these sockets; commands go through forms (CSRF, audit). Not
        # decoded: whatever arrives, JSON or not, gets the same answer and no traceback.
        await self.send_json({"error": "this socket is read-only"})


class NoRouteConsumer(AsyncJsonWebsocketConsumer):
    """Any /ws/ path no route matches (``/ws/hosts/abc/``): refused, not a server error."""

    async def connect(self):
        await self.close(code=CLOSE_NOT_FOUND)
