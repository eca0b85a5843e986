"""Keep Django's middleware chain in one thread per request under ASGI (issue 22).

Under ASGI Django runs every middleware that can be async as async code. Django's own
(sessions, CSRF, auth, messages, ...) are MiddlewareMixin classes whose async path calls each
``process_request``/``process_response`` through ``sync_to_async``: a hop from the event loop
to a thread and back for each, about a dozen a request. A sync-only middleware innermost makes
Django adapt the whole chain as sync code (one hop into a thread for the chain, one for the
view), which is also what Django's documentation advises for a sync project under ASGI.

Measured by scripts/bench_request_floor.py (1 uvicorn worker, 20 concurrent clients, 2-core
AMD EPYC, quiet): server CPU a request /healthz 3.04 -> 2.12 ms, the login page 4.62 -> 3.68
ms; a static file (answered above the chain) 1.5 ms either way.

That still left the view's own hops: Django's ASGI handler ends its chain in the async
``_get_response_async``, so the sync chain hopped back to the event loop at its innermost
middleware and into the thread again for the view (6 hops a request; threading and asgiref
were 17 % of the web tier's CPU in a py-spy profile under scripts/bench_web.py).
``OneHopASGIHandler`` loads the chain in sync mode, as the WSGI handler does, and runs it,
view included, in one hop into the request's thread: 3 hops a request (that one, and the
handler's request_started and request_finished signals).

Django's handler also starts a new thread for every request (a ``ThreadSensitiveContext``
with no executor makes one, and its exit starts another to join it): Thread.start and the
join were ~7 % of the web worker's GIL time in a py-spy profile under scripts/bench_web.py.
``OneHopASGIHandler`` gives each request a single-thread executor from a free list instead,
the way a WSGI server's thread pool reuses its threads.
"""

import collections
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler


class OneThreadMiddleware:
    """Last in MIDDLEWARE: sync only, so every middleware outside it runs synchronously. It
    does nothing else."""

    sync_capable = True
    async_capable = False

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)


class RequestThreads:
    """Single-thread executors handed to one request at a time and kept for the next.

    Each holds one thread (Django's connections and asgiref's thread-sensitive calls need the
    request's work in one thread). An executor comes back to the free list only once its
    thread has finished everything queued on it: a view still running after its client left
    (asgiref does not wait for it on cancel) never makes the next request queue behind it.
    As many threads as requests were ever in flight at once (the admission limit bounds it);
    idle ones wait on their queue."""

    def __init__(self):
        # deque.append and .pop are atomic: the callback that returns an executor runs in
        # that executor's own thread.
        self._free = collections.deque()
        self.started = 0

    def take(self) -> ThreadPoolExecutor:
        try:
            return self._free.pop()
        except IndexError:
            self.started += 1
            return ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")

    def give_back(self, executor: ThreadPoolExecutor) -> None:
        executor.submit(_nothing).add_done_callback(lambda _done: self._free.append(executor))


def _nothing():
    return None


class OneHopASGIHandler(ASGIHandler):
    """Django's ASGI handler (request parsing, disconnects, streaming, the request signals in
    the request's own thread context) with the whole middleware chain and the view run as sync
    code in one hop into that thread. For a sync project: an async view would be adapted with
    ``async_to_sync`` as under WSGI (this project has none)."""

    def __init__(self):
        super().__init__()
        self.threads = RequestThreads()

    def load_middleware(self, is_async=False):
        super().load_middleware(is_async=False)

    async def __call__(self, scope, receive, send):
        # ASGIHandler.__call__ with the request's thread taken from self.threads.
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = self.threads.take()
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            self.threads.give_back(executor)

    async def get_response_async(self, request):
        # BaseHandler.get_response: the URLconf, the chain, the request's closers, the log of
        # an error response; thread_sensitive, so the same thread as the request's signals.
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)
