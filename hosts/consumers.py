"""Live events of one host: telemetry, its status, deployments (and their scaling signals),
operations and checks."""

from controlpanel.consumers import ObjectConsumer
from hosts.models import Host


class HostConsumer(ObjectConsumer):
    model = Host
    group_kind = "host"
    permission = "hosts.view_host"

    async def check_updated(self, message):
        await self.forward(message)

    async def telemetry(self, message):
        await self.forward(message)

    async def host_status(self, message):
        await self.forward(message)

    async def deployment_updated(self, message):
        await self.forward(message)

    async def operation_updated(self, message):
        await self.forward(message)

    async def deployment_signals(self, message):
        # The scaling poller's live signals of a deployment on this host (scaling page charts).
        await self.forward(message)
