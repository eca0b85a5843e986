"""Under ASGI the middleware chain runs as sync code in one thread (controlpanel.onethread):
a request hops from the event loop into a thread a fixed, small number of times, not once per
middleware method."""

from __future__ import annotations

import asyncio

import pytest
from asgiref import sync
from django.conf import settings
from django.test import AsyncClient

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]


def test_the_onethread_middleware_is_innermost():
    assert settings.MIDDLEWARE[-1] == "controlpanel.onethread.OneThreadMiddleware"


def _counted(monkeypatch, run):
    """``asyncio.run(run())`` and how many times it hopped from the event loop into a thread."""
    count = 0
    original = sync.SyncToAsync.__call__

    async def counting(self, *args, **kwargs):
        nonlocal count
        count += 1
        return await original(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(sync.SyncToAsync, "__call__", counting)
        result = asyncio.run(run())
    return result, count


def _hops(monkeypatch, path: str) -> int:
    response, count = _counted(monkeypatch, lambda: AsyncClient().get(path))
    assert response.status_code == 200
    return count


def test_a_request_hops_into_a_thread_a_few_times_only(monkeypatch, settings):
    with_chain = _hops(monkeypatch, "/healthz")
    # Without the sync-only middleware each MiddlewareMixin's methods hop on their own.
    settings.MIDDLEWARE = settings.MIDDLEWARE[:-1]
    without = _hops(monkeypatch, "/healthz")
    # Measured: 6 hops (the chain, the view, the handler's request signals) against 16.
    assert with_chain <= 6, with_chain
    assert without >= with_chain + 8, (with_chain, without)


def _asgi_hops(monkeypatch, app, path: str, body: list | None = None) -> tuple[int, int]:
    """The status of GET ``path`` through ASGI application ``app`` (as uvicorn calls it) and
    how many times the request hopped from the event loop into a thread (the body's chunks
    appended to ``body``)."""
    from asgiref.testing import ApplicationCommunicator

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }

    async def get():
        communicator = ApplicationCommunicator(app, scope)
        await communicator.send_input({"type": "http.request", "body": b"", "more_body": False})
        start = await communicator.receive_output(timeout=30)
        while True:
            message = await communicator.receive_output(timeout=30)
            if body is not None:
                body.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await communicator.wait(timeout=30)  # the handler's last steps (request_finished)
        return start["status"]

    return _counted(monkeypatch, get)


def test_the_production_handler_runs_the_chain_and_the_view_in_one_hop(monkeypatch):
    """controlpanel.asgi's handler (what uvicorn serves): the request's signals and one hop for
    the whole chain and view, against Django's own ASGIHandler with the same middleware."""
    from django.core.handlers.asgi import ASGIHandler

    from controlpanel.onethread import OneHopASGIHandler

    status, one_hop = _asgi_hops(monkeypatch, OneHopASGIHandler(), "/healthz")
    assert status == 200
    status, django_own = _asgi_hops(monkeypatch, ASGIHandler(), "/healthz")
    assert status == 200
    # Measured: 1 (request_started, the chain with the view, request_finished) against 6.
    assert one_hop == 1, one_hop
    assert django_own >= one_hop + 4, (one_hop, django_own)


def test_the_production_application_uses_the_one_hop_handler():
    from controlpanel import asgi
    from controlpanel.onethread import OneHopASGIHandler

    assert isinstance(asgi.django_asgi_app, OneHopASGIHandler)
    assert asgi.django_asgi_app._middleware_chain is not None


def test_requests_reuse_their_threads_instead_of_starting_new_ones(monkeypatch):
    """Django's handler starts a thread per request (and another to join it); the production
    handler hands each request a thread kept from an earlier one, and every step of one
    request (its signals, chain and view) still runs in that one thread."""
    import threading

    from django.core.handlers.asgi import ASGIHandler
    from django.core.signals import request_finished, request_started

    from controlpanel.onethread import OneHopASGIHandler

    seen = []

    def note(**kwargs):
        seen.append(threading.current_thread())  # the object: an ident may be reused

    request_started.connect(note)
    request_finished.connect(note)
    try:
        handler = OneHopASGIHandler()
        for _ in range(3):
            status, _hops = _asgi_hops(monkeypatch, handler, "/healthz")
            assert status == 200
            _until_given_back(handler.threads, 1)
        reused = list(seen)
        seen.clear()
        django_own = ASGIHandler()
        for _ in range(3):
            status, _hops = _asgi_hops(monkeypatch, django_own, "/healthz")
            assert status == 200
    finally:
        request_started.disconnect(note)
        request_finished.disconnect(note)
    # Each _asgi_hops runs its own event loop; a kept thread serves all three requests.
    assert len(reused) == 6 and len(set(reused)) == 1, reused
    assert handler.threads.started == 1
    # Django's own: a new thread each request (started and finished in the same one).
    assert len(set(seen)) == 3 and seen[0] == seen[1], seen


