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
"""

from asgiref.sync import sync_to_async
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


class OneHopASGIHandler(ASGIHandler):
    """Django's ASGI handler (request parsing, disconnects, streaming, the request signals in
    the request's own thread context) with the whole middleware chain and the view run as sync
    code in one hop into that thread. For a sync project: an async view would be adapted with
    ``async_to_sync`` as under WSGI (this project has none)."""

    def load_middleware(self, is_async=False):
        super().load_middleware(is_async=False)

    async def get_response_async(self, request):
        # BaseHandler.get_response: the URLconf, the chain, the request's closers, the log of
        # an error response; thread_sensitive, so the same thread as the request's signals.
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)
