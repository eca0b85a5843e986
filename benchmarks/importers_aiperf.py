"""AIPerf's results read into the panel's result document (pure: no Django).

Two files of an ``aiperf profile`` run (AIPerf 0.13.0) are understood, each on its own:

* ``profile_export_aiperf.json``, the summary (aiperf/common/models/export_models.py
  ``JsonExportData``, schema 1.4, written by exporters/metrics_json_exporter.py): one
  ``{unit, avg, p1 … p99, min, max, std, count}`` object a metric, the run's ``input_config``,
  ``error_summary``; no per-request data;
* ``profile_export.jsonl``, one request a line (``metadata`` with ``request_start_ns`` /
  ``request_end_ns`` / ``benchmark_phase``, ``metrics`` as ``{value, unit}``, ``error``): the
  request log and every statistic are computed here from it, as for our own detailed files.

What AIPerf's names mean (aiperf/metrics/types/) and what they become:

* ``time_to_first_token`` (first response − request start): our TTFT;
* ``request_latency``: our E2EL;
* ``inter_chunk_latency``, the gaps between streamed chunks, pooled over every gap of every
  request: our ITL (we also pool chunk gaps);
* ``inter_token_latency`` = (request latency − TTFT) / (output tokens − 1), one value a
  request: our TPOT (same formula) — not our ITL, whatever the name says;
* ``request_count`` counts the successful requests, ``error_request_count`` the failed ones.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import ijson

from benchmarks import importers_common as base
from benchmarks.resultstream import READ_SIZE, opened

AIPERF = "aiperf"
# Their metric → our latency key.
LATENCY_NAMES = {
    "time_to_first_token": "ttft",
    "request_latency": "e2el",
    "inter_chunk_latency": "itl",
    "inter_token_latency": "tpot",
}
PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)
SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "sec": 1.0, "s": 1.0}
MAX_LINE = 16 * 2**20  # one request's line; a longer one is not an AIPerf record


def recognised(present: set[str]) -> bool:
    """AIPerf's summary: its version stamp, or the schema version with its input config."""
    return "aiperf_version" in present or {"schema_version", "input_config"} <= present


# --- profile_export_aiperf.json -------------------------------------------------------------
def read_summary(scanned) -> base.Imported:
    data = scanned.data
    version = str(data.get("aiperf_version") or "?")
    notes = [
        f"read as an AIPerf {version} profile_export_aiperf.json (schema "
        f"{data.get('schema_version') or '?'}): the summary only",
        "the per-request records are in profile_export.jsonl next to it: import that file "
        "instead for latency distributions and the request log",
    ]
    completed = _avg(data, "request_count")
    if completed is None:
        raise ValueError("AIPerf summary: 'request_count' must hold a number ('avg')")
    failed = _avg(data, "error_request_count") or 0.0
    doc: dict = {"completed": int(completed), "failed": int(failed)}
    measured = doc["completed"] + doc["failed"]
    doc["error_rate"] = doc["failed"] / measured if measured else 0.0
    doc["num_prompts"] = measured
    doc["duration"] = _avg(data, "benchmark_duration")
    for theirs, ours in (
        ("request_throughput", "request_throughput"),
        ("output_token_throughput", "output_throughput"),
        ("total_token_throughput", "total_token_throughput"),
    ):
        if _avg(data, theirs) is not None:
            doc[ours] = _avg(data, theirs)
    # The server's counts (usage) when AIPerf has them, as our own runs count; else AIPerf's
    # tokenizer's count of the text.
    for ours, usage, counted in (
        ("total_input_tokens", "total_usage_prompt_tokens", "total_isl"),
        ("total_output_tokens", "total_usage_completion_tokens", "total_osl"),
    ):
        value = _avg(data, usage)
        if value is None:
            value = _avg(data, counted)
            if value is not None:
                notes.append(f"{ours} is AIPerf's tokenizer's count ({counted}), not the server's")
        if value is not None:
            doc[ours] = int(value)
    for theirs, ours in LATENCY_NAMES.items():
        doc.update(_statistics(data.get(theirs), ours))
    if data.get("was_cancelled"):
        doc["cancelled"] = True
    if data.get("is_complete") is False:
        notes.append(f"AIPerf says the run is incomplete: {data.get('incomplete_reason') or '?'}")
    notes.append(
        "AIPerf's inter_token_latency (one value a request) is stored as TPOT, its "
        "inter_chunk_latency (every gap) as ITL; its other metrics (time to second token, "
        "per-user throughput, HTTP timings, concurrency) are not kept"
    )
    notes.append("AIPerf files carry no per-second timeline and no engine metrics here")
    config = data.get("input_config") if isinstance(data.get("input_config"), dict) else {}
    _finish(doc, config)
    return base.Imported(
        kind=AIPERF,
        document=base.json_safe(doc),
        model=_model(config),
        notes=notes,
        date=base._date(data.get("start_time")),
        label="aiperf",
        tool=f"AIPerf {version}",
    )


