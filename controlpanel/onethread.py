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
view included, in one hop into the request's thread, together with the handler's
request_started and (for a response that is not streamed) request_finished signals: 1 hop a
request instead of 6.

Django's handler also starts a new thread for every request (a ``ThreadSensitiveContext``
with no executor makes one, and its exit starts another to join it): Thread.start and the
join were ~7 % of the web worker's GIL time in a py-spy profile under scripts/bench_web.py.
``OneHopASGIHandler`` gives each request a single-thread executor from a free list instead,
the way a WSGI server's thread pool reuses its threads.
"""

import asyncio
import collections
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import FileResponse
from django.urls import set_script_prefix


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

    async def handle(self, scope, receive, send):
        """ASGIHandler.handle (Django 5.2) with the request's sync work in one hop: the
        request_started signal, the request's creation, the chain and the view, and, for a
        response that is not streamed, its close (request_finished: the database connection
        back to its pool) before it is sent. Django hops for each of those three. Disconnects
        are watched as Django does; a streamed response is closed after its body is sent."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))

        async def process_request():
            response = await sync_to_async(self._respond, thread_sensitive=True)(scope, body_file)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client disconnected during send_response
            return response

        tasks = [
            # As Django: the disconnect listener first, so its result is read before the
            # request's task is cancelled.
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(process_request()),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        try:
            response = tasks[1].result()
        except asyncio.CancelledError:
            await signals.request_finished.asend(sender=self.__class__)
        else:
            if response.streaming:
                await sync_to_async(response.close, thread_sensitive=True)()
        body_file.close()

    def _respond(self, scope, body_file):
        """In the request's thread: the response to the request in ``scope`` (the error
        response when it cannot be built), closed already unless it is streamed."""
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            # BaseHandler.get_response: the URLconf, the chain, the request's closers, the log
            # of an error response.
            response = self.get_response(request)
            response._handler_class = self.__class__
            # As ASGIHandler.run_get_response: the ASGI server chunks file responses.
            if isinstance(response, FileResponse):
                response.block_size = self.chunk_size
        if not response.streaming:
            response.close()
        return response
