"""Django's Redis cache with one client (and so one connection pool) per process (issue 22).

Django keeps a cache object per async context (``caches`` is an asgiref ``Local``), and under
ASGI every request runs in a context and a thread of its own: each request built a new
``RedisCacheClient`` with a new connection pool and opened a new TCP connection to Redis for
its first cache read (sessions, shared page parts, admission), then dropped it. Measured with
scripts/bench_web.py: one Redis connection accepted per page view (14,685 for ~14,000 views),
about 4 % of the web tier's CPU spent connecting. redis-py's pools are thread-safe and notice
a fork (a pool used in a child process starts over), so one per process is what redis-py
intends.
"""

from __future__ import annotations

import threading

from django.core.cache.backends.redis import RedisCache
from django.utils.functional import cached_property

_clients: dict[tuple, object] = {}
_lock = threading.Lock()


class SharedRedisCache(RedisCache):
    """``django.core.cache.backends.redis.RedisCache`` whose client is shared by every
    instance with the same servers and options in this process."""

    @cached_property
    def _cache(self):
        key = (self._class, tuple(self._servers), repr(sorted(self._options.items())))
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = self._class(self._servers, **self._options)
        return client
