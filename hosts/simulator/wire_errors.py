"""The error a simulated engine answers with, before its dialect wraps it."""

from __future__ import annotations


class ApiError(Exception):
    """A request the engine refuses: answered with ``status`` in the dialect's error envelope.

    ``kind`` is the envelope's ``type``; ``engine`` marks a refusal that comes from the engine
    itself rather than from parsing the request: SGLang reports those inside a stream that has
    already begun (a 200 with an error event), vLLM checks everything before it streams."""

    def __init__(
        self, status: int, message: str, kind: str = "BadRequestError", engine: bool = False
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.engine = status, message, kind, engine
