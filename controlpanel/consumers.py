"""Base WebSocket consumer: one object, one group, permission checked on connect."""

from __future__ import annotations

import asyncio

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from controlpanel.realtime import bind_server_loop, group_name


class ObjectConsumer(AsyncJsonWebsocketConsumer):
    """Streams the events of one object to a browser.

    Subclasses set ``model``, ``group_kind`` and ``permission`` and define one handler per
    event type, each usually ``forward``-ing the event as it is.
    """

    model = None
    group_kind = ""
    permission = ""

    async def connect(self):
        bind_server_loop(asyncio.get_running_loop())
        user = self.scope.get("user")
        pk = self.scope["url_route"]["kwargs"]["pk"]
        if not await self._allowed(user, pk):
            await self.close(code=4403)
            return
        self.group = group_name(self.group_kind, pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    @database_sync_to_async
    def _allowed(self, user, pk) -> bool:
        if user is None or not user.is_authenticated or not user.has_perm(self.permission):
            return False
        return self.model.objects.filter(pk=pk).exists()

    async def forward(self, message):
        await self.send_json({"event": message["type"], "data": message.get("data", {})})

    async def receive_json(self, content, **kwargs):
        # Browsers only listen on these sockets; commands go through forms (CSRF, audit).
        await self.send_json({"error": "this socket is read-only"})
