"""Per-request records → the summary experts read (names as `vllm bench serve` writes them)."""

from __future__ import annotations

import json
import math
import re
from collections import deque
from dataclasses import dataclass, field

PERCENTILES = (50, 90, 95, 99, 99.9)
# The causes kept in a summary: a run failing in many different ways lists the most common,
# and counts the rest as one "other" row (its count keeps the table's total true).
MAX_CAUSES = 20


@dataclass(slots=True, eq=False)  # identity semantics: records live in sets
class RequestRecord:
    """Everything measured about one request (seconds on the run's monotonic clock)."""

    index: int
    stage: str
    warmup: bool
    input_len: int  # what the prompt was made for
    max_tokens: int
    scheduled: float  # when the load pattern wanted it sent
    sent: float = math.nan  # when it left (after any client-side queueing)
    first_token: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrival of each token chunk
    end: float = math.nan
    prompt_tokens: int | None = None  # from the server's usage
    output_tokens: int = 0
    token_source: str = "chunks"  # "usage" when the server reported it
    status: int | None = None
    error_class: str | None = None
    error: str = ""
    prefix_id: int | None = None

    @property
    def ok(self) -> bool:
        return self.error_class is None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.sent

    @property
    def e2el(self) -> float:
        return self.end - self.sent

    @property
    def tpot(self) -> float | None:
        if self.first_token is None or self.output_tokens < 2:
            return None
        return (self.end - self.first_token) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        t = self.chunk_times
        return [t[i + 1] - t[i] for i in range(len(t) - 1)]

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "stage": self.stage,
            "warmup": self.warmup,
            "input_len": self.input_len,
            "max_tokens": self.max_tokens,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "token_source": self.token_source,
            "scheduled": self.scheduled,
            "sent": self.sent,
            "first_token": self.first_token,
            "end": self.end,
            "chunk_times": self.chunk_times,
            "status": self.status,
            "error_class": self.error_class,
            "error": self.error,
            "prefix_id": self.prefix_id,
        }


