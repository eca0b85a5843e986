"""channels-redis: a consumer in this process receives an event published by another process."""

import asyncio
import os
import subprocess
import sys
import uuid

import pytest
from channels.testing import WebsocketCommunicator

from home.routing import websocket_urlpatterns
from tests.factories import make_host
from tests.integration.processes import ROOT, use_redis_channel_layer

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PUBLISH = """
import django, sys
django.setup()
from controlpanel.realtime import publish
publish(sys.argv[1], "check.updated", {"id": int(sys.argv[2]), "status": "succeeded"})
"""


def publish_from_another_process(redis_url, group, value):
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "SECRET_KEY": "x" * 60,
        "DJANGO_SETTINGS_MODULE": "controlpanel.settings",
    }
    subprocess.run(
        [sys.executable, "-c", PUBLISH, group, str(value)],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=60,
    )


def test_group_message_from_another_process_reaches_the_socket(settings, redis_url, viewer):
    from channels.routing import URLRouter

    use_redis_channel_layer(settings, redis_url)
    watched, other = make_host(), make_host()

    async def scenario():
        comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/hosts/{watched.pk}/")
        comm.scope["user"] = viewer
        connected, _ = await comm.connect()
        assert connected
        await asyncio.to_thread(publish_from_another_process, redis_url, f"host-{other.pk}", 1)
        await asyncio.to_thread(publish_from_another_process, redis_url, f"host-{watched.pk}", 2)
        message = await comm.receive_json_from(timeout=10)
        await comm.disconnect()
        return message

    # Only the watched host's event arrives (the other group's message was not delivered).
    assert asyncio.run(scenario()) == {
        "event": "check.updated",
        "data": {"id": 2, "status": "succeeded"},
    }


def test_telemetry_is_sent_only_to_the_live_pages_someone_has_open(settings, redis_url):
    """The fleet poll's batch publish (hosts.services.telemetry_loop.publish_many) asks Redis
    which host groups have a member and sends only to those: a watched host's socket gets its
    reading, nothing is sent for the hosts no page shows."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from hosts.services import telemetry_loop

    use_redis_channel_layer(settings, redis_url)
    layer = get_channel_layer()
    tag = uuid.uuid4().hex[:8]
    watched, nobody = f"host-w{tag}", f"host-n{tag}"
    sent = []
    real = layer.group_send

    async def spy(group, message):
        sent.append(group)
        await real(group, message)

    layer.group_send = spy
    try:

        async def join():
            channel = await layer.new_channel()
            await layer.group_add(watched, channel)
            return channel

        channel = async_to_sync(join)()
        telemetry_loop.publish_many(
            [(watched, "telemetry", {"t": 1}), (nobody, "telemetry", {"t": 2})]
        )
        assert sent == [watched]
        message = async_to_sync(layer.receive)(channel)
        assert message == {"type": "telemetry", "data": {"t": 1}}
        async_to_sync(layer.group_discard)(watched, channel)
        telemetry_loop.publish_many([(watched, "telemetry", {"t": 3})])
        assert sent == [watched]  # the page closed: nothing more is sent
    finally:
        del layer.group_send
