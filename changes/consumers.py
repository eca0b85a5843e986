"""Live events of one change: each new timeline entry and its state changes."""

from changes.models import ChangeRequest
from controlpanel.consumers import ObjectConsumer


class ChangeConsumer(ObjectConsumer):
    model = ChangeRequest
    group_kind = "change"
    permission = "changes.view_changerequest"

    async def change_event(self, message):
        await self.forward(message)

    async def change_state(self, message):
        await self.forward(message)
