"""What a host sends, made storable: JSON and text as PostgreSQL takes them.

Both transports read what hosts print or answer into JSON and text columns. Two things in
there fail the write on PostgreSQL: ``NaN``/``Infinity`` (Python's JSON parser accepts them,
JSON has no such numbers, and no JSON column or browser takes them) and NUL characters
(``\\u0000`` in JSON, a raw NUL in a command's output: PostgreSQL stores them in neither
text nor jsonb, so one such string failed the whole batch of hosts written with it).
"""

from __future__ import annotations

import json


def decode(body: bytes | str):
    """JSON with ``NaN``/``Infinity`` read as null and NUL characters dropped. Raises
    ValueError."""
    value = json.loads(body, parse_constant=_no_number)
    # A NUL can only come from that escape (raw control characters are not valid JSON), so
    # the walk runs only for the rare body that has one.
    if (b"\\u0000" if isinstance(body, bytes) else "\\u0000") in body:
        value = _without_nul(value)
    return value


def text(raw: bytes) -> str:
    """A command's output as text: UTF-8 (undecodable bytes replaced), NUL characters
    dropped."""
    decoded = raw.decode("utf-8", "replace")
    return decoded.replace("\x00", "") if "\x00" in decoded else decoded


def _no_number(_name: str) -> None:
    return None


def _without_nul(value):
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_nul(v) for v in value]
    return value
