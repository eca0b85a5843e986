"""Live events of one host: its checks now, its telemetry later."""

from controlpanel.consumers import ObjectConsumer
from hosts.models import Host


class HostConsumer(ObjectConsumer):
    model = Host
    group_kind = "host"
    permission = "hosts.view_host"

    async def check_updated(self, message):
        await self.forward(message)
