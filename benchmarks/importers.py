"""Results produced elsewhere, read into the panel's result document (pure: no Django).

Two kinds of file are read here (GuideLLM's and AIPerf's in ``benchmarks.importers_guidellm``
and ``benchmarks.importers_aiperf``, with this module's helpers):

* the load generator's own JSON (``python -m benchmarks.loadgen --save-result``, or a run
  exported from a panel): ``Result.to_dict()``, per-request ``records`` with
  ``--save-detailed``, a ``panel`` part when a panel exported it;
* ``vllm bench serve --save-result`` JSON (vllm/benchmarks/serve.py): a header (date,
  backend, model_id, num_prompts, request_rate, burstiness, max_concurrency), the summary
  (completed, failed, throughputs, ``{mean,median,std,pNN}_{ttft,tpot,itl,e2el}_ms`` for the
  percentiles asked with ``--metric-percentiles``), and with ``--save-detailed`` per-request
  lists (input_lens, output_lens, ttfts and itls in seconds, errors, start_times in newer
  versions).

Both become what the panel stores: the load generator's document (summary keys at the top
level, named as ``benchmarks.loadgen.stats.summarize`` names them), and from the per-request
part the compressed request log and the latency distributions (``benchmarks.records``).

Files are read as a stream (ijson, the yajl C parser), never whole: a detailed file of a long
run is hundreds of MB, and ``json.load`` of one grew a worker by over a gigabyte. The first
pass keeps the summary and the per-request number lists (as arrays of doubles, one number a
request) and skips the big parts — per-request token gaps (``itls``), generated texts, our own
``records``; the second pass reads those one request at a time, builds each request's record,
adds it to the log and the distributions and drops it. Memory is bounded by the number of
requests, not by the file's size. Both passes report their progress in bytes.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from array import array
from collections.abc import Callable

import ijson

from benchmarks import importers_aiperf, importers_guidellm
from benchmarks.importers_common import (  # noqa: F401 - the importers' names, re-exported
    Imported,
    _date,
    _fill_from_log,
    _label,
    _Log,
    _number,
    _vllm_record,
    json_safe,
)
from benchmarks.metrics import LATENCIES, TTFT
from benchmarks.resultstream import (
    DETAILED,
    DETAILED_EXTRA,
    READ_SIZE,
    Scanned,
    has_non_finite,
    json_error,
    opened,
    scan,
)

LOADGEN = "loadgen"
VLLM_BENCH = "vllm-bench"
# vllm writes p99.9 as "p99.9_ttft_ms"; the load generator as "p99_9_ttft_ms".
PERCENTILE_KEY = re.compile(
    r"^p(\d+(?:[._]\d+)?)_(" + "|".join(latency.key for latency in LATENCIES) + r")_ms$"
)
MAX_TEXT = 500  # longest free-text header value kept from a vllm file (--metadata)


# (what it is doing, bytes read in this pass, share of the whole work): called as it reads.
Progress = Callable[[str, int, float], None]


def read(
    path: str | os.PathLike, progress: Progress | None = None, benchmark: int | None = None
) -> Imported:
    """Read the result file at ``path`` as a stream; ``ValueError`` says what it is not.
    ``progress(what, bytes_read, fraction)`` is called as bytes are read (two passes, each
    half of the work; a file that needs one pass jumps to the end). ``benchmark`` picks one
    benchmark (1-based) of a GuideLLM sweep; None: the first."""
    size = os.path.getsize(path)
    opener = lambda: open(path, "rb")  # noqa: E731, SIM115 - closed by opened
    return _read(opener, size, progress, benchmark)


def parse(data, benchmark: int | None = None) -> Imported:
    """Recognise and read a result file's parsed JSON; ``ValueError`` says what it is not.
    The same reader as ``read`` (the document is written out and streamed back)."""
    if isinstance(data, list):
        raise ValueError(
            "the file holds a list, not one result: import one run at a time "
            "(vllm bench serve --append-result files hold several)"
        )
    if not isinstance(data, dict):
        raise ValueError("not a benchmark result: expected a JSON object")
    body = json.dumps(data).encode()
    return _read(lambda: io.BytesIO(body), len(body), None, benchmark)


def _read(
    opener: Callable[[], io.RawIOBase],
    size: int,
    progress: Progress | None,
    benchmark: int | None = None,
) -> Imported:
    total = 2 * max(size, 1)

    def report(what: str, offset: int):
        if progress is None:
            return None
        return lambda done: progress(what, done, (offset + done) / total)

    non_finite = has_non_finite(opener)
    if importers_aiperf.is_records_file(opener):
        # JSON Lines (one request a line): not one JSON value, so not for ``scan``.
        imported = importers_aiperf.read_records(
            opener, report("reading the file", 0), report("reading the requests", size)
        )
        if progress:
            progress("read", size, 1.0)
        return imported
    with opened(opener, non_finite, report("reading the file", 0)) as (stream, counted):
        scanned = scan(stream, counted)

    def reopen(what: str):
        return opened(opener, non_finite, report(what, size))

    def second_pass(prefix: str):
        with reopen("reading the per-request lists") as (stream, counted):
            try:
                yield from ijson.items(stream, prefix, buf_size=READ_SIZE, use_float=True)
            except ijson.JSONError as exc:
                raise json_error(exc, counted) from None

    present = scanned.present
    if (
        "spec" in present
        and ("timeline" in present or "stages" in present)
        and ("completed" in present)
    ):
        imported = _loadgen(scanned, second_pass)
    elif "completed" in present and present & {"backend", "endpoint_type", "model_id"}:
        imported = _vllm(scanned, second_pass)
    elif importers_guidellm.recognised(present):
        imported = importers_guidellm.read(scanned, reopen, benchmark)
    elif importers_aiperf.recognised(present):
        imported = importers_aiperf.read_summary(scanned)
    elif "format" in present and "spec" in present:
        raise ValueError("this is a load profile export: import it on the load profiles page")
    else:
        raise ValueError(
            "not a result this panel reads: expected the load generator's JSON (keys spec, "
            "stages, timeline, completed), vllm bench serve --save-result JSON (keys "
            "backend, model_id, completed, mean_ttft_ms, ...), GuideLLM's benchmarks.json "
            "(keys metadata, config, benchmarks) or AIPerf's profile_export_aiperf.json / "
            "profile_export.jsonl"
        )
    if benchmark is not None and imported.kind != importers_guidellm.GUIDELLM:
        raise ValueError("a benchmark number is only for GuideLLM files (they hold several)")
    if progress:
        progress("read", size, 1.0)
    return imported


# --- the load generator's own files -------------------------------------------------------
def _loadgen(scanned: Scanned, second_pass) -> Imported:
    data = scanned.data
    if _number(data.get("completed")) is None:
        raise ValueError("load generator result: 'completed' must be a number")
    spec = json_safe(data["spec"]) if isinstance(data.get("spec"), dict) else None
    panel = json_safe(data["panel"]) if isinstance(data.get("panel"), dict) else {}
    document = {k: v for k, v in data.items() if k not in ("records", "panel")}
    document["notes"] = [str(n) for n in (data.get("notes") or []) if n]
    document.setdefault("stages", {})
    document.setdefault("timeline", [])
    document.setdefault("server", {"available": False})
    if not isinstance(document["stages"], dict) or not isinstance(document["timeline"], list):
        raise ValueError("load generator result: 'stages' must be an object, 'timeline' a list")
    notes = []
    log = _Log()
    if scanned.lists.get("records"):
        for record in second_pass("records.item"):
            if not isinstance(record, dict):
                raise ValueError("load generator result: 'records' must be a list of objects")
            log.add(record)
    if not log.writer.count and not panel.get("distributions"):
        notes.append(
            "the file has no per-request records (the CLI writes them with "
            "--save-detailed): no latency distributions or request log"
        )
    model = str(data.get("model_id") or (spec or {}).get("model") or "")
    return Imported(
        kind=LOADGEN,
        document=document,
        model=model,
        notes=notes,
        spec=spec,
        date=_date(data.get("date")),
        label=str(panel.get("label") or "")[:100],
        panel=panel,
        **log.parts(),
    )


def _vllm(scanned: Scanned, second_pass) -> Imported:
    data = scanned.data
    notes = ["vllm bench serve files carry no per-second timeline and no engine metrics"]
    completed = _number(data.get("completed"))
    if completed is None:
        raise ValueError("vllm bench serve result: 'completed' must be a number")
    doc = _vllm_summary(data)
    _vllm_counts(doc, data, int(completed), notes)
    backend = str(data.get("backend") or data.get("endpoint_type") or "")
    doc.setdefault("endpoint", "/v1/chat/completions" if "chat" in backend else "/v1/completions")
    log = _vllm_log(scanned, second_pass, notes)
    if log is not None:
        _fill_from_log(doc, log, data, notes)
    else:
        notes.append(
            "the file has no per-request lists (vllm bench serve --save-detailed): no latency "
            "distributions or request log"
        )
        if TTFT.summary_key(95) not in doc:
            notes.append(
                "p95 latencies are not in the file (vllm bench serve writes p99 unless "
                "--metric-percentiles asks for more)"
            )
    doc["stages"] = {}
    doc["timeline"] = []
    doc["server"] = {"available": False, "error": "not recorded by vllm bench serve"}
    doc["notes"] = []
    doc["spec"] = None
    return Imported(
        kind=VLLM_BENCH,
        document=doc,
        model=str(data.get("model_id") or ""),
        notes=notes,
        spec=None,
        date=_date(data.get("date")),
        label=str(data.get("label") or "")[:100],
        **(log.parts() if log is not None else {}),
    )


def _vllm_summary(data: dict) -> dict:
    """The file's scalar values: percentiles renamed as the load generator names them
    (p99.9 → p99_9), text cut short, per-request lists and other tools' objects left out."""
    doc: dict = {}
    for key, value in data.items():
        if key in DETAILED or key in DETAILED_EXTRA:
            continue
        match = PERCENTILE_KEY.match(key)
        if match:
            p = float(match.group(1).replace("_", "."))
            doc[f"p{_label(p)}_{match.group(2)}_ms"] = value
        elif isinstance(value, str):
            doc[key] = value[:MAX_TEXT]
        elif value is None or isinstance(value, bool | int | float):
            doc[key] = value
        # lists and objects of other tools' extensions are not kept
    return doc


