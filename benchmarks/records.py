"""The per-request log of a run, stored compactly, and the latency distributions of its CDFs
(pure: no Django).

A 100,000-request run must not bloat the database: each request keeps what an engineer reads
in a CSV (stage, token counts, when it was scheduled and sent, TTFT, end-to-end latency, mean
and worst inter-token gap, TPOT, HTTP status, error) and drops its list of chunk arrival times,
which is what makes the raw records large. The pooled inter-token gaps those lists carry are
summarised once, as quantiles (``distributions``), before they are dropped.

Blob layout (little-endian)::

    b"RQLG" | version (1 byte) | zlib( header length (u32) | header JSON | column bytes ... )

The header names each column with its ``array`` type code and byte length, plus the string
tables (stages, error classes, error messages), so a reader never depends on column order.
Each column is byte-shuffled (all first bytes, then all second bytes, ...) before compression:
the high bytes of float32 times and small integers are nearly constant, which zlib then
squeezes to almost nothing. About 20-25 bytes a request for realistic runs.
"""

from __future__ import annotations

import csv
import io
import json
import math
import operator
import struct
import sys
import zlib
from array import array
from collections.abc import Iterable, Iterator

from benchmarks.loadgen.stats import percentile
from benchmarks.metrics import ITL, LATENCIES

MAGIC = b"RQLG"
FORMAT_VERSION = 1
ERROR_MESSAGE_CHARS = 200
# Percent grid of the CDF charts: every percent, finer in both tails where SLOs live.
QUANTILES: tuple[float, ...] = (
    0.0,
    0.1,
    0.5,
    *(float(p) for p in range(1, 100)),
    99.5,
    99.9,
    100.0,
)
# Pooled inter-token gaps beyond this many are thinned to an even stride for the CDF (a 100k
# request run with 500 tokens each has 50 million gaps); the exact percentiles are the run's
# summary, computed by the load generator from every gap.
MAX_POOLED_GAPS = 2_000_000

# name, array type code. Times: seconds (float32) for when on the run's clock, milliseconds
# (float32) for durations, which keeps sub-microsecond resolution where it matters.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("index", "i"),  # delta-coded
    ("stage", "H"),  # into the stage table
    ("input_len", "i"),
    ("prompt_tokens", "i"),  # -1: unknown
    ("output_tokens", "i"),
    ("max_tokens", "i"),  # -1: unknown
    ("scheduled_s", "f"),  # NaN: unknown
    ("sent_s", "f"),
    ("ttft_ms", "f"),
    ("e2el_ms", "f"),
    ("itl_mean_ms", "f"),
    ("itl_max_ms", "f"),
    ("tpot_ms", "f"),
    ("status", "h"),  # HTTP status; -1: none
    ("error_class", "H"),  # into the error-class table; 0: success
    ("error", "H"),  # into the message table; 0: no message
    ("prefix_id", "i"),  # -1: none
)
CSV_FIELDS = (
    "index",
    "stage",
    "input_len",
    "prompt_tokens",
    "output_tokens",
    "max_tokens",
    "scheduled_s",
    "sent_s",
    "ttft_ms",
    "e2el_ms",
    "itl_mean_ms",
    "itl_max_ms",
    "tpot_ms",
    "status",
    "error_class",
    "error",
    "prefix_id",
)
_INT32 = (-(2**31), 2**31 - 1)
_NAN = float("nan")


class RecordLogError(ValueError):
    """A blob that is not a request log this code can read."""


# --- helpers on one record ------------------------------------------------------------------
def _float(value) -> float:
    """A finite float, or NaN for None/NaN/inf/garbage (JSON turns NaN into null)."""
    if value is None or isinstance(value, bool):
        return _NAN
    try:
        value = float(value)
    except (TypeError, ValueError):
        return _NAN
    return value if math.isfinite(value) else _NAN


def _int(value, missing: int = -1) -> int:
    if value is None or isinstance(value, bool):
        return missing
    try:
        value = int(value)
    except (TypeError, ValueError):
        return missing
    return min(max(value, _INT32[0]), _INT32[1])


def _gaps(chunk_times) -> list[float]:
    times = chunk_times or ()
    return list(map(operator.sub, times[1:], times[:-1]))