def _avg(data: dict, name: str) -> float | None:
    found = data.get(name)
    return base._number(found.get("avg")) if isinstance(found, dict) else None


def _statistics(found, ours: str) -> dict:
    if not isinstance(found, dict) or not base._number(found.get("count")):
        return {}
    scale = SECONDS.get(str(found.get("unit") or "ms"))
    if scale is None:
        return {}
    scale *= 1000.0  # to ms
    out = {}
    for theirs, name in (("avg", "mean"), ("p50", "median"), ("std", "std")):
        if base._number(found.get(theirs)) is not None:
            out[f"{name}_{ours}_ms"] = found[theirs] * scale
    for p in PERCENTILES:
        if base._number(found.get(f"p{p}")) is not None:
            out[f"p{p}_{ours}_ms"] = found[f"p{p}"] * scale
    return out


def _model(config: dict) -> str:
    models = config.get("models")
    if isinstance(models, dict):  # schema 1.4: {"items": [{"name": ...}]}
        items = models.get("items") or []
        if items and isinstance(items[0], dict):
            return str(items[0].get("name") or "")
    if isinstance(models, list) and models:
        return str(models[0])
    return str(config.get("model") or "")


def _finish(doc: dict, config: dict) -> None:
    endpoint = config.get("endpoint") if isinstance(config.get("endpoint"), dict) else {}
    kind = str(endpoint.get("type") or "chat")
    doc["endpoint"] = "/v1/completions" if kind == "completions" else "/v1/chat/completions"
    for phase in config.get("phases") or []:
        if isinstance(phase, dict) and phase.get("kind", "profiling") == "profiling":
            if phase.get("concurrency") is not None:
                doc["max_concurrency"] = phase["concurrency"]
            if phase.get("rate") is not None:
                doc["request_rate"] = phase["rate"]
    doc["stages"], doc["timeline"], doc["notes"], doc["spec"] = {}, [], [], None
    doc["server"] = {"available": False, "error": "not recorded by AIPerf"}


# --- profile_export.jsonl -------------------------------------------------------------------
def is_records_file(opener) -> bool:
    """Whether the file is AIPerf's per-request JSON Lines: the first object's ``metadata``
    has the request's ``request_start_ns`` (no other format read here has it). Parsed as a
    stream and left as soon as that is known, so a file of one huge line is not held."""
    try:
        with opener() as raw:
            if raw.read(3) != b"\xef\xbb\xbf":
                raw.seek(0)
            events = ijson.basic_parse(raw, buf_size=READ_SIZE, multiple_values=True)
            path: list = []  # the keys down to here: a record's metadata is one level down
            for event, value in events:
                if event in ("start_map", "start_array"):
                    path.append(None)
                    if len(path) > 2:
                        # Deeper than a record's metadata key: not what we look for (and a
                        # file nested 100,000 deep must not make us build its path).
                        return False
                    continue
                if event in ("end_map", "end_array"):
                    path.pop()
                    if not path:
                        return False  # the first value ended without request metadata
                    continue
                if event == "map_key":
                    path[-1] = value
                    if path == ["metadata", "request_start_ns"]:
                        return True
                    continue
                if not path:
                    return False  # a bare number or string: not ours
    except ijson.JSONError:
        return False  # not JSON at all: the JSON reader says so
    return False


def _is_record(value) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("metadata"), dict)
        and "request_start_ns" in value["metadata"]
        and ("metrics" in value or "error" in value)
    )


def _lines(opener, report):
    """The file's lines as parsed JSON, one at a time (``report``: the bytes-read callback)."""
    with opened(opener, False, report) as (stream, _counted):
        buffer, number = b"", 0
        while True:
            chunk = stream.read(READ_SIZE)
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            if len(buffer) > MAX_LINE:
                raise ValueError(
                    f"AIPerf records: line {number + len(lines) + 1:,} is over "
                    f"{MAX_LINE // 2**20} MiB: not a record"
                )
            if not chunk:
                lines.append(buffer)
            for line in lines:
                number += 1
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except ValueError as exc:
                    raise ValueError(
                        f"AIPerf records: line {number:,} is not JSON: {exc}"
                    ) from None
                if not _is_record(value):
                    raise ValueError(f"AIPerf records: line {number:,} is not a request record")
                yield value
            if not chunk:
                return


