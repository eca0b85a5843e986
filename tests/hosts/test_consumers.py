"""The host WebSocket: permission on connect, one group per host, events from worker threads."""

import asyncio
import threading

import pytest
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

from controlpanel.realtime import publish
from home.routing import websocket_urlpatterns
from tests.factories import make_host

pytestmark = pytest.mark.django_db(transaction=True)

app = URLRouter(websocket_urlpatterns)


def communicator(user, host_pk):
    comm = WebsocketCommunicator(app, f"/ws/hosts/{host_pk}/")
    comm.scope["user"] = user
    return comm


async def connect(user, host_pk):
    comm = communicator(user, host_pk)
    connected, code = await comm.connect()
    return comm, connected, code


def test_anonymous_and_roleless_users_are_refused(nobody):
    host = make_host()

    async def scenario():
        for user in (AnonymousUser(), nobody):
            comm, connected, code = await connect(user, host.pk)
            assert not connected and code == 4403
            await comm.disconnect()

    asyncio.run(scenario())


def test_unknown_host_is_refused(viewer):
    async def scenario():
        comm, connected, code = await connect(viewer, 424242)
        assert not connected
        await comm.disconnect()

    asyncio.run(scenario())


def test_event_published_from_a_worker_thread_reaches_only_that_hosts_socket(viewer):
    """The embedded worker publishes from its own thread into the server loop's memory layer."""
    watched, other = make_host(), make_host()

    async def scenario():
        comm, connected, _ = await connect(viewer, watched.pk)
        other_comm, _, _ = await connect(viewer, other.pk)
        assert connected
        worker = threading.Thread(
            target=publish,
            args=(f"host-{watched.pk}", "check.updated", {"id": 7, "status": "succeeded"}),
        )
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: (worker.start(), worker.join())
        )
        message = await comm.receive_json_from(timeout=5)
        assert message == {"event": "check.updated", "data": {"id": 7, "status": "succeeded"}}
        assert await other_comm.receive_nothing(timeout=0.3)
        await comm.send_json_to({"do": "something"})
        assert (await comm.receive_json_from())["error"] == "this socket is read-only"
        await comm.disconnect()
        await other_comm.disconnect()

    asyncio.run(scenario())


def test_a_telemetry_reading_is_streamed_to_the_hosts_page(viewer):
    """record_telemetry (what the poller runs in a worker) → the host's socket, one event
    with every GPU's live point, and the other event types the page listens to."""
    from hosts.services import inventory, telemetry
    from tests.hosts.test_telemetry_store import INVENTORY, reading

    host = make_host()
    inventory.refresh_inventory(host, INVENTORY)

    async def scenario():
        comm, connected, _ = await connect(viewer, host.pk)
        assert connected
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: telemetry.record_telemetry(host, reading(util=(77, 3)))
        )
        events = {}
        while "telemetry" not in events:
            message = await comm.receive_json_from(timeout=5)
            events[message["event"]] = message["data"]
        points = {p["index"]: p for p in events["telemetry"]["gpus"]}
        assert points[0]["utilization_pct"] == 77 and points[1]["utilization_pct"] == 3
        assert points[0]["memory_used_gib"] == 60.0 and points[0]["memory_total_gib"] == 80.0
        assert isinstance(events["telemetry"]["t"], int)  # epoch ms for plotly's date axis
        await comm.disconnect()

    asyncio.run(scenario())