def _until_given_back(threads, count: int) -> None:
    """Wait (up to 30 s) until ``count`` executors are back on the free list: an executor
    comes back from its own thread once its queue is done, a moment after its request."""
    import time

    deadline = time.monotonic() + 30
    while len(threads._free) < count and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_request_thread_is_kept_only_once_its_work_is_done():
    """A view still running after its request ended (asgiref does not wait for it when the
    client leaves) keeps its thread: the next request gets another, not a queue behind it."""
    import threading

    from controlpanel.onethread import RequestThreads

    threads = RequestThreads()
    first = threads.take()
    release = threading.Event()
    running = first.submit(release.wait, 30)
    threads.give_back(first)
    second = threads.take()
    assert second is not first and threads.started == 2
    release.set()
    assert running.result(timeout=30) is True
    threads.give_back(second)
    # Both come back once idle (the callbacks run in the executors' own threads).
    _until_given_back(threads, 2)
    assert {threads.take(), threads.take()} == {first, second}
    assert threads.started == 2


# A URLconf of this module's own (settings.ROOT_URLCONF = __name__): a streamed response.
EVENTS: list[str] = []


def _streamed(request):
    from django.http import StreamingHttpResponse

    def chunks():
        for part in ("one,", "two,", "three"):
            EVENTS.append(f"sent {part}")
            yield part

    return StreamingHttpResponse(chunks(), content_type="text/plain")


def _plain(request):
    from django.http import HttpResponse

    EVENTS.append("view")
    return HttpResponse("plain")


def _urlpatterns():
    from django.contrib.auth.decorators import login_not_required
    from django.urls import path

    return [
        path("streamed", login_not_required(_streamed)),
        path("plain", login_not_required(_plain)),
    ]


urlpatterns = _urlpatterns()


@pytest.fixture
def events(settings):
    from django.core.signals import request_finished

    settings.ROOT_URLCONF = __name__
    EVENTS.clear()

    def finished(**kwargs):
        EVENTS.append("finished")

    request_finished.connect(finished)
    yield EVENTS
    request_finished.disconnect(finished)


@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume synchronous iterators")
def test_a_streamed_response_is_sent_whole_and_closed_after_its_body(monkeypatch, events):
    from controlpanel.onethread import OneHopASGIHandler

    body = []
    status, _hops = _asgi_hops(monkeypatch, OneHopASGIHandler(), "/streamed", body)
    assert status == 200
    assert b"".join(body) == b"one,two,three"
    # request_finished (the database connection back to its pool) once, after the last chunk.
    assert events == ["sent one,", "sent two,", "sent three", "finished"], events


def test_a_plain_response_is_closed_once_in_the_requests_one_hop(monkeypatch, events):
    from controlpanel.onethread import OneHopASGIHandler

    body = []
    status, hops = _asgi_hops(monkeypatch, OneHopASGIHandler(), "/plain", body)
    assert (status, b"".join(body), hops) == (200, b"plain", 1)
    assert events == ["view", "finished"], events


def test_a_request_that_cannot_be_built_gets_its_error_response_closed(monkeypatch, events):
    from django.http import HttpResponseBadRequest

    from controlpanel.onethread import OneHopASGIHandler

    handler = OneHopASGIHandler()
    monkeypatch.setattr(
        handler, "create_request", lambda scope, body: (None, HttpResponseBadRequest("bad"))
    )
    body = []
    status, _hops = _asgi_hops(monkeypatch, handler, "/plain", body)
    assert (status, b"".join(body)) == (400, b"bad")
    assert events == ["finished"], events
