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
"""


class OneThreadMiddleware:
    """Last in MIDDLEWARE: sync only, so every middleware outside it runs synchronously. It
    does nothing else."""

    sync_capable = True
    async_capable = False

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)
