"""Live events of one change (each new timeline entry and its state changes), and the
advisor's events of one deployment and of the fleet."""

from channels.db import database_sync_to_async

from changes.models import ChangeRequest, Sweep
from controlpanel.consumers import ObjectConsumer
from hosts.models import Deployment


class ChangeConsumer(ObjectConsumer):
    model = ChangeRequest
    group_kind = "change"
    permission = "changes.view_changerequest"

    async def change_event(self, message):
        await self.forward(message)

    async def change_state(self, message):
        await self.forward(message)


class DeploymentAdvisorConsumer(ObjectConsumer):
    """The advisor's events of one deployment: its findings opened, cleared or dismissed (the
    pages then fetch the deployment's Advisor fragment again)."""

    model = Deployment
    group_kind = "deployment"
    permission = "changes.view_finding"

    async def advisor_findings(self, message):
        await self.forward(message)


class FleetAdvisorConsumer(DeploymentAdvisorConsumer):
    """The advisor's events of every deployment, for the dashboard's fleet-wide list. Routed
    with ``pk="fleet"``, so it joins ``advisor-fleet`` (diagnosis.FLEET_GROUP)."""

    group_kind = "advisor"

    @database_sync_to_async
    def _allowed(self, user, pk) -> bool:
        return user is not None and user.is_authenticated and user.has_perm(self.permission)


class SweepConsumer(ObjectConsumer):
    """A tuning sweep's progress: its state, each trial started or finished, each benchmark
    of a trial's search (the page then fetches its live fragment again)."""

    model = Sweep
    group_kind = "sweep"
    permission = "changes.view_sweep"

    async def sweep_updated(self, message):
        await self.forward(message)