def percentile(ordered: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) on sorted data."""
    if not ordered:
        return math.nan
    k = (len(ordered) - 1) * p / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def describe(values: list[float], name: str, scale: float = 1000.0) -> dict:
    """``mean_/median_/std_/pNN_<name>_ms`` for a list of seconds."""
    ordered = sorted(v * scale for v in values)
    out = {}
    n = len(ordered)
    mean = sum(ordered) / n if n else math.nan
    out[f"mean_{name}_ms"] = mean
    out[f"median_{name}_ms"] = percentile(ordered, 50)
    out[f"std_{name}_ms"] = math.sqrt(sum((v - mean) ** 2 for v in ordered) / n) if n else math.nan
    for p in PERCENTILES:
        label = f"{p:g}".replace(".", "_")
        out[f"p{label}_{name}_ms"] = percentile(ordered, p)
    return out


# The ITL p95's standard error is estimated from batches of whole requests (batch means): a
# request's gaps are not independent (it decodes at one batch size, beside the same neighbours),
# so the count of gaps would make its band far too narrow. Consecutive requests (by send time)
# form each batch, so drifts within the run show as spread between batches. At most this many
# batches, of at least ITL_BATCH_MIN requests each; fewer than ITL_BATCHES_MIN batches: no
# estimate.
ITL_BATCHES = 20
ITL_BATCH_MIN = 5
ITL_BATCHES_MIN = 5


def itl_p95_standard_error(ok: list[RequestRecord]) -> float | None:
    """The standard error (ms) of the run's pooled ITL p95, or None with too few requests
    with gaps: the p95 of each batch's pooled gaps, their standard deviation over
    √batches (a quantile estimate's variance falls as 1/n, and a batch holds 1/k of the run).
    Pure; ``changes.verdict`` turns it into the noise band a change's ITL is judged within."""
    with_gaps = sorted((r for r in ok if len(r.chunk_times) > 1), key=lambda r: (r.sent, r.index))
    k = min(ITL_BATCHES, len(with_gaps) // ITL_BATCH_MIN)
    if k < ITL_BATCHES_MIN:
        return None
    size = len(with_gaps) / k
    p95s = []
    for b in range(k):
        batch = with_gaps[round(b * size) : round((b + 1) * size)]
        p95s.append(percentile(sorted(x * 1000 for r in batch for x in r.itls), 95))
    mean = sum(p95s) / k
    sd = math.sqrt(sum((v - mean) ** 2 for v in p95s) / (k - 1))
    return sd / math.sqrt(k)


def meets_slo(record: RequestRecord, slo: dict[str, float]) -> bool:
    """Goodput: every given bound (ms) holds for this request."""
    checks = {
        "ttft": record.ttft,
        "tpot": record.tpot,
        "e2el": record.e2el,
        "itl": max(record.itls) if record.itls else None,
    }
    for key, bound in slo.items():
        value = checks[key]
        if value is not None and value * 1000 > bound:
            return False
    return True


def summarize(records: list[RequestRecord], slo: dict[str, float] | None = None) -> dict:
    """The result document's headline numbers for the measured (non-warm-up) requests."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok]
    if measured:
        start = min(r.sent if not math.isnan(r.sent) else r.scheduled for r in measured)
        end = (
            max(r.end for r in measured if not math.isnan(r.end))
            if any(not math.isnan(r.end) for r in measured)
            else start
        )
    else:
        start = end = 0.0
    duration = max(end - start, 1e-9)
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens if r.prompt_tokens is not None else r.input_len for r in ok)
    errors: dict[str, int] = {}
    for r in failed:
        errors[r.error_class] = errors.get(r.error_class, 0) + 1
    result = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(failed),
        "error_rate": len(failed) / len(measured) if measured else 0.0,
        "errors_by_class": errors,
        "errors_by_cause": errors_by_cause(failed),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "token_count_source": _token_source(ok),
    }
    if slo:
        good = [r for r in ok if meets_slo(r, slo)]
        result["request_goodput"] = len(good) / duration
        result["goodput_share"] = len(good) / len(measured) if measured else 0.0
    result.update(describe([r.ttft for r in ok if r.ttft is not None], "ttft"))
    result.update(describe([r.tpot for r in ok if r.tpot is not None], "tpot"))
    result.update(describe([x for r in ok for x in r.itls], "itl"))
    result["p95_itl_se_ms"] = itl_p95_standard_error(ok)
    result.update(describe([r.e2el for r in ok], "e2el"))
    # Latency from the *scheduled* time shows what client-side queueing (or a server that
    # stalls the sender) hides: coordinated omission.
    result.update(
        describe([r.first_token - r.scheduled for r in ok if r.first_token], "ttft_from_scheduled")
    )
    result.update(
        describe([r.sent - r.scheduled for r in measured if not math.isnan(r.sent)], "client_queue")
    )
    result.update(chunk_health(ok))
    result["max_concurrent_requests"] = _max_concurrency(measured)
    result["max_output_tokens_per_s"] = _max_tokens_per_second(ok)
    return result


# --- why requests failed ------------------------------------------------------------------------
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_JSON_MESSAGE = re.compile(r'"message"\s*:\s*"((?:[^"\\]|\\.)*)')


def error_message(error: str) -> str:
    """The human part of a failed request's error: the engine's JSON ``message`` when its
    body has one (vLLM and SGLang answer ``{"object": "error", "message": ...}``; the body may
    be cut at 300 bytes, so a regex backs up the JSON parser), else the text as it is."""
    head, _, body = error.partition(": ")
    if not body.lstrip().startswith("{"):
        return error.strip()
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        inner = data.get("error") if isinstance(data.get("error"), dict) else data
        if isinstance(inner.get("message"), str) and inner["message"].strip():
            return f"{head}: {inner['message'].strip()}"
    if match := _JSON_MESSAGE.search(body):
        return f"{head}: {match.group(1).strip()}"
    return error.strip()


def error_cause(error: str) -> str:
    """The cause a failed request is grouped under: its message with the numbers taken out,
    so "prompt of 9120 tokens" and "prompt of 9800 tokens" are one cause."""
    return " ".join(_NUMBER.sub("N", error_message(error)).split())[:300]


def errors_by_cause(failed: list[RequestRecord]) -> list[dict]:
    """The failed requests grouped by error class and cause, most common first: ``{error_class,
    cause, count, example}``, ``example`` one member's message verbatim (the numbers the
    cause leaves out). At most MAX_CAUSES rows; the rest are counted in a last one."""
    groups: dict[tuple[str, str], dict] = {}
    for r in failed:
        key = (r.error_class or "error", error_cause(r.error or ""))
        group = groups.get(key)
        if group is None:
            groups[key] = group = {
                "error_class": key[0],
                "cause": key[1],
                "count": 0,
                "example": (r.error or "")[:300],
            }
        group["count"] += 1
    rows = sorted(groups.values(), key=lambda g: (-g["count"], g["error_class"], g["cause"]))
    if len(rows) > MAX_CAUSES:
        rest = rows[MAX_CAUSES - 1 :]
        rows = rows[: MAX_CAUSES - 1] + [
            {
                "error_class": "other",
                "cause": f"{len(rest)} other causes",
                "count": sum(g["count"] for g in rest),
                "example": rest[0]["example"],
            }
        ]
    return rows


def chunk_health(ok: list[RequestRecord]) -> dict:
    """How many token chunks (arrivals: token events stamped with one arrival time, so read
    together) carried more than one token, and why. Such a chunk has no gap inside it to
    measure: its tokens' inter-token latencies read 0 ms whether the engine streamed them 0 or
    30 ms apart. Two causes, told apart:

    - ``coalesced_chunks``: several events read at once (one stamp). A busy client reading
      late finds several events waiting: ITL percentiles from a run where many chunks did are
      the client's, not the engine's (``benchmarks.evidence``: client-limited).
    - ``multi_token_events``: the engine sent several tokens in one event (usage counted more
      tokens than events came: SGLang's ``--stream-interval``, speculative decoding). That is
      how the engine streams, not the client's fault: ITL is then per event, not per token.

    ``multi_token_chunks`` counts chunks with either cause."""
    chunks = multi = coalesced = engine = 0
    for r in ok:
        times = r.chunk_times
        arrivals = together = 0
        i, n = 0, len(times)
        while i < n:
            j = i
            while j + 1 < n and times[j + 1] == times[i]:
                j += 1
            arrivals += 1
            together += j > i
            i = j + 1
        coalesced += together
        # Tokens the usage counted beyond the events that came: some events carried several
        # (at least one event per extra token's worth, at most every arrival).
        extra = r.output_tokens - n if r.token_source == "usage" else 0
        events = min(arrivals, extra) if extra > 0 else 0
        engine += events
        chunks += arrivals
        multi += min(arrivals, together + events)
    return {
        "token_chunks": chunks,
        "multi_token_chunks": multi,
        "multi_token_chunk_share": multi / chunks if chunks else None,
        "coalesced_chunks": coalesced,
        "coalesced_chunk_share": coalesced / chunks if chunks else None,
        "multi_token_events": engine,
        "multi_token_event_share": engine / chunks if chunks else None,
    }


def _token_source(ok: list[RequestRecord]) -> str:
    sources = {r.token_source for r in ok}
    return sources.pop() if len(sources) == 1 else ("mixed" if sources else "none")


def _max_concurrency(records: list[RequestRecord]) -> int:
    events = []
    for r in records:
        if not math.isnan(r.sent) and not math.isnan(r.end):
            events.append((r.sent, 1))
            events.append((r.end, -1))
    events.sort()
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


def _max_tokens_per_second(records: list[RequestRecord]) -> float:
    buckets: dict[int, int] = {}
    for r in records:
        for t in r.chunk_times:
            buckets[int(t)] = buckets.get(int(t), 0) + 1
    return float(max(buckets.values(), default=0))


# --- what failures say about the engine ----------------------------------------------------------
class ErrorWindow:
    """The outcomes of the last ``size`` finished requests. A rate over this window reacts to
    an engine that fails mid-run within ``size`` requests; the run-long rate of a run that was
    healthy for an hour would take as long again to cross a limit."""

    def __init__(self, size: int):
        self.records: deque[RequestRecord] = deque(maxlen=max(1, size))
        self.failed = 0

    def add(self, record: RequestRecord) -> None:
        if len(self.records) == self.records.maxlen and not self.records[0].ok:
            self.failed -= 1
        self.records.append(record)
        if not record.ok:
            self.failed += 1

    @property
    def full(self) -> bool:
        return len(self.records) == self.records.maxlen

    @property
    def rate(self) -> float:
        return self.failed / len(self.records) if self.records else 0.0


def engine_state(records, url: str) -> str | None:
    """What the failed requests among ``records`` say about the engine at ``url``, in the
    words an operator acts on: unreachable, answering an HTTP error, timing out, sending broken
    streams. The most common failure names it, with its share of ``records``. None when none
    failed."""
    records = list(records)
    failed = [r for r in records if not r.ok]
    if not failed:
        return None
    groups: dict[tuple[str, int | None], list[RequestRecord]] = {}
    for record in failed:
        key = (record.error_class or "error", record.status if record.status else None)
        groups.setdefault(key, []).append(record)
    (error_class, status), members = max(groups.items(), key=lambda item: len(item[1]))
    share = f"{len(members) / len(records):.0%} of {len(records)} requests"
    example = members[-1].error[:160]
    if error_class == "connection":
        return f"engine unreachable at {url} ({share}): {example}"
    if error_class.startswith("http_") and status:
        detail = example.split(": ", 1)[1] if ": " in example else ""
        return f"engine answered HTTP {status} for {share}" + (f": {detail}" if detail else "")
    if error_class == "timeout":
        return f"engine did not answer in time for {share}: {example}"
    if error_class == "client_error":
        return f"the load generator could not read {share} (client-side, not the engine): {example}"
    if error_class == "malformed_stream":
        return f"engine sent broken streams for {share}: {example}"
    return f"{error_class} for {share}: {example}"
