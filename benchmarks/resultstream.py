"""Reading a result file as a stream, and the first pass over it (pure: no Django).

The byte layer: a file from its start (a UTF-8 byte order mark skipped), the bytes read
counted for progress, Python's non-JSON constants (``NaN``, ``Infinity``) made JSON outside
strings. The first pass (``scan``): every top-level key's value is kept as a Python value (at
most ``MAX_BUILT_VALUES`` scalars, ``MAX_DEPTH`` deep), a per-request number list as one
double a request, errors once per text; the lists read in the second pass and the big
per-request parts are skipped without being built. ``benchmarks.importers`` turns what this
keeps into the panel's result document.
"""

from __future__ import annotations

import re
from array import array
from contextlib import contextmanager

import ijson
from ijson.common import ObjectBuilder

DETAILED = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")
# Per-request lists some vllm versions add; never part of the summary.
DETAILED_EXTRA = (
    "start_times",
    "e2els",
    "latencies",
    "successes",
    "finish_reasons",
    "error_kinds",
    "engine_e2els",
    "client_latencies",
    "retry_counts",
    "launch_offsets",
    "raw_chunk_gaps",
    "chunk_token_counts",
)

# How the first pass treats a top-level list, by key. Number lists are kept one double a
# request; these two are read in the second pass, one element at a time; the rest of the
# per-request lists are skipped without being built.
NUMBER_LISTS = ("ttfts", "input_lens", "output_lens", "start_times", "e2els", "latencies")
# GuideLLM's "benchmarks" (each with its own per-request lists) is read by
# ``benchmarks.importers_guidellm`` in its own pass, one request at a time.
SECOND_PASS = ("records", "itls", "benchmarks")
SKIPPED = tuple(
    k for k in DETAILED + DETAILED_EXTRA if k not in (*NUMBER_LISTS, *SECOND_PASS, "errors")
)
READ_SIZE = 64 * 1024  # bytes asked of the file at a time
# Everything else (summary, spec, stages, timeline, panel) is built as Python values: this
# many scalars at most, and nested at most this deep, so no file can make them unbounded.
MAX_BUILT_VALUES = 2_000_000
MAX_DEPTH = 64
ERROR_TEXT = 2000  # characters of a per-request error kept (to classify it; 200 are stored)
_NAN = float("nan")


# --- the stream ---------------------------------------------------------------------------
@contextmanager
def opened(opener, non_finite: bool, report):
    """The file from its start (a UTF-8 byte order mark skipped), counting the bytes read
    and, when the file has any, turning Python's non-JSON constants into JSON. Yields the
    stream to parse and its counter."""
    with opener() as raw:
        if raw.read(3) != b"\xef\xbb\xbf":
            raw.seek(0)
        counted = Counting(raw, report)
        yield (NonFiniteAsText(counted) if non_finite else counted), counted


class Counting:
    """A binary stream that counts what is read from it and reports it."""

    def __init__(self, raw, report):
        self.raw, self.report, self.done = raw, report, 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        if data:
            self.done += len(data)
            if self.report:
                self.report(self.done)
        return data


_CONSTANTS = {b"NaN": b"null", b"Infinity": b'"inf"', b"-Infinity": b'"-inf"'}
_OUTSIDE = re.compile(rb'"|NaN|-?Infinity')
_STRING_BODY = re.compile(rb'(?:[^"\\]+|\\.)*', re.DOTALL)
_LONGEST = max(map(len, _CONSTANTS))


def has_non_finite(opener) -> bool:
    """Whether the bytes NaN or Infinity occur anywhere (a fast scan, in C): only then does
    the file go through ``NonFiniteAsText``."""
    with opener() as raw:
        tail = b""
        while chunk := raw.read(READ_SIZE):
            window = tail + chunk
            if b"NaN" in window or b"Infinity" in window:
                return True
            tail = window[-_LONGEST:]
    return False


class NonFiniteAsText:
    """Reads like the stream it wraps, with ``NaN``, ``Infinity`` and ``-Infinity`` outside
    strings made ``null``, ``"inf"`` and ``"-inf"`` (what ``json_safe`` makes of them).

    Python's ``json`` writes them for non-finite floats — our CLI for an infinite request
    rate, vllm for a percentile of nothing — but they are not JSON and the yajl parser
    refuses them. Strings are skipped whole (a generated text may say "NaN"), across reads."""

    def __init__(self, raw):
        self.raw = raw
        self.in_string = False
        self.carry = b""  # bytes held back: a constant or an escape cut by the read
        self.out = b""
        self.eof = False

    def read(self, size: int = -1) -> bytes:
        while not self.eof and (size < 0 or len(self.out) < max(size, 1)):
            chunk = self.raw.read(READ_SIZE)
            if not chunk:
                self.eof = True
            self.out += self._convert(self.carry + chunk, final=not chunk)
        if size < 0:
            size = len(self.out)
        data, self.out = self.out[:size], self.out[size:]
        return data

    def _convert(self, data: bytes, *, final: bool) -> bytes:
        parts = []
        i, n = 0, len(data)
        self.carry = b""
        while i < n:
            if self.in_string:
                j = _STRING_BODY.match(data, i).end()
                if j < n and data[j] == 0x22:  # the closing quote
                    parts.append(data[i : j + 1])
                    self.in_string = False
                    i = j + 1
                    continue
                if j < n and not final:  # a backslash whose escaped byte is not read yet
                    parts.append(data[i:j])
                    self.carry = data[j:]
                    return b"".join(parts)
                parts.append(data[i:])
                break
            found = _OUTSIDE.search(data, i)
            if found is None:
                keep = 0 if final else _partial_constant(data, i)
                parts.append(data[i : n - keep])
                self.carry = data[n - keep :]
                break
            token = found.group()
            if token == b'"':
                parts.append(data[i : found.end()])
                self.in_string = True
            else:
                parts.append(data[i : found.start()])
                parts.append(_CONSTANTS[token])
            i = found.end()
        return b"".join(parts)