def read_records(opener, first_report, second_report) -> base.Imported:
    """Two passes, as for our own files: the first finds when the first request was sent
    (lines come in completion order), the second makes each line a request record. Python's
    json reads the NaN and Infinity AIPerf may write, so no conversion is needed."""
    t0 = None
    for value in _lines(opener, first_report):
        start = base._number(value["metadata"].get("request_start_ns"))
        if start is not None and (t0 is None or start < t0):
            t0 = start
    if t0 is None:
        raise ValueError("AIPerf records: no request has a request_start_ns")
    log = base._Log()
    totals = _Totals()
    usage_counts = True
    for value in _lines(opener, second_report):
        record, from_usage = _record(value, log.writer.count, t0)
        usage_counts = usage_counts and (from_usage or record["error_class"] is not None)
        log.add(record)
        totals.add(record)
    if not log.writer.count:
        raise ValueError("AIPerf records: every line is a warm-up request: nothing measured")
    notes = [
        "read as AIPerf's profile_export.jsonl (one request a line): every statistic here is "
        "computed from its records; the file names no model"
    ]
    if not usage_counts:
        notes.append(
            "some output token counts are AIPerf's tokenizer's count of the text "
            "(output_sequence_length), not the server's (run AIPerf with "
            "--use-server-token-count to have the server's)"
        )
    notes.append(
        "AIPerf's inter_chunk_latency gaps are the ITL; TPOT is (latency − TTFT) / "
        "(output tokens − 1), as AIPerf's inter_token_latency"
    )
    notes.append("AIPerf files carry no per-second timeline and no engine metrics here")
    doc = totals.document()
    base._fill_from_log(doc, log, {}, notes)
    _finish(doc, {})
    return base.Imported(
        kind=AIPERF,
        document=base.json_safe(doc),
        model="",
        notes=notes,
        date=datetime.fromtimestamp(t0 / 1e9, UTC),
        label="aiperf",
        tool="AIPerf (records)",  # the records file does not say which version wrote it
        **log.parts(),
    )


def _record(value: dict, index: int, t0: float) -> tuple[dict, bool]:
    meta, metrics = value["metadata"], value.get("metrics") or {}
    start = (base._number(meta.get("request_start_ns")) or t0) - t0
    error = value.get("error")
    text = ""
    if isinstance(error, dict):
        text = f"{error.get('code') or ''} {error.get('type') or ''}: {error.get('message') or ''}"
        text = text.strip() or "error"
    elif error:
        text = str(error)
    elif meta.get("was_cancelled"):
        text = "cancelled"
    output = _value(metrics, "usage_completion_tokens", count=True)
    from_usage = output is not None
    if output is None:
        output = _value(metrics, "output_sequence_length", count=True)
    prompt = _value(metrics, "usage_prompt_tokens", count=True)
    if prompt is None:
        prompt = _value(metrics, "input_sequence_length", count=True)
    latency = _value(metrics, "request_latency")
    if latency is None and base._number(meta.get("request_end_ns")) is not None:
        latency = (meta["request_end_ns"] - meta["request_start_ns"]) / 1e9
    gaps = metrics.get("inter_chunk_latency") or {}
    scale = SECONDS.get(str(gaps.get("unit") or "ms"), 1e-3)
    values = gaps.get("value") if isinstance(gaps.get("value"), list) else []
    record = base._vllm_record(
        index,
        text,
        _value(metrics, "time_to_first_token"),
        [g * scale for g in values if base._number(g) is not None],
        start / 1e9,
        latency,
        prompt,
        output,
        False,
    )
    record["warmup"] = meta.get("benchmark_phase") == "warmup"
    return record, from_usage


def _value(metrics: dict, name: str, count: bool = False) -> float | None:
    """A metric of one request: a count as it is, a time in seconds."""
    found = metrics.get(name)
    if not isinstance(found, dict):
        return None
    value = base._number(found.get("value"))
    if value is None or count:
        return value
    scale = SECONDS.get(str(found.get("unit") or "ms"))
    return value * scale if scale is not None else None


class _Totals:
    """The counts and throughputs of the measured requests, one record at a time."""

    def __init__(self):
        self.completed = self.failed = 0
        self.tokens_in = self.tokens_out = 0
        self.first = self.last = None

    def add(self, record: dict) -> None:
        if record["warmup"]:
            return
        if record["error_class"] is None:
            self.completed += 1
            self.tokens_in += record["prompt_tokens"] or 0
            self.tokens_out += record["output_tokens"] or 0
        else:
            self.failed += 1
        start, end = record["sent"], record["end"]
        self.first = start if self.first is None else min(self.first, start)
        self.last = end if self.last is None else max(self.last, end)

    def document(self) -> dict:
        measured = self.completed + self.failed
        duration = (self.last - self.first) if self.first is not None else 0.0
        doc = {
            "completed": self.completed,
            "failed": self.failed,
            "error_rate": self.failed / measured if measured else 0.0,
            "num_prompts": measured,
            "duration": duration,
            "total_input_tokens": self.tokens_in,
            "total_output_tokens": self.tokens_out,
        }
        if duration > 0:
            doc["request_throughput"] = self.completed / duration
            doc["output_throughput"] = self.tokens_out / duration
            doc["total_token_throughput"] = (self.tokens_in + self.tokens_out) / duration
        return doc