def measured(records: Iterable[dict]) -> list[dict]:
    """The records that count: warm-up requests dropped, failed ones kept."""
    return [r for r in records if not r.get("warmup")]


def derived(record: dict) -> dict:
    """What a record's times mean, in the units stored (ms; seconds on the run's clock).

    A record whose send times are unknown (``"relative_times": True``, e.g. imported from a
    file that only has per-request latencies) has its times counted from its own send, and
    no scheduled/sent time of its own."""
    sent = _float(record.get("sent"))
    first = _float(record.get("first_token"))
    end = _float(record.get("end"))
    out_tokens = _int(record.get("output_tokens"), 0)
    times = record.get("chunk_times") or ()
    if len(times) >= 2:
        # The mean gap telescopes; the worst one needs every gap (in C, via map).
        itl_mean = (times[-1] - times[0]) * 1000 / (len(times) - 1)
        itl_max = max(map(operator.sub, times[1:], times[:-1])) * 1000
    else:
        itl_mean = itl_max = _NAN
    ttft = (first - sent) * 1000 if not math.isnan(first) else _NAN
    tpot = (
        (end - first) * 1000 / (out_tokens - 1)
        if out_tokens >= 2 and not math.isnan(first)
        else _NAN
    )
    relative = bool(record.get("relative_times"))
    return {
        "scheduled_s": _NAN if relative else _float(record.get("scheduled")),
        "sent_s": _NAN if relative else sent,
        "ttft_ms": ttft,
        "e2el_ms": (end - sent) * 1000,
        "itl_mean_ms": itl_mean,
        "itl_max_ms": itl_max,
        "tpot_ms": tpot,
    }


# --- encode / decode ------------------------------------------------------------------------
class _Table:
    """Strings → small integers, 0 reserved for 'none'."""

    def __init__(self, *first: str, overflow: int = 0):
        self.values = ["", *first]
        self.index = {v: i for i, v in enumerate(self.values)}
        self.overflow = overflow

    def __call__(self, value: str) -> int:
        number = self.index.get(value)
        if number is None:
            if len(self.values) >= 65535:
                # More distinct strings than a run plausibly has: keep the row, not the text.
                return self.overflow
            number = self.index[value] = len(self.values)
            self.values.append(value)
        return number


def _little(column: array) -> array:
    if sys.byteorder == "big" and column.itemsize > 1:
        column = array(column.typecode, column)
        column.byteswap()
    return column


def _shuffle(data: bytes, size: int) -> bytes:
    if size == 1:
        return data
    return b"".join(data[k::size] for k in range(size))


def _unshuffle(data: bytes, size: int) -> bytes:
    if size == 1:
        return data
    n = len(data) // size
    out = bytearray(len(data))
    for k in range(size):
        out[k::size] = data[k * n : (k + 1) * n]
    return bytes(out)


class LogWriter:
    """The request log built one record at a time, for records that never sit in memory
    together (an imported file read as a stream); ``encode`` is this over a list. Warm-up
    requests are dropped; failed ones are kept with their error."""

    def __init__(self):
        self.stages, self.messages = _Table(), _Table()
        self.classes = _Table("error", overflow=1)  # 0 is success: an overflow must stay a failure
        self.cols = {name: array(code) for name, code in COLUMNS}
        self.previous = 0
        self.count = 0

    def add(self, r: dict, derived_values: dict | None = None) -> None:
        """Append one ``RequestRecord.to_dict()``-shaped record (``derived_values``: its
        ``derived(r)``, when the caller has it already)."""
        if r.get("warmup"):
            return
        cols = self.cols
        index = _int(r.get("index"), 0)
        cols["index"].append(_int(index - self.previous, 0))
        self.previous = index
        cols["stage"].append(self.stages(str(r.get("stage") or "")))
        cols["input_len"].append(_int(r.get("input_len"), 0))
        cols["prompt_tokens"].append(_int(r.get("prompt_tokens")))
        cols["output_tokens"].append(_int(r.get("output_tokens"), 0))
        cols["max_tokens"].append(_int(r.get("max_tokens")))
        for key, value in (derived_values or derived(r)).items():
            cols[key].append(value)
        status = _int(r.get("status"))
        cols["status"].append(status if -32768 <= status <= 32767 else -1)
        error_class = r.get("error_class")
        # 0 is success, so a failure without a class name is still a failure: "error".
        cols["error_class"].append(
            0 if error_class is None else self.classes(str(error_class) or "error")
        )
        cols["error"].append(self.messages(str(r.get("error") or "")[:ERROR_MESSAGE_CHARS]))
        cols["prefix_id"].append(_int(r.get("prefix_id")))
        self.count += 1

    def blob(self) -> bytes:
        header = {
            "count": self.count,
            "stages": self.stages.values,
            "error_classes": self.classes.values,  # entry 0: success
            "errors": self.messages.values,
            "columns": [],
        }
        body = []
        for name, code in COLUMNS:
            data = _little(self.cols[name]).tobytes()
            header["columns"].append([name, code, len(data)])
            body.append(_shuffle(data, self.cols[name].itemsize))
        head = json.dumps(header, separators=(",", ":")).encode()
        payload = struct.pack("<I", len(head)) + head + b"".join(body)
        return MAGIC + bytes([FORMAT_VERSION]) + zlib.compress(payload, 6)


