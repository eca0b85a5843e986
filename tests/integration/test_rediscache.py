"""controlpanel.rediscache against a real Redis: under ASGI every request has a cache object of
its own (Django keeps them per async context, each request its own thread); they must share one
client and connection pool, not open a connection to Redis each (issue 22)."""

from __future__ import annotations

import threading

import pytest
from django.core.cache.backends.redis import RedisCache

from controlpanel.rediscache import SharedRedisCache

pytestmark = pytest.mark.integration


def _clients_of_requests(backend, redis_url: str, requests: int) -> list:
    """The Redis client each of ``requests`` simulated requests used: a cache object made in
    a thread of its own (as Django's ``caches`` hands each request one), a write and a read."""
    clients = []

    def request(n: int) -> None:
        cache = backend(redis_url, {"KEY_PREFIX": "test-rediscache"})
        cache.set(f"k{n}", n, timeout=30)
        assert cache.get(f"k{n}") == n
        clients.append(cache._cache)

    for n in range(requests):
        thread = threading.Thread(target=request, args=(n,))
        thread.start()
        thread.join()
    return clients


def test_requests_share_one_client_and_one_connection(redis_url):
    clients = _clients_of_requests(SharedRedisCache, redis_url, 6)
    assert len({id(c) for c in clients}) == 1
    pool = clients[0]._get_connection_pool(write=True)
    # One request at a time: the pool made one connection and handed it to every request.
    assert pool._created_connections == 1


def test_djangos_own_backend_would_connect_once_a_request(redis_url):
    """What the shared client is for: the stock backend builds a client a cache object."""
    clients = _clients_of_requests(RedisCache, redis_url, 6)
    assert len({id(c) for c in clients}) == 6
    assert all(c._get_connection_pool(write=True)._created_connections == 1 for c in clients)


def test_another_server_or_options_get_a_client_of_their_own(redis_url):
    first = SharedRedisCache(redis_url, {})._cache
    assert SharedRedisCache(redis_url, {})._cache is first
    assert SharedRedisCache(redis_url.rsplit("/", 1)[0] + "/15", {})._cache is not first
    other = SharedRedisCache(redis_url, {"OPTIONS": {"socket_timeout": 7}})._cache
    assert other is not first
