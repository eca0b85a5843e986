"""The top app: the pages and commands that span every other app.

It sits above ``changes``, ``benchmarks``, ``hosts`` and ``controlpanel`` and may import any of
them; nothing imports it (the project's ASGI entry point reaches its WebSocket routes, the one
stated exception in the import-linter contracts of ``pyproject.toml``).
"""
