"""What every importer of a result file shares (``benchmarks.importers`` and its peers'
readers ``importers_aiperf`` and ``importers_guidellm``): the imported shape, a request log
being built, one request's record in the panel's shape, and the small readers of numbers,
dates and labels. Below all three, so none imports another to reach them."""

from __future__ import annotations

import math
import re
from array import array
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import accumulate

from benchmarks import records as request_records
from benchmarks.loadgen.stats import describe
from benchmarks.metrics import LATENCIES

# A summary key's statistic: mean, median, std or pNN[_N] (the load generator's names).
STATISTIC_KEY = re.compile(
    r"^(mean|median|std|p\d+(?:_\d+)?)_("
    + "|".join(latency.key for latency in LATENCIES)
    + r")_ms$"
)


@dataclass
class Imported:
    """A result file read into the panel's shapes."""

    kind: str  # LOADGEN, VLLM_BENCH, importers_guidellm.GUIDELLM or importers_aiperf.AIPERF
    document: dict  # the load generator's result document, without records
    model: str
    notes: list[str] = field(default_factory=list)
    spec: dict | None = None  # the LoadSpec the load generator ran, when the file says
    date: datetime | None = None  # when the run started, when the file says
    label: str = ""
    panel: dict = field(default_factory=dict)  # what an exporting panel added
    tool: str = ""  # the tool and version that wrote a peer's file ("GuideLLM 0.8.1")
    # From the per-request part, when the file has one (``benchmarks.records``):
    log: bytes | None = None  # the compressed request log, measured requests only
    log_count: int = 0
    distributions: dict | None = None


class _Log:
    """The request log and the distributions, one record at a time."""

    def __init__(self):
        self.writer = request_records.LogWriter()
        self.distributions = request_records.Distributions()
        self.prompt_tokens = 0  # of the successes, for a file without total_input_tokens

    def add(self, record: dict) -> None:
        if record.get("warmup"):
            return
        derived = request_records.derived(record)
        self.writer.add(record, derived)
        self.distributions.add(record, derived)
        if record.get("error_class") is None:
            self.prompt_tokens += int(_number(record.get("prompt_tokens")) or 0)

    def parts(self) -> dict:
        if not self.writer.count:
            return {}
        return {
            "log": self.writer.blob(),
            "log_count": self.writer.count,
            "distributions": self.distributions.result(),
        }


# --- vllm bench serve ---------------------------------------------------------------------


def _vllm_record(i, error, ttft, itls, start, latency, input_len, output, relative) -> dict:
    """One request as the load generator records it (``RequestRecord.to_dict()``)."""
    ok = not error
    gaps = _gaps(itls) if ok else ()
    first = start + ttft if ok and ttft is not None else None
    chunk_times = []
    if first is not None:
        chunk_times = list(accumulate(gaps, initial=first))
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


def _gaps(itls) -> array | list[float]:
    """A request's token gaps in seconds, anything that is not a number left out."""
    try:
        # Made in C: a detailed file has millions of gaps. The parser yields no NaN or
        # infinity, so a list that converts holds numbers only.
        return array("d", itls or ())
    except TypeError:
        return [float(g) for g in itls if _number(g) is not None]


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


def _fill_from_log(doc: dict, log: _Log, data: dict, notes: list[str]) -> None:
    """Percentiles the file does not have (p50/p90/p95, E2EL by default), from its lists."""
    added = []
    for latency in LATENCIES:
        values, scale = log.distributions.collected(latency.key)
        if not values:
            continue
        for key, value in describe(values, latency.key, scale=scale).items():
            if key not in doc and not (isinstance(value, float) and math.isnan(value)):
                doc[key] = value
                added.append(key)
    if added:
        notes.append(
            "statistics not in the file were computed from its per-request lists: "
            + "; ".join(
                f"{latency.label} {', '.join(_statistics(k for k in added if _of(k, latency)))}"
                for latency in LATENCIES
                if any(_of(k, latency) for k in added)
            )
        )
        if not log.distributions.itl_complete and any("_itl_" in k for k in added):
            notes.append(
                f"ITL percentiles were computed from an even sample of "
                f"{len(log.distributions.gaps):,} of its {log.distributions.gaps_total:,} "
                "token gaps"
            )
    if "total_input_tokens" not in data:
        doc["total_input_tokens"] = log.prompt_tokens


# --- helpers ------------------------------------------------------------------------------
def _statistics(keys) -> list[str]:
    """The statistics summary keys name, as a person writes them, in a stable order:
    ``p99_9_ttft_ms`` is p99.9 (not "p99": the statistic's own underscore is a point)."""
    found = set()
    for key in keys:
        match = STATISTIC_KEY.match(key)
        if match:
            found.add(match.group(1).replace("_", "."))
    order = {"mean": -3.0, "median": -2.0, "std": -1.0}
    return sorted(found, key=lambda s: order[s] if s in order else float(s[1:]))


def _of(key: str, latency) -> bool:
    match = STATISTIC_KEY.match(key)
    return match is not None and match.group(2) == latency.key


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
