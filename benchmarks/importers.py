"""Results produced elsewhere, read into the panel's result document (pure: no Django).

Two kinds of file are understood:

* the load generator's own JSON (``python -m benchmarks.loadgen --save-result``, or a run
  exported from a panel): ``Result.to_dict()``, per-request ``records`` with
  ``--save-detailed``, a ``panel`` part when a panel exported it;
* ``vllm bench serve --save-result`` JSON (vllm/benchmarks/serve.py): a header (date,
  backend, model_id, num_prompts, request_rate, burstiness, max_concurrency), the summary
  (completed, failed, throughputs, ``{mean,median,std,pNN}_{ttft,tpot,itl,e2el}_ms`` for the
  percentiles asked with ``--metric-percentiles``), and with ``--save-detailed`` per-request
  lists (input_lens, output_lens, ttfts and itls in seconds, errors, start_times in newer
  versions).

Both become what ``benchmarks.services.results.store_results`` takes: the load generator's
document (summary keys at the top level, named as ``benchmarks.loadgen.stats.summarize``
names them) plus per-request records shaped like ``RequestRecord.to_dict()``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from benchmarks.loadgen.stats import describe
from benchmarks.metrics import LATENCIES, TTFT

LOADGEN = "loadgen"
VLLM_BENCH = "vllm-bench"
# vllm writes p99.9 as "p99.9_ttft_ms"; the load generator as "p99_9_ttft_ms".
PERCENTILE_KEY = re.compile(
    r"^p(\d+(?:[._]\d+)?)_(" + "|".join(latency.key for latency in LATENCIES) + r")_ms$"
)
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
MAX_TEXT = 500  # longest free-text header value kept from a vllm file (--metadata)


@dataclass
class Imported:
    """A result file read into the panel's shapes."""

    kind: str  # LOADGEN or VLLM_BENCH
    document: dict  # the load generator's result document, without records
    records: list[dict] | None  # RequestRecord.to_dict()-shaped, measured requests only
    model: str
    notes: list[str] = field(default_factory=list)
    spec: dict | None = None  # the LoadSpec the load generator ran, when the file says
    date: datetime | None = None  # when the run started, when the file says
    label: str = ""
    panel: dict = field(default_factory=dict)  # what an exporting panel added


def parse(data) -> Imported:
    """Recognise and read a result file's parsed JSON; ``ValueError`` says what it is not."""
    if isinstance(data, list):
        raise ValueError(
            "the file holds a list, not one result: import one run at a time "
            "(vllm bench serve --append-result files hold several)"
        )
    if not isinstance(data, dict):
        raise ValueError("not a benchmark result: expected a JSON object")
    if "spec" in data and ("timeline" in data or "stages" in data) and "completed" in data:
        return _loadgen(data)
    if "completed" in data and ("backend" in data or "endpoint_type" in data or "model_id" in data):
        return _vllm(data)
    if "format" in data and "spec" in data:
        raise ValueError("this is a load profile export: import it on the load profiles page")
    raise ValueError(
        "not a result this panel reads: expected the load generator's JSON (keys spec, "
        "stages, timeline, completed) or vllm bench serve --save-result JSON (keys backend, "
        "model_id, completed, mean_ttft_ms, ...)"
    )


# --- the load generator's own files -------------------------------------------------------
def _loadgen(data: dict) -> Imported:
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
    records = data.get("records")
    notes = []
    if isinstance(records, list) and records:
        if not all(isinstance(r, dict) for r in records):
            raise ValueError("load generator result: 'records' must be a list of objects")
        records = [r for r in records if not r.get("warmup")]
    else:
        records = None
        if not panel.get("distributions"):
            notes.append(
                "the file has no per-request records (the CLI writes them with "
                "--save-detailed): no latency distributions or request log"
            )
    model = str(data.get("model_id") or (spec or {}).get("model") or "")
    return Imported(
        kind=LOADGEN,
        document=document,
        records=records,
        model=model,
        notes=notes,
        spec=spec,
        date=_date(data.get("date")),
        label=str(panel.get("label") or "")[:100],
        panel=panel,
    )


# --- vllm bench serve ---------------------------------------------------------------------
def _vllm(data: dict) -> Imported:
    notes = ["vllm bench serve files carry no per-second timeline and no engine metrics"]
    completed = _number(data.get("completed"))
    if completed is None:
        raise ValueError("vllm bench serve result: 'completed' must be a number")
    doc = _vllm_summary(data)
    _vllm_counts(doc, data, int(completed), notes)
    backend = str(data.get("backend") or data.get("endpoint_type") or "")
    doc.setdefault("endpoint", "/v1/chat/completions" if "chat" in backend else "/v1/completions")
    records = _vllm_records(data, notes)
    if records:
        _fill_from_records(doc, records, data, notes)
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
        records=records,
        model=str(data.get("model_id") or ""),
        notes=notes,
        spec=None,
        date=_date(data.get("date")),
        label=str(data.get("label") or "")[:100],
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