def _partial_constant(data: bytes, start: int) -> int:
    """How many bytes at the end of ``data`` may begin a constant the next read completes."""
    for size in range(min(_LONGEST - 1, len(data) - start), 0, -1):
        end = data[-size:]
        if any(constant.startswith(end) for constant in _CONSTANTS):
            return size
    return 0


def json_error(exc: Exception, counted: Counting) -> ValueError:
    # yajl's message runs over several lines with a quote of the text: its first line says it.
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ValueError(f"not valid JSON (near byte {counted.done:,}): {message}")


# --- the first pass -----------------------------------------------------------------------
class _Numbers:
    """A per-request list of numbers as doubles (NaN: missing, or not a number)."""

    def __init__(self, key: str):
        self.item = f"{key}.item"
        self.values = array("d")
        self.all_numbers = True

    def feed(self, prefix: str, event: str, value) -> None:
        if prefix != self.item or event in ("end_map", "end_array"):
            return  # inside an element that is a list or an object, or its end
        if event == "number":
            try:
                self.values.append(float(value))
                return
            except OverflowError:
                pass
        self.values.append(_NAN)
        self.all_numbers = False


class _Errors:
    """vllm's per-request error texts ("" for a success), the same text kept once."""

    def __init__(self):
        self.values: list[str] = []
        self._texts: dict[str, str] = {}

    def feed(self, prefix: str, event: str, value) -> None:
        if prefix != "errors.item" or event in ("end_map", "end_array"):
            return
        if event == "string":
            text = value[:ERROR_TEXT]
        elif event in ("start_map", "start_array"):
            text = "error"  # a structured error: failed, without a text we keep
        else:
            text = str(value) if value else ""  # null, false, 0: no error
        self.values.append(self._texts.setdefault(text, text))


class Scanned:
    """What the first pass keeps: the top-level values it built, the number lists, the
    errors, and which per-request lists the file has."""

    def __init__(self):
        self.data: dict = {}
        self.present: set[str] = set()
        self.numbers: dict[str, _Numbers] = {}
        self.errors: _Errors | None = None
        self.lists: dict[str, bool] = {}  # SECOND_PASS key: whether it is a list
        self.built_values = 0

    def number_list(self, key: str, n: int):
        """The list ``key`` if it has ``n`` entries; None when absent or empty (as vllm
        leaves them); ``False`` when it is there but does not line up."""
        if key in self.numbers:
            values = self.numbers[key].values
            return values if len(values) == n else (None if not values else False)
        return False if self.data.get(key) else None

    def begin(self, key: str, event: str, value):
        """The first event of ``key``'s value: keep a scalar, or return what takes the rest
        of the value's events (None: skip them)."""
        if key in self.present and (
            key in NUMBER_LISTS or key in SECOND_PASS or key in SKIPPED or key == "errors"
        ):
            raise ValueError(f"the file has the key {key!r} twice")
        self.present.add(key)
        container = event in ("start_map", "start_array")
        if not container:
            self.data[key] = value
            return None
        if key in SECOND_PASS:
            self.lists[key] = event == "start_array"
            return None
        if key in SKIPPED:
            return None
        if event == "start_array" and key in NUMBER_LISTS:
            self.numbers[key] = _Numbers(key)
            return self.numbers[key].feed
        if event == "start_array" and key == "errors":
            self.errors = _Errors()
            return self.errors.feed
        return self._build(key, event, value)

    def _build(self, key: str, event: str, value):
        builder = ObjectBuilder()
        builder.event(event, value)
        depth = 1

        def feed(prefix: str, event: str, value) -> None:
            nonlocal depth
            if event in ("start_map", "start_array"):
                depth += 1
                if depth > MAX_DEPTH:
                    raise ValueError(f"{key!r} is nested more than {MAX_DEPTH} levels deep")
            elif event in ("end_map", "end_array"):
                depth -= 1
                if depth == 0:
                    builder.event(event, value)
                    self.data[key] = builder.value
                    return
            else:
                self.built_values += 1
                if self.built_values > MAX_BUILT_VALUES:
                    raise ValueError(
                        f"the file holds more than {MAX_BUILT_VALUES:,} values outside its "
                        f"per-request lists (at {key!r}): not a result this panel reads"
                    )
            builder.event(event, value)

        return feed


def scan(stream, counted: Counting) -> Scanned:
    """The first pass. Each top-level key's value goes to what ``Scanned.begin`` chose; a
    value's events all have a non-empty prefix, the top level's an empty one."""
    scanned = Scanned()
    key, feed, started = None, None, False
    try:
        for prefix, event, value in ijson.parse(stream, buf_size=READ_SIZE, use_float=True):
            if prefix:
                if started:
                    if feed is not None:
                        feed(prefix, event, value)
                else:
                    started = True
                    feed = scanned.begin(key, event, value)
            elif event == "map_key":
                key, feed, started = value, None, False
            elif event == "start_array":
                raise ValueError(
                    "the file holds a list, not one result: import one run at a time "
                    "(vllm bench serve --append-result files hold several)"
                )
            elif event not in ("start_map", "end_map"):
                raise ValueError("not a benchmark result: expected a JSON object")
    except ijson.JSONError as exc:
        raise json_error(exc, counted) from None
    return scanned
