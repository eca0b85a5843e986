"""Live sockets (issue 14, item 8): a logout closes them, a stale session stops them, and a bad
id or path is refused cleanly on every route."""

from __future__ import annotations

import asyncio

import pytest
from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.sessions.models import Session
from django.test import Client

from controlpanel.consumers import ObjectConsumer
from controlpanel.realtime import publish
from home.routing import websocket_urlpatterns
from tests.factories import make_host

pytestmark = pytest.mark.django_db(transaction=True)

# The routes as the ASGI application serves them: the user comes from the session cookie.
app = AuthMiddlewareStack(URLRouter(websocket_urlpatterns))


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def socket(client: Client, path: str) -> WebsocketCommunicator:
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    return WebsocketCommunicator(app, path, headers=[(b"cookie", cookie)])


async def in_thread(func, *args):
    return await asyncio.get_running_loop().run_in_executor(None, func, *args)


def test_logout_closes_the_sessions_sockets_and_nothing_more_is_streamed(viewer):
    host = make_host()
    client = logged_in(viewer)

    async def scenario():
        comm = socket(client, f"/ws/hosts/{host.pk}/")
        connected, _ = await comm.connect()
        assert connected
        await in_thread(publish, f"host-{host.pk}", "check.updated", {"n": 1})
        assert (await comm.receive_json_from(timeout=5))["data"] == {"n": 1}

        response = await in_thread(client.post, "/accounts/logout/")
        assert response.status_code == 302
        closed = await comm.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": 4401}

        await in_thread(publish, f"host-{host.pk}", "check.updated", {"n": 2})
        assert await comm.receive_nothing(timeout=0.3)
        await comm.wait()

    asyncio.run(scenario())


def test_a_logout_closes_only_that_sessions_sockets(viewer):
    host = make_host()
    leaving, staying = logged_in(viewer), logged_in(viewer)

    async def scenario():
        gone = socket(leaving, f"/ws/hosts/{host.pk}/")
        kept = socket(staying, f"/ws/hosts/{host.pk}/")
        assert (await gone.connect())[0] and (await kept.connect())[0]
        await in_thread(leaving.post, "/accounts/logout/")
        assert (await gone.receive_output(timeout=5))["code"] == 4401
        await in_thread(publish, f"host-{host.pk}", "check.updated", {"n": 3})
        assert (await kept.receive_json_from(timeout=5))["data"] == {"n": 3}
        await kept.disconnect()

    asyncio.run(scenario())


def test_a_session_ended_elsewhere_is_noticed_before_the_next_event(viewer, monkeypatch):
    """No logout signal (the session expired or was flushed by an Admin): the socket re-reads
    its session before forwarding and closes instead of streaming."""
    monkeypatch.setattr(ObjectConsumer, "recheck_seconds", 0)
    host = make_host()
    client = logged_in(viewer)

    async def scenario():
        comm = socket(client, f"/ws/hosts/{host.pk}/")
        assert (await comm.connect())[0]
        await in_thread(publish, f"host-{host.pk}", "check.updated", {"n": 1})
        assert (await comm.receive_json_from(timeout=5))["data"] == {"n": 1}

        await in_thread(lambda: Session.objects.all().delete())
        await in_thread(publish, f"host-{host.pk}", "check.updated", {"n": 2})
        assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}

    asyncio.run(scenario())


def test_a_revoked_role_stops_the_stream(viewer, monkeypatch):
    monkeypatch.setattr(ObjectConsumer, "recheck_seconds", 0)
    host = make_host()
    client = logged_in(viewer)

    async def scenario():
        comm = socket(client, f"/ws/hosts/{host.pk}/")
        assert (await comm.connect())[0]
        await in_thread(viewer.groups.clear)
        await in_thread(publish, f"host-{host.pk}", "check.updated", {"n": 1})
        assert (await comm.receive_output(timeout=5))["code"] == 4401

    asyncio.run(scenario())


BAD_PATHS = [
    "/ws/hosts/abc/",
    "/ws/benchmarks/abc/",
    "/ws/changes/abc/",
    "/ws/hosts/",
    "/ws/hosts/1/extra/",
    "/ws/nothing-here/",
    "/ws/hosts/%00/",
    "/ws/hosts/99999999999999999999999999/",
    "/ws/benchmarks/99999999999999999999999999/",
    "/ws/changes/99999999999999999999999999/",
    "/ws/hosts/424242/",
    "/ws/benchmarks/424242/",
    "/ws/changes/424242/",
]


@pytest.mark.parametrize("path", BAD_PATHS)
def test_a_bad_id_or_path_is_refused_without_a_server_error(viewer, path):
    client = logged_in(viewer)

    async def scenario():
        comm = socket(client, path)
        connected, code = await comm.connect(timeout=5)
        assert not connected
        assert code in (4403, 4404)
        await comm.wait()  # the application ended without raising

    asyncio.run(scenario())


@pytest.mark.parametrize("route", ["hosts", "benchmarks", "changes"])
def test_a_forbidden_or_anonymous_socket_is_refused_on_every_route(nobody, route):
    host = make_host()  # no run or change with this pk may exist: refused either way
    client = logged_in(nobody)

    async def scenario():
        anonymous = WebsocketCommunicator(app, f"/ws/{route}/{host.pk}/")
        roleless = socket(client, f"/ws/{route}/{host.pk}/")
        for comm in (anonymous, roleless):
            connected, code = await comm.connect(timeout=5)
            assert not connected and code == 4403
            await comm.wait()

    asyncio.run(scenario())


def test_text_that_is_not_json_gets_an_answer_not_a_traceback(viewer):
    host = make_host()
    client = logged_in(viewer)

    async def scenario():
        comm = socket(client, f"/ws/hosts/{host.pk}/")
        assert (await comm.connect())[0]
        await comm.send_to(text_data="{not json")
        assert (await comm.receive_json_from(timeout=5))["error"] == "this socket is read-only"
        await comm.send_to(bytes_data=b"\x00\xff")
        assert (await comm.receive_json_from(timeout=5))["error"] == "this socket is read-only"
        await comm.disconnect()

    asyncio.run(scenario())
