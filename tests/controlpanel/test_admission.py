"""Admission control (controlpanel.admission): a web process runs at most ``limit`` requests
at once, the next wait their turn in order, and one that waits past ``wait_s`` gets a quick 503
with Retry-After (it was a 500 after 10 s waiting for a database connection, issue 22);
WebSockets, the health check, /metrics and static files never wait."""

from __future__ import annotations

import asyncio
import json

import pytest

from controlpanel import admission
from controlpanel.admission import Admission


class Slow:
    """An ASGI app whose requests run until the test lets them finish."""

    def __init__(self):
        self.started: list[str] = []
        self.release = asyncio.Event()

    async def __call__(self, scope, receive, send):
        self.started.append(scope["path"])
        if scope["type"] == "http" and scope["path"].startswith("/slow"):
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def call(app, path: str, kind: str = "http") -> dict:
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    await app({"type": kind, "path": path}, receive, send)
    start = sent[0]
    return {
        "status": start["status"],
        "headers": dict(start["headers"]),
        "body": b"".join(m.get("body", b"") for m in sent[1:]),
    }


async def settle():
    for _ in range(20):
        await asyncio.sleep(0)


def test_past_the_limit_a_request_is_refused_at_once_with_503_and_retry_after():
    shed = []

    async def scenario():
        inner = Slow()
        app = Admission(inner, limit=2, wait_s=0, on_shed=shed.append)
        running = [asyncio.ensure_future(call(app, f"/slow/{i}")) for i in range(2)]
        await settle()
        assert app.in_flight == 2
        before = admission.SHED._value.get()
        busy = await call(app, "/hosts/")
        assert busy["status"] == 503 and busy["headers"][b"retry-after"] == b"1"
        assert b"The panel is busy" in busy["body"]
        assert busy["headers"][b"content-type"].startswith(b"text/plain")
        api = await call(app, "/api/v1/runs/")
        assert api["status"] == 503
        assert "busy" in json.loads(api["body"])["detail"]
        assert admission.SHED._value.get() == before + 2
        assert shed == ["/hosts/", "/api/v1/runs/"]
        assert inner.started == ["/slow/0", "/slow/1"]  # the refused never reached Django
        # Never waiting, even now: the health check, /metrics, static files, sockets.
        for path in ("/healthz", "/metrics", "/static/x.css"):
            assert (await call(app, path))["status"] == 200
        assert (await call(app, "/ws/hosts/1/", kind="websocket"))["status"] == 200
        inner.release.set()
        assert [(await r)["status"] for r in running] == [200, 200]
        assert app.in_flight == 0
        assert (await call(app, "/hosts/"))["status"] == 200

    asyncio.run(scenario())


def test_a_waiting_request_gets_the_next_free_slot_in_arrival_order():
    async def scenario():
        inner = Slow()
        app = Admission(inner, limit=1, wait_s=3600)
        first = asyncio.ensure_future(call(app, "/slow/first"))
        await settle()
        waiting = [asyncio.ensure_future(call(app, f"/next/{i}")) for i in range(3)]
        await settle()
        assert inner.started == ["/slow/first"]  # the others wait, no thread, no connection
        inner.release.set()
        assert [(await w)["status"] for w in [first, *waiting]] == [200] * 4
        assert inner.started == ["/slow/first", "/next/0", "/next/1", "/next/2"]

    asyncio.run(scenario())


def test_a_limit_below_one_is_refused():
    with pytest.raises(ValueError):
        Admission(Slow(), limit=0, wait_s=1)


def test_the_asgi_application_admits_http_through_the_settings_limits(settings):
    from controlpanel import asgi

    http = asgi.application.application_mapping["http"]
    assert isinstance(http, Admission)
    assert http.limit == settings.WEB_MAX_IN_FLIGHT and http.wait_s == settings.WEB_QUEUE_SECONDS
