"""The advisor's sockets: a deployment's (its host and run pages) and the fleet's (the
dashboard) stream the advisor.findings events of a dismissal, to those who may read findings."""

from __future__ import annotations

import asyncio

import pytest
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone

from changes.models import Finding
from changes.services import diagnosis
from home.routing import websocket_urlpatterns
from tests.factories import make_deployment, make_host


@pytest.mark.django_db(transaction=True)
def test_deployment_and_fleet_sockets_stream_findings(operator, viewer, nobody):
    deployment = make_deployment(make_host())
    other = make_deployment(make_host())
    now = timezone.now()
    finding = Finding.objects.create(
        deployment=deployment,
        rule="queue-bound",
        severity="warning",
        title="t",
        seen="s",
        why="w",
        first_seen_at=now,
        last_seen_at=now,
    )
    app = URLRouter(websocket_urlpatterns)

    async def connect(user, path):
        communicator = WebsocketCommunicator(app, path)
        communicator.scope["user"] = user
        connected, code = await communicator.connect()
        return communicator, connected, code

    async def scenario():
        for user in (AnonymousUser(), nobody):
            for path in (f"/ws/deployments/{deployment.pk}/", "/ws/advisor/"):
                communicator, connected, code = await connect(user, path)
                assert not connected and code == 4403
                await communicator.disconnect()
        mine, ok, _ = await connect(viewer, f"/ws/deployments/{deployment.pk}/")
        fleet, ok2, _ = await connect(viewer, "/ws/advisor/")
        elsewhere, ok3, _ = await connect(viewer, f"/ws/deployments/{other.pk}/")
        assert ok and ok2 and ok3
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: diagnosis.dismiss(operator, finding, "known")
        )
        for communicator in (mine, fleet):
            event = await communicator.receive_json_from(timeout=5)
            assert event["event"] == "advisor.findings"
            assert event["data"]["deployment"] == deployment.pk
            await communicator.disconnect()
        assert await elsewhere.receive_nothing(timeout=0.3)
        await elsewhere.disconnect()

    asyncio.run(scenario())
