"""Live events of one host: telemetry, its status, deployments, operations and checks."""

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
