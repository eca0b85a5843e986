"""Under ASGI the middleware chain runs as sync code in one thread (controlpanel.onethread):
a request hops from the event loop into a thread a fixed, small number of times, not once per
middleware method."""

from __future__ import annotations

import asyncio

import pytest
from asgiref import sync
from django.conf import settings
from django.test import AsyncClient

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_onethread_middleware_is_innermost():
    assert settings.MIDDLEWARE[-1] == "controlpanel.onethread.OneThreadMiddleware"


def _hops(monkeypatch, path: str) -> int:
    count = 0
    original = sync.SyncToAsync.__call__

    async def counting(self, *args, **kwargs):
        nonlocal count
        count += 1
        return await original(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(sync.SyncToAsync, "__call__", counting)
        response = asyncio.run(AsyncClient().get(path))
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