def encode(records: Iterable[dict]) -> bytes:
    """The compressed, columnar log of ``records`` (``RequestRecord.to_dict()`` dicts).
    Warm-up requests are dropped; failed ones are kept with their error."""
    writer = LogWriter()
    for r in records:
        writer.add(r)
    return writer.blob()


def _read(blob: bytes) -> tuple[dict, dict[str, array]]:
    blob = bytes(blob)
    if blob[:4] != MAGIC:
        raise RecordLogError("not a request log (bad magic)")
    if blob[4] != FORMAT_VERSION:
        raise RecordLogError(f"request log format {blob[4]} is not supported")
    try:
        payload = zlib.decompress(blob[5:])
        (size,) = struct.unpack_from("<I", payload)
        header = json.loads(payload[4 : 4 + size])
    except (zlib.error, struct.error, ValueError) as exc:
        raise RecordLogError(f"corrupt request log: {exc}") from None
    offset = 4 + size
    cols = {}
    for name, code, length in header["columns"]:
        column = array(code)
        column.frombytes(_unshuffle(payload[offset : offset + length], column.itemsize))
        if sys.byteorder == "big" and column.itemsize > 1:
            column.byteswap()
        cols[name] = column
        offset += length
    return header, cols


def count(blob: bytes) -> int:
    return _read(blob)[0]["count"]


def _ms(value: float, digits: int) -> float | None:
    return None if math.isnan(value) else round(value, digits)


def iter_rows(blob: bytes) -> Iterator[dict]:
    """The log's requests as flat rows (see ``CSV_FIELDS``); unknown values are None."""
    header, cols = _read(blob)
    stages, classes, messages = header["stages"], header["error_classes"], header["errors"]
    index = 0
    for i in range(header["count"]):
        index += cols["index"][i]
        error_class = cols["error_class"][i]
        yield {
            "index": index,
            "stage": stages[cols["stage"][i]],
            "input_len": cols["input_len"][i],
            "prompt_tokens": None if cols["prompt_tokens"][i] < 0 else cols["prompt_tokens"][i],
            "output_tokens": cols["output_tokens"][i],
            "max_tokens": None if cols["max_tokens"][i] < 0 else cols["max_tokens"][i],
            "scheduled_s": _ms(cols["scheduled_s"][i], 4),
            "sent_s": _ms(cols["sent_s"][i], 4),
            "ttft_ms": _ms(cols["ttft_ms"][i], 3),
            "e2el_ms": _ms(cols["e2el_ms"][i], 3),
            "itl_mean_ms": _ms(cols["itl_mean_ms"][i], 3),
            "itl_max_ms": _ms(cols["itl_max_ms"][i], 3),
            "tpot_ms": _ms(cols["tpot_ms"][i], 3),
            "status": None if cols["status"][i] < 0 else cols["status"][i],
            "error_class": classes[error_class] if error_class else None,
            "error": messages[cols["error"][i]],
            "prefix_id": None if cols["prefix_id"][i] < 0 else cols["prefix_id"][i],
        }