def _vllm_counts(doc: dict, data: dict, completed: int, notes: list[str]) -> None:
    """Succeeded, failed (counted from num_prompts when the file has no count), the error
    rate, and the share of requests meeting the goodput SLOs when the file measured it."""
    num_prompts = _number(data.get("num_prompts"))
    failed = _number(data.get("failed"))
    if failed is None:
        failed = max(int(num_prompts) - completed, 0) if num_prompts is not None else 0
        notes.append("failed requests = num_prompts − completed (the file does not count them)")
    failed = int(failed)
    doc["completed"], doc["failed"] = completed, failed
    measured = completed + failed
    doc["error_rate"] = failed / measured if measured else 0.0
    doc["num_prompts"] = measured
    if doc.get("request_goodput") is None:
        doc.pop("request_goodput", None)
    else:
        duration = _number(data.get("duration"))
        if duration and measured:
            doc["goodput_share"] = min(doc["request_goodput"] * duration / measured, 1.0)


def _vllm_log(scanned: Scanned, second_pass, notes: list[str]) -> _Log | None:
    """The request log from vllm's detailed lists (all the same length: one entry per
    request, failures included), or None when the file has none or they disagree. The
    token gaps (``itls``) are read in the second pass, one request at a time."""
    ttfts = scanned.numbers.get("ttfts")
    if ttfts is None or not scanned.lists.get("itls") or not ttfts.values:
        return None
    n = len(ttfts.values)
    input_lens = scanned.number_list("input_lens", n)
    output_lens = scanned.number_list("output_lens", n)
    if input_lens is False or output_lens is False:
        notes.append("the per-request lists have different lengths: they were not imported")
        return None
    errors = scanned.errors.values if scanned.errors is not None else None
    if errors is not None and not errors:
        errors = None  # an empty list, as vllm writes without --save-detailed: all ok
    elif (errors is None and scanned.data.get("errors")) or (errors and len(errors) != n):
        errors = None
        notes.append("the per-request errors do not line up with the requests: all are taken as ok")
    sent, relative = _send_times(scanned, n, notes)
    latencies = _latencies(scanned, n, notes)
    log = _Log()
    count = 0
    for i, gaps in enumerate(second_pass("itls.item")):
        count += 1
        if count > n:
            break
        log.add(
            _vllm_record(
                i,
                errors[i] if errors is not None else "",
                _value(ttfts.values[i]),
                gaps if isinstance(gaps, list) else [],
                sent[i] if sent is not None else 0.0,
                _value(latencies[i]) if latencies is not None else None,
                _value(input_lens[i]) if input_lens is not None else None,
                _value(output_lens[i]) if output_lens is not None else None,
                relative,
            )
        )
    if count != n:
        notes.append("the per-request lists have different lengths: they were not imported")
        return None
    return log


