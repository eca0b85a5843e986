"""Profiles from real traffic (pure: no Django): read a sample of request sizes and arrival
times, summarise it, and turn it into a load profile document that either *fits* its
distributions (empirical token lengths, the observed rate and burstiness) or *replays* it
request by request.

A sample is JSONL (one object a line) or CSV with a header. Each request needs its input and
output token counts; a timestamp (seconds, or an ISO-8601 datetime) and a shared-prefix id are
optional. Common column names are accepted (``prompt_tokens``/``completion_tokens`` as in an
OpenAI ``usage`` object, which may also be nested under ``usage``). Errors name the line.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime

from benchmarks.loadgen.profile import validate
from benchmarks.loadgen.spec import SpecError

MAX_ROWS = 100_000
MAX_BYTES = 20 * 1024 * 1024
MAX_BUCKETS = 64
BURSTINESS_RANGE = (0.05, 20.0)

INPUT_NAMES = ("input_tokens", "prompt_tokens", "input_len", "input_length", "prompt_len")
OUTPUT_NAMES = (
    "output_tokens",
    "completion_tokens",
    "output_len",
    "output_length",
    "completion_len",
)
TIME_NAMES = ("timestamp", "time", "ts", "arrival_time", "created_at", "created")
PREFIX_NAMES = ("prefix_id", "prefix", "prefix_group")
PREFIX_LEN_NAMES = ("prefix_len", "prefix_tokens")


class TrafficError(SpecError):
    """A traffic sample that cannot be read; the message names the line and the problem."""


@dataclass(frozen=True, slots=True)
class TrafficRow:
    """One request of a sample. ``timestamp`` in seconds (epoch or any origin); ``line`` is
    where it was read, for messages."""

    timestamp: float | None
    input_tokens: int
    output_tokens: int
    prefix_id: str | None = None
    prefix_len: int | None = None
    line: int = 0


# -- reading --------------------------------------------------------------------------------


def parse(data: bytes | str, *, filename: str = "", fmt: str | None = None) -> list[TrafficRow]:
    """The rows of a sample, sorted by timestamp when it has them.

    ``fmt`` is "jsonl" or "csv"; by default the file name's extension decides, else the
    first character (``{`` is JSONL). Raises ``TrafficError`` for the first bad row.
    """
    if isinstance(data, bytes):
        if len(data) > MAX_BYTES:
            raise TrafficError(f"sample: larger than {MAX_BYTES // 2**20} MB")
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise TrafficError(f"sample: not UTF-8 text (byte {exc.start})") from None
    else:
        text = data.removeprefix("\ufeff")
        if len(text) > MAX_BYTES:
            raise TrafficError(f"sample: larger than {MAX_BYTES // 2**20} MB")
    fmt = fmt or _guess_format(text, filename)
    if fmt not in ("jsonl", "csv"):
        raise TrafficError(f"sample: unknown format {fmt!r} (jsonl or csv)")
    records = _jsonl_records(text) if fmt == "jsonl" else _csv_records(text)
    return _sorted([_row(record, line) for line, record in records])


def _sorted(rows: list[TrafficRow]) -> list[TrafficRow]:
    if not rows:
        raise TrafficError("sample: no rows")
    timed = [r.timestamp is not None for r in rows]
    if any(timed) and not all(timed):
        first, missing = rows[timed.index(True)], rows[timed.index(False)]
        raise TrafficError(
            f"line {missing.line}: no timestamp, but line {first.line} has one "
            "(give every row a timestamp, or none)"
        )
    if all(timed):
        rows.sort(key=lambda r: r.timestamp)
    return rows


def _guess_format(text: str, filename: str) -> str:
    name = filename.lower()
    if name.endswith(".csv"):
        return "csv"
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    return "jsonl" if text.lstrip().startswith(("{", "[")) else "csv"


def _jsonl_records(text: str):
    count = 0
    for number, line in enumerate(io.StringIO(text), start=1):
        if not line.strip():
            continue
        count += 1
        if count > MAX_ROWS:
            raise TrafficError(f"sample: more than {MAX_ROWS:,} rows")
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TrafficError(f"line {number}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise TrafficError(f"line {number}: expected a JSON object")
        usage = record.get("usage")
        if isinstance(usage, dict):  # an OpenAI-style response or log line
            record = {**usage, **{k: v for k, v in record.items() if k != "usage"}}
        yield number, record


def _csv_records(text: str):
    reader = csv.reader(io.StringIO(text, newline=""))
    header = None
    count = 0
    try:
        for values in reader:
            if not any(v.strip() for v in values):
                continue
            if header is None:
                header = [v.strip().lower() for v in values]
                continue
            count += 1
            if count > MAX_ROWS:
                raise TrafficError(f"sample: more than {MAX_ROWS:,} rows")
            if len(values) > len(header):
                raise TrafficError(
                    f"line {reader.line_num}: {len(values)} values for {len(header)} columns"
                )
            yield reader.line_num, dict(zip(header, values, strict=False))
    except csv.Error as exc:
        raise TrafficError(f"line {reader.line_num}: {exc}") from None


def _pick(record: dict, names: tuple[str, ...]):
    for name in names:
        value = record.get(name)
        if value is not None and value != "":
            return name, value
    return names[0], None


def _count(value, name: str, line: int, minimum: int) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TrafficError(f"line {line}: {name} {value!r} is not a number") from None
    if not math.isfinite(number) or number != int(number):
        raise TrafficError(f"line {line}: {name} {value!r} is not a whole number")
    if number < minimum:
        raise TrafficError(f"line {line}: {name} must be >= {minimum}")
    return int(number)


def _seconds(value, name: str, line: int) -> float:
    if isinstance(value, bool):
        raise TrafficError(f"line {line}: {name} {value!r} is not a time")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = str(value).strip()
        try:
            seconds = float(text)
        except ValueError:
            try:
                moment = datetime.fromisoformat(text)
            except ValueError:
                raise TrafficError(
                    f"line {line}: {name} {text!r} is neither seconds nor an ISO-8601 time"
                ) from None
            if moment.tzinfo is None:  # a log without a zone: read it as UTC
                moment = moment.replace(tzinfo=UTC)
            seconds = moment.timestamp()
    if not math.isfinite(seconds):
        raise TrafficError(f"line {line}: {name} must be a finite number of seconds")
    return seconds


def _row(record: dict, line: int) -> TrafficRow:
    in_name, in_value = _pick(record, INPUT_NAMES)
    out_name, out_value = _pick(record, OUTPUT_NAMES)
    missing = [
        label
        for label, value in (("input_tokens", in_value), ("output_tokens", out_value))
        if value is None
    ]
    if missing:
        raise TrafficError(
            f"line {line}: no {' or '.join(missing)} "
            f"(columns accepted: {', '.join(INPUT_NAMES)}; {', '.join(OUTPUT_NAMES)})"
        )
    time_name, time_value = _pick(record, TIME_NAMES)
    _, prefix = _pick(record, PREFIX_NAMES)
    prefix_len_name, prefix_len = _pick(record, PREFIX_LEN_NAMES)
    return TrafficRow(
        timestamp=None if time_value is None else _seconds(time_value, time_name, line),
        input_tokens=_count(in_value, in_name, line, 1),
        output_tokens=_count(out_value, out_name, line, 1),
        prefix_id=None if prefix is None else str(prefix),
        prefix_len=None if prefix_len is None else _count(prefix_len, prefix_len_name, line, 0),
        line=line,
    )


# -- summarising ----------------------------------------------------------------------------


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if len(ordered) == 1:
        return float(ordered[0])
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _lengths(values: list[int]) -> dict:
    ordered = sorted(values)
    return {
        "mean": sum(ordered) / len(ordered),
        "p50": _quantile(ordered, 0.5),
        "p95": _quantile(ordered, 0.95),
        "min": ordered[0],
        "max": ordered[-1],
    }


def _arrivals(rows: list[TrafficRow]) -> dict | None:
    """Rate, gap CV and burstiness, or None without timestamps (or with a zero span)."""
    if len(rows) < 2 or rows[0].timestamp is None:
        return None
    times = [r.timestamp for r in rows]
    span = times[-1] - times[0]
    if span <= 0:
        return None
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    mean = span / len(gaps)
    variance = sum((g - mean) ** 2 for g in gaps) / len(gaps)
    cv = math.sqrt(variance) / mean
    low, high = BURSTINESS_RANGE
    burstiness = high if cv == 0 else min(high, max(low, 1.0 / (cv * cv)))
    return {"span_s": span, "rate": len(gaps) / span, "cv": cv, "burstiness": burstiness}


def _prefixes(rows: list[TrafficRow]) -> dict:
    """Prefix ids seen at least twice are shared; their groups and the share of requests."""
    counts = Counter(r.prefix_id for r in rows if r.prefix_id is not None)
    shared = {pid: n for pid, n in counts.items() if n >= 2}
    lengths = sorted(r.prefix_len for r in rows if r.prefix_len and r.prefix_id in shared)
    return {
        "ids": len(counts),
        "groups": len(shared),
        "share": sum(shared.values()) / len(rows),
        "length": round(_quantile(lengths, 0.5)) if lengths else None,
    }


def stats(rows: list[TrafficRow]) -> dict:
    """What the page shows before saving: size, span, lengths, rate, gap CV, prefixes, and
    notes on what the sample cannot say."""
    if not rows:
        raise TrafficError("sample: no rows")
    arrivals = _arrivals(rows)
    prefixes = _prefixes(rows)
    notes = []
    if rows[0].timestamp is None:
        notes.append("No timestamps: the fitted profile is a closed loop; replay is not possible.")
    elif arrivals is None:
        notes.append(
            "Every request has the same timestamp: no rate to fit; the fitted profile "
            "is a closed loop."
        )
    if prefixes["groups"] and not prefixes["length"]:
        notes.append("Prefix ids but no prefix length: give the shared prefix's length in tokens.")
    return {
        "count": len(rows),
        "has_timestamps": rows[0].timestamp is not None,
        "span_s": arrivals["span_s"] if arrivals else None,
        "rate": arrivals["rate"] if arrivals else None,
        "cv": arrivals["cv"] if arrivals else None,
        "burstiness": arrivals["burstiness"] if arrivals else None,
        "input": _lengths([r.input_tokens for r in rows]),
        "output": _lengths([r.output_tokens for r in rows]),
        "prefix_groups": prefixes["groups"],
        "prefix_share": prefixes["share"],
        "prefix_len": prefixes["length"],
        "notes": notes,
    }


# -- profiles -------------------------------------------------------------------------------


def histogram(values: list[int], buckets: int = MAX_BUCKETS) -> dict:
    """An empirical length distribution of at most ``buckets`` values: each distinct length
    when there are few, else log-spaced buckets (token lengths are long-tailed, so the tail
    keeps its resolution) each represented by its members' mean, weighted by their share.
    ``low``/``high`` are the observed extremes, so sampling never leaves the observed range."""
    if not values:
        raise TrafficError("sample: no lengths")
    counts = Counter(values)
    low, high = min(values), max(values)
    if len(counts) <= buckets:
        groups = [(n, c, n * c) for n, c in sorted(counts.items())]
    else:
        ratio = math.log(high / low)
        sums: dict[int, list[int]] = {}
        for n, c in counts.items():
            index = min(buckets - 1, int(math.log(n / low) / ratio * buckets))
            bucket = sums.setdefault(index, [0, 0])
            bucket[0] += c
            bucket[1] += n * c
        groups = [(0, c, s) for _, (c, s) in sorted(sums.items())]
    total = len(values)
    merged: dict[int, float] = {}
    for _, count, length_sum in groups:
        length = min(high, max(low, round(length_sum / count)))
        merged[length] = merged.get(length, 0.0) + count / total
    return {
        "kind": "empirical",
        "values": [[n, round(w, 6)] for n, w in sorted(merged.items())],
        "low": low,
        "high": high,
    }


def _prefix_fields(rows: list[TrafficRow], prefix_len: int | None) -> dict:
    """Shared-prefix keys from the sample's prefix ids (ids seen twice or more are shared);
    ``prefix_len`` overrides the sample's own prefix length column. A length given for a
    sample without ids means one prefix shared by every request.

    A sample counts a request's prefix within its input tokens (the prompt as it was sent),
    so the profile keeps its input lengths whole and says so (``prefix_within_input``)
    rather than adding the prefix on top as a hand-written profile does."""
    prefixes = _prefixes(rows)
    length = prefix_len if prefix_len is not None else prefixes["length"]
    if not prefixes["groups"] or not length:
        if not prefix_len:
            return {"prefix_len": 0}
        return {"prefix_len": int(prefix_len), "prefix_within_input": True}
    return {
        "prefix_len": int(length),
        "prefix_groups": prefixes["groups"],
        "prefix_share": round(prefixes["share"], 4),
        "prefix_within_input": True,
    }


def fit(
    rows: list[TrafficRow],
    *,
    num_requests: int | None = None,
    duration_s: float | None = None,
    concurrency: int = 8,
    max_concurrency: int | None = None,
    prefix_len: int | None = None,
    buckets: int = MAX_BUCKETS,
    **fields,
) -> dict:
    """A validated profile document that draws from the sample's distributions: empirical
    input/output lengths, and one open-loop stage at the observed rate with burstiness
    1/CV² of the gaps (a closed loop of ``concurrency`` when the sample has no times). The
    stage sends as many requests as the sample had unless ``num_requests``/``duration_s``
    say otherwise. ``fields`` are further document keys (slo, warmup_requests, endpoint…)."""
    if not rows:
        raise TrafficError("sample: no rows")
    arrivals = _arrivals(rows)
    if duration_s is None and num_requests is None:
        num_requests = len(rows)
    stage = {"name": "traffic"}
    if arrivals:
        stage["request_rate"] = round(arrivals["rate"], 6)
        stage["burstiness"] = round(arrivals["burstiness"], 4)
        if max_concurrency is not None:
            stage["max_concurrency"] = int(max_concurrency)
    else:
        stage["concurrency"] = int(concurrency)
    if num_requests is not None:
        stage["num_requests"] = int(num_requests)
    if duration_s is not None:
        stage["duration_s"] = float(duration_s)
    document = {
        "stages": [stage],
        "input_len": histogram([r.input_tokens for r in rows], buckets),
        "output_len": histogram([r.output_tokens for r in rows], buckets),
        **_prefix_fields(rows, prefix_len),
        **fields,
    }
    return validate(document)


def replay(
    rows: list[TrafficRow],
    time_scale: float = 1.0,
    *,
    prefix_len: int | None = None,
    buckets: int = MAX_BUCKETS,
    **fields,
) -> dict:
    """A validated profile document that replays the sample: each request at its own time
    (seconds from the first, times ``time_scale``: 0.5 = twice as fast) with its own sizes
    and prefix group. Warm-up requests draw from the sample's fitted lengths."""
    if not rows:
        raise TrafficError("sample: no rows")
    if rows[0].timestamp is None:
        raise TrafficError("replay: the sample has no timestamps (fit its distributions instead)")
    if len(rows) > MAX_ROWS:
        raise TrafficError(f"replay: at most {MAX_ROWS:,} rows")
    try:
        scale = float(time_scale)
    except (TypeError, ValueError):
        raise TrafficError("replay: time_scale must be a number") from None
    if not scale > 0:
        raise TrafficError("replay: time_scale must be > 0")
    start = rows[0].timestamp
    with_prefix = any(r.prefix_id is not None for r in rows)
    groups: dict[str, int] = {}
    out = []
    for r in rows:
        row = [round(r.timestamp - start, 6), r.input_tokens, r.output_tokens]
        if with_prefix:
            # The load generator's prefix ids are small integers: number them as first seen.
            row.append(None if r.prefix_id is None else groups.setdefault(r.prefix_id, len(groups)))
        out.append(row)
    # Rows without a prefix id use none, whatever the length says.
    prefix = _prefix_fields(rows, prefix_len) if with_prefix else {"prefix_len": 0}
    document = {
        "input_len": histogram([r.input_tokens for r in rows], buckets),
        "output_len": histogram([r.output_tokens for r in rows], buckets),
        **prefix,
        "replay": {"rows": out, "time_scale": scale},
        **fields,
    }
    return validate(document)


# A parsed sample travels between the preview and the save as these compact columns.


def to_columns(rows: list[TrafficRow]) -> dict:
    """The sample as JSON-friendly columns; times become seconds from the first request
    (only gaps matter), to the microsecond."""
    start = rows[0].timestamp if rows else None
    return {
        "t": [round(r.timestamp - start, 6) for r in rows] if start is not None else None,
        "in": [r.input_tokens for r in rows],
        "out": [r.output_tokens for r in rows],
        "prefix": [r.prefix_id for r in rows] if any(r.prefix_id for r in rows) else None,
        "prefix_len": [r.prefix_len for r in rows] if any(r.prefix_len for r in rows) else None,
    }


def from_columns(data: dict) -> list[TrafficRow]:
    """The rows of ``to_columns`` output, checked again like a file's rows."""
    try:
        n = len(data["in"])
        if n > MAX_ROWS:
            raise TrafficError(f"sample: more than {MAX_ROWS:,} rows")
        columns = {
            "timestamp": data.get("t") or [None] * n,
            "input_tokens": data["in"],
            "output_tokens": data["out"],
            "prefix_id": data.get("prefix") or [None] * n,
            "prefix_len": data.get("prefix_len") or [None] * n,
        }
        if any(len(c) != n for c in columns.values()):
            raise TrafficError("sample: columns of different lengths")
    except (KeyError, TypeError) as exc:
        raise TrafficError(f"sample: not a parsed sample ({exc})") from None
    records = (
        {key: column[i] for key, column in columns.items() if column[i] is not None}
        for i in range(n)
    )
    return _sorted([_row(record, i) for i, record in enumerate(records, start=1)])