def decode(blob: bytes) -> list[dict]:
    return list(iter_rows(blob))


def csv_lines(blob: bytes) -> Iterator[str]:
    """The log as CSV, one line at a time (header first), for a streaming download."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")

    def line(values) -> str:
        writer.writerow(values)
        text = buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        return text

    yield line(CSV_FIELDS)
    for row in iter_rows(blob):
        yield line("" if row[k] is None else row[k] for k in CSV_FIELDS)


def csv_text(blob: bytes) -> str:
    return "".join(csv_lines(blob))


# --- distributions --------------------------------------------------------------------------
def _quantiles(values: list[float]) -> list[float] | None:
    if not values:
        return None
    values.sort()
    return [round(percentile(values, q), 3) for q in QUANTILES]


class Distributions:
    """The latency distributions collected one record at a time (``add``), in bounded memory:
    one number a request for TTFT, TPOT and E2EL, and the pooled inter-token gaps thinned to
    an even stride once there are more than ``MAX_POOLED_GAPS`` (the stride doubles and every
    other kept gap goes, so the sample stays even without knowing the total in advance).
    ``distributions`` is this over a list."""

    def __init__(self):
        # One value a request (ITL: many, pooled below), named as ``derived`` names them.
        self.values: dict[str, array] = {lat.key: array("d") for lat in LATENCIES if lat is not ITL}
        self.gaps = array("d")  # seconds; every ``stride``-th gap of the successful requests
        self.stride = 1
        self.gaps_total = 0
        self.requests = 0
        self.succeeded = 0

    def add(self, r: dict, derived_values: dict | None = None) -> None:
        """Count one record: warm-up requests are left out, failed ones only counted."""
        if r.get("warmup"):
            return
        self.requests += 1
        if r.get("error_class") is not None:
            return
        self.succeeded += 1
        d = derived_values or derived(r)
        for key, found in self.values.items():
            value = d[f"{key}_ms"]
            if not math.isnan(value):
                found.append(value)
        mine = _gaps(r.get("chunk_times"))
        start = (-self.gaps_total) % self.stride  # the next multiple of the stride
        self.gaps.extend(mine[start :: self.stride] if self.stride > 1 else mine)
        self.gaps_total += len(mine)
        while len(self.gaps) > MAX_POOLED_GAPS:
            # Kept gaps sit at positions 0, s, 2s, …: every other one is the stride 2s.
            self.gaps = self.gaps[::2]
            self.stride *= 2

    def collected(self, key: str) -> tuple[array, float]:
        """The values collected for the latency ``key`` and the factor that makes them ms
        (ITL: the pooled sample of gaps, in seconds; the others are in ms)."""
        if key == ITL.key:
            return self.gaps, 1000.0
        return self.values[key], 1.0

    @property
    def itl_complete(self) -> bool:
        """Whether the ITL sample holds every gap (no thinning happened)."""
        return len(self.gaps) == self.gaps_total

    def _quantiles(self, key: str) -> list[float] | None:
        values, scale = self.collected(key)
        return _quantiles([v * scale for v in values])

    def result(self) -> dict:
        counts = {key: len(found) for key, found in self.values.items()}
        counts[ITL.key] = self.gaps_total
        out = {
            "q": list(QUANTILES),
            **{lat.distribution: self._quantiles(lat.key) for lat in LATENCIES},
            "n": {
                "requests": self.requests,
                "succeeded": self.succeeded,
                **{lat.key: counts[lat.key] for lat in LATENCIES},
            },
        }
        if not self.itl_complete:
            out["itl_sampled"] = len(self.gaps)
        return out


def distributions(records: Iterable[dict]) -> dict:
    """Quantiles (at ``QUANTILES`` percent) of TTFT, ITL, TPOT and E2EL in ms over the
    successful measured requests, for CDF charts (keyed ``Latency.distribution``). ITL pools
    every inter-chunk gap of every request (as ``vllm bench serve`` does). A metric without
    values is None."""
    collected = Distributions()
    for r in records:
        collected.add(r)
    return collected.result()
