"""A throwaway HTTP server on the loopback for tests that need something to answer (a fake
engine, an internal URL that must never be asked): ``serve(handler)`` yields its port."""

from __future__ import annotations

import http.server
import threading
from contextlib import contextmanager


class Handler(http.server.BaseHTTPRequestHandler):
    """A quiet handler with one way to answer."""

    def reply(self, status: int, body: bytes = b"", content_type: str = "application/json"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextmanager
def serve(handler: type[Handler]):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