def _vllm_records(data: dict, notes: list[str]) -> list[dict] | None:
    """Per-request records from vllm's detailed lists (all the same length: one entry per
    request, failures included), or None when the file has none or they disagree."""
    ttfts, itls = data.get("ttfts"), data.get("itls")
    if not isinstance(ttfts, list) or not isinstance(itls, list) or not ttfts:
        return None
    n = len(ttfts)
    input_lens = data.get("input_lens") or [None] * n
    output_lens = data.get("output_lens") or [None] * n
    errors = data.get("errors") or [""] * n
    if not all(isinstance(x, list) and len(x) == n for x in (itls, input_lens, output_lens)):
        notes.append("the per-request lists have different lengths: they were not imported")
        return None
    if not isinstance(errors, list) or len(errors) != n:
        errors = [""] * n
        notes.append("the per-request errors do not line up with the requests: all are taken as ok")
    sent, relative = _send_times(data, n, notes)
    latencies = _latencies(data, n, notes)
    return [
        _vllm_record(
            i,
            errors[i],
            _number(ttfts[i]),
            itls[i],
            sent[i],
            _number(latencies[i]) if latencies is not None else None,
            input_lens[i],
            _number(output_lens[i]),
            relative,
        )
        for i in range(n)
    ]


def _send_times(data: dict, n: int, notes: list[str]) -> tuple[list[float], bool]:
    """Each request's send time from the first's, and whether they are unknown (then every
    request counts from its own send: ``relative_times``)."""
    starts = data.get("start_times")
    if (
        isinstance(starts, list)
        and len(starts) == n
        and all(_number(s) is not None for s in starts)
    ):
        t0 = min(float(s) for s in starts)
        return [float(s) - t0 for s in starts], False
    notes.append("the file has no send times: the request log has no scheduled/sent times")
    return [0.0] * n, True


def _latencies(data: dict, n: int, notes: list[str]) -> list | None:
    latencies = data.get("e2els") or data.get("latencies")
    if isinstance(latencies, list) and len(latencies) == n:
        return latencies
    notes.append(
        "end-to-end latency per request is TTFT + the sum of its inter-token gaps "
        "(the file has no per-request latency)"
    )
    return None


def _vllm_record(i, error, ttft, itls, start, latency, input_len, output, relative) -> dict:
    """One request as the load generator records it (``RequestRecord.to_dict()``)."""
    ok = not error
    gaps = [g for g in (itls or []) if _number(g) is not None] if ok else []
    first = start + ttft if ok and ttft is not None else None
    chunk_times = []
    if first is not None:
        chunk_times = [first]
        for gap in gaps:
            chunk_times.append(chunk_times[-1] + float(gap))
    if latency is not None:
        end = start + latency
    elif chunk_times:
        end = chunk_times[-1]
    else:
        end = start
    return {
        "index": i,
        "stage": "main",
        "warmup": False,
        "input_len": int(_number(input_len) or 0),
        "max_tokens": None,
        "prompt_tokens": int(_number(input_len)) if input_len is not None else None,
        "output_tokens": int(output) if ok and output is not None else 0,
        "token_source": "usage",
        "scheduled": start,
        "sent": start,
        "first_token": first,
        "end": end,
        "chunk_times": chunk_times,
        "status": 200 if ok else None,
        "error_class": None if ok else _error_class(str(error)),
        "error": "" if ok else str(error)[:200],
        "prefix_id": None,
        "relative_times": relative,
    }


def _error_class(text: str) -> str:
    lowered = text.lower()
    if "timeout" in lowered or "timed out" in lowered:
        return "timeout"
    if "connect" in lowered:
        return "connection"
    match = re.search(r"\b([45]\d\d)\b", text)
    if match:
        return f"http_{match.group(1)[0]}xx"
    return "error"


def _fill_from_records(doc: dict, records: list[dict], data: dict, notes: list[str]) -> None:
    """Percentiles the file does not have (p50/p90/p95, E2EL by default), from its lists."""
    ok = [r for r in records if r["error_class"] is None]
    values = {
        "ttft": [r["first_token"] - r["sent"] for r in ok if r["first_token"] is not None],
        "tpot": [
            (r["end"] - r["first_token"]) / (r["output_tokens"] - 1)
            for r in ok
            if r["first_token"] is not None and r["output_tokens"] >= 2
        ],
        "itl": [
            b - a for r in ok for a, b in zip(r["chunk_times"], r["chunk_times"][1:], strict=False)
        ],
        "e2el": [r["end"] - r["sent"] for r in ok],
    }
    added = []
    for metric, seconds in values.items():
        if not seconds:
            continue
        for key, value in describe(seconds, metric).items():
            if key not in doc and not (isinstance(value, float) and math.isnan(value)):
                doc[key] = value
                added.append(key)
    if added:
        shown = sorted({k.split("_", 1)[0] for k in added})
        notes.append(
            f"{', '.join(shown)} percentiles not in the file were computed from its "
            "per-request lists"
        )
    if "total_input_tokens" not in data:
        doc["total_input_tokens"] = sum(r["prompt_tokens"] or 0 for r in ok)


# --- helpers ------------------------------------------------------------------------------
def _label(p: float) -> str:
    return f"{p:g}".replace(".", "_")


def _number(value) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _date(value) -> datetime | None:
    """The run's start: ISO 8601 (the load generator) or %Y%m%d-%H%M%S (vllm, local time,
    taken as UTC since the file does not say)."""
    if not isinstance(value, str) or not value:
        return None
    for parse in (datetime.fromisoformat, lambda v: datetime.strptime(v, "%Y%m%d-%H%M%S")):
        try:
            moment = parse(value)
        except ValueError:
            continue
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return None


def json_safe(value):
    """``value`` with the floats JSON cannot hold (PostgreSQL's jsonb refuses them) made
    text: an infinite request rate stays "inf", a NaN becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


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
    return reduced