def _value(number: float) -> float | None:
    return None if math.isnan(number) else number


def _send_times(scanned: Scanned, n: int, notes: list[str]) -> tuple[array | None, bool]:
    """Each request's send time from the first's, and whether they are unknown (then every
    request counts from its own send: ``relative_times``; None stands for all zeros)."""
    starts = scanned.numbers.get("start_times")
    if starts is not None and len(starts.values) == n and starts.all_numbers:
        t0 = min(starts.values)
        return array("d", (s - t0 for s in starts.values)), False
    notes.append("the file has no send times: the request log has no scheduled/sent times")
    return None, True


def _latencies(scanned: Scanned, n: int, notes: list[str]) -> array | None:
    found = scanned.numbers.get("e2els")
    if found is None or not found.values:
        found = scanned.numbers.get("latencies")
    if found is not None and len(found.values) == n:
        return found.values
    notes.append(
        "end-to-end latency per request is TTFT + the sum of its inter-token gaps "
        "(the file has no per-request latency)"
    )
    return None


def comparable_spec(spec: dict | None) -> dict | None:
    """A LoadSpec dict reduced to the load it describes (not where it was aimed, nor how the
    client was run), numbers as floats, so two specs of the same load compare equal."""
    if not isinstance(spec, dict) or spec.get("trace"):
        return None
    drop = {
        "base_url",
        "model",
        "api_key",
        "ready_timeout_s",
        "record_requests",
        "scrape_metrics",
        "metrics_interval_s",
        "min_requests_for_error_rate",
        "trace",
    }

    def canon(value):
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, str):
            return float(value) if value in ("inf", "-inf") else value
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, dict):
            return {k: canon(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [canon(v) for v in value]
        return value

    reduced = {k: canon(v) for k, v in json_safe(spec).items() if k not in drop}
    dataset = reduced.get("dataset")
    if isinstance(dataset, dict):
        dataset.pop("tokenizer", None)
        # A spec written before the key existed counted its prefix within the input (the
        # former rule); without a prefix the rule changes nothing.
        within = dataset.get("prefix_within_input", bool(dataset.get("prefix_len")))
        dataset["prefix_within_input"] = bool(within) and bool(dataset.get("prefix_len"))
    return reduced
