"""GuideLLM's ``benchmarks.json`` (``guidellm run ... --output kind=json``) read into the
panel's result document (pure: no Django).

The schema is GuideLLM 0.8.1's ``GenerativeBenchmarksReport`` (guidellm/benchmark/schemas/
report.py: ``metadata``, ``config``, ``benchmarks``); each benchmark is a
``GenerativeBenchmark`` (benchmark/schemas/benchmark.py) with ``config.strategy``,
``scheduler_metrics`` (the measured window), ``metrics`` (``GenerativeMetrics``,
benchmark/schemas/metrics.py: one ``StatusDistributionSummary`` a metric, split into
successful / incomplete / errored / total) and ``requests`` (``GenerativeRequestStats`` lists by
status, schemas/base/request_stats.py). A sweep writes one benchmark a rate.

What their names mean, from that source, and what they become here:

* ``time_to_first_token_ms`` = first token iteration − request start: our TTFT.
* ``request_latency`` (seconds) = request end − request start: our E2EL.
* ``inter_token_latency_ms`` per request = (last token − first token) / (output tokens − 1);
  the summary weights each request by its output tokens − 1, so its **mean** is the mean gap
  over all tokens — our mean ITL — but its percentiles are of per-request means (neither our
  ITL's, which pool every gap, nor our TPOT's, one value a request): kept as
  ``guidellm_itl_token_weighted_*``.
* ``time_per_output_token_ms`` = (last token − request start) / output tokens: it includes
  the time to the first token, so it is **not** our TPOT (which excludes it); kept apart as
  ``guidellm_tpot_incl_first_token_*``. Our TPOT is computed from the per-request lists.
* Errored and incomplete requests (cancelled when the benchmark stopped) count as failed.

The file is read as a stream: the benchmarks' summaries are built (bounded by the number of
metrics, not requests), the chosen benchmark's requests are turned into request records one
at a time (``benchmarks.importers._Log``) and every other benchmark's requests are skipped.
"""

from __future__ import annotations

from datetime import UTC, datetime

import ijson
from ijson.common import ObjectBuilder

from benchmarks import importers_common as base
from benchmarks.resultstream import MAX_BUILT_VALUES, READ_SIZE, json_error

GUIDELLM = "guidellm"
# GuideLLM's percentile names (schemas/base/statistics.py: p001 is the 0.1th percentile).
PERCENTILES = {
    "p001": 0.1,
    "p01": 1,
    "p05": 5,
    "p10": 10,
    "p25": 25,
    "p50": 50,
    "p75": 75,
    "p90": 90,
    "p95": 95,
    "p99": 99,
    "p999": 99.9,
}
STATUSES = ("successful", "errored", "incomplete")
# Their metric → (our latency key, factor to ms). ITL and TPOT are deliberately not here.
SAME_AS_OURS = {"time_to_first_token_ms": ("ttft", 1.0), "request_latency": ("e2el", 1000.0)}
APART = {
    "inter_token_latency_ms": "guidellm_itl_token_weighted",
    "time_per_output_token_ms": "guidellm_tpot_incl_first_token",
}


def recognised(present: set[str]) -> bool:
    """A GuideLLM report: ``benchmarks`` with the report's ``metadata`` or ``config``."""
    return "benchmarks" in present and bool(present & {"metadata", "config"})


def read(scanned, reopen, wanted: int | None) -> base.Imported:
    """The benchmark numbered ``wanted`` (1-based; None: the first) of the report."""
    if not scanned.lists.get("benchmarks"):
        raise ValueError("GuideLLM report: 'benchmarks' must be a list")
    index = 1 if wanted is None else wanted
    log = base._Log()
    pass_ = _Pass(index, log)
    with reopen("reading the benchmarks") as (stream, counted):
        try:
            for prefix, event, value in ijson.parse(stream, buf_size=READ_SIZE, use_float=True):
                pass_.feed(prefix, event, value)
        except ijson.JSONError as exc:
            raise json_error(exc, counted) from None
    summaries = pass_.summaries
    if not summaries:
        raise ValueError("GuideLLM report: the file holds no benchmarks")
    if pass_.chosen is None:
        raise ValueError(
            f"GuideLLM report: there is no benchmark {index}; the file holds "
            f"{len(summaries)}: {_listing(enumerate(summaries, 1))}"
        )
    return _imported(scanned.data, pass_.chosen, summaries, index, log)


class _Pass:
    """Routes the parser's events: each benchmark's parts other than ``requests`` are built;
    the chosen benchmark's requests become request records one at a time."""

    def __init__(self, wanted: int, log):
        self.wanted, self.log = wanted, log
        self.number = 0
        self.summaries: list[dict] = []
        self.chosen: dict | None = None
        self.current: dict = {}
        self.key = None
        self.builder: ObjectBuilder | None = None
        self.request: ObjectBuilder | None = None
        self.status = ""
        self.built = 0
        self.window: tuple[float, float] | None = None
        self.t0: float | None = None
        self.seen = {s: 0 for s in STATUSES}

    def feed(self, prefix: str, event: str, value) -> None:
        if prefix == "benchmarks.item":
            if event == "start_map":
                self.number += 1
                self.current, self.key, self.builder, self.built = {}, None, None, 0
                self.window = self.t0 = None  # each benchmark's clock starts at its own window
            elif event == "map_key":
                self._close_key()
                self.key = value
            elif event == "end_map":
                self._close_key()
                self._close_benchmark()
            else:
                raise ValueError("GuideLLM report: each benchmark must be an object")
            return
        if not prefix.startswith("benchmarks.item.") or self.key is None:
            return
        if self.key == "requests":
            if self.number == self.wanted:
                self._request_event(prefix, event, value)
            return
        if self.builder is None:
            self.builder = ObjectBuilder()
        if event not in ("start_map", "start_array", "end_map", "end_array", "map_key"):
            self.built += 1
            if self.built > MAX_BUILT_VALUES:
                raise ValueError(
                    f"GuideLLM report: benchmark {self.number} holds more than "
                    f"{MAX_BUILT_VALUES:,} values outside its request lists"
                )
        self.builder.event(event, value)

    def _close_key(self) -> None:
        if self.builder is not None and self.key is not None:
            self.current[self.key] = self.builder.value
            if self.key == "scheduler_metrics" and isinstance(self.builder.value, dict):
                start = base._number(self.builder.value.get("measure_start_time"))
                end = base._number(self.builder.value.get("measure_end_time"))
                if start is not None and end is not None:
                    self.window = (start, end)
                    self.t0 = start if self.t0 is None else self.t0
        self.builder = None

    def _close_benchmark(self) -> None:
        if not isinstance(self.current, dict):
            return
        self.summaries.append(_summary(self.current))
        if self.number == self.wanted:
            self.chosen = self.current
            self.chosen["_seen"] = dict(self.seen)
        self.current = {}

    def _request_event(self, prefix: str, event: str, value) -> None:
        parts = prefix.split(".")  # benchmarks, item, requests, <status>, item, ...
        if len(parts) < 5 or parts[3] not in STATUSES:
            return
        if len(parts) == 5 and event == "start_map":
            self.request, self.status = ObjectBuilder(), parts[3]
        if self.request is None:
            return
        self.request.event(event, value)
        if len(parts) == 5 and event == "end_map":
            self.seen[self.status] += 1
            self._add(self.request.value, self.status)
            self.request = None

    def _add(self, stats, status: str) -> None:
        if not isinstance(stats, dict):
            return
        timings = (stats.get("info") or {}).get("timings") or {}
        start = base._number(timings.get("request_start")) or base._number(
            stats.get("request_start_time")
        )
        end = base._number(timings.get("request_end")) or base._number(
            stats.get("request_end_time")
        )
        first = base._number(timings.get("first_token_iteration"))
        if start is None:
            return  # never sent: nothing measured
        if self.t0 is None:
            self.t0 = start
        ok = status == "successful"
        error = ""
        if not ok:
            error = str((stats.get("info") or {}).get("error") or status)
            if status == "incomplete":
                error = f"incomplete (cancelled when the benchmark stopped): {error}"
        record = base._vllm_record(
            self.log.writer.count,
            error,
            (first - start) if first is not None else None,
            [],  # GuideLLM keeps no per-token times: no gaps, so no ITL distribution
            start - self.t0,
            (end - start) if end is not None else None,
            base._number(stats.get("prompt_tokens")),
            base._number(stats.get("output_tokens")),
            False,
        )
        if status == "incomplete":
            record["error_class"] = "cancelled"
        if self.window is not None and end is not None:
            # As GuideLLM's get_within_range: requests wholly outside the measured window
            # (warm-up, cool-down) are not in its metrics, nor in ours.
            record["warmup"] = end < self.window[0] or start > self.window[1]
        self.log.add(record)


def _summary(benchmark: dict) -> dict:
    """What a benchmark is, in a line: its strategy, counts and rate."""
    totals = ((benchmark.get("metrics") or {}).get("request_totals")) or {}
    return {
        "strategy": _strategy(benchmark),
        "successful": totals.get("successful"),
        "failed": (totals.get("errored") or 0) + (totals.get("incomplete") or 0),
        "duration": base._number(benchmark.get("duration")),
    }


def _strategy(benchmark: dict) -> str:
    strategy = ((benchmark.get("config") or {}).get("strategy")) or {}
    kind = str(strategy.get("type_") or "?")
    for key in ("streams", "rate", "max_concurrency"):
        if strategy.get(key) is not None and kind != "synchronous":
            value = strategy[key]
            return f"{kind}@{value:g}" if isinstance(value, float) else f"{kind}@{value}"
    return kind


def _listing(numbered) -> str:
    """``(number, summary)`` pairs as a line a person can pick from."""
    return "; ".join(
        f"{i} {s['strategy']} ({s['successful']} ok, {s['failed']} failed)" for i, s in numbered
    )


def _imported(report: dict, chosen: dict, summaries: list[dict], index: int, log) -> base.Imported:
    metrics = chosen.get("metrics") if isinstance(chosen.get("metrics"), dict) else {}
    version = str(((report.get("metadata") or {}).get("guidellm_version")) or "?")
    notes = [
        f"read as a GuideLLM {version} benchmarks.json: benchmark {index} of "
        f"{len(summaries)} ({summaries[index - 1]['strategy']})"
    ]
    if len(summaries) > 1:
        others = [(i, s) for i, s in enumerate(summaries, 1) if i != index]
        notes.append(
            "the file holds a sweep; only this benchmark is imported here. The others: "
            + _listing(others)
        )
    doc = _document(chosen, metrics, notes)
    seen = chosen.get("_seen") or {}
    listed = sum(seen.values())
    totals = metrics.get("request_totals") or {}
    counted = sum(int(base._number(totals.get(s)) or 0) for s in STATUSES)
    if log.writer.count:
        if listed < counted:
            notes.append(
                f"the file lists {listed:,} of the {counted:,} requests (GuideLLM's "
                "sample_size): the request log and the distributions are of that sample"
            )
        # The token totals come from GuideLLM's sums over all requests, not from the list.
        base._fill_from_log(doc, log, {"total_input_tokens": None}, notes)
    else:
        notes.append(
            "the file lists no requests (GuideLLM's sample_size=0): no latency distributions, "
            "no request log, no TPOT"
        )
    notes.append(
        "GuideLLM keeps no per-token arrival times: ITL percentiles are not known (its own "
        "ITL percentiles are of per-request means, kept as guidellm_itl_token_weighted_*); "
        "GuideLLM's TPOT includes the first token and is kept apart as "
        "guidellm_tpot_incl_first_token_*, not as TPOT"
    )
    notes.append("GuideLLM files carry no per-second timeline and no engine metrics")
    backend = ((chosen.get("config") or {}).get("backend")) or {}
    spec_backend = (((report.get("config") or {}).get("spec") or {}).get("backend")) or {}
    model = str(backend.get("model") or spec_backend.get("model") or "")
    started = base._number(chosen.get("start_time"))
    return base.Imported(
        kind=GUIDELLM,
        document=doc,
        model=model,
        notes=notes,
        spec=None,
        date=datetime.fromtimestamp(started, UTC) if started else None,
        label=f"guidellm {summaries[index - 1]['strategy']}"[:100],
        tool=f"GuideLLM {version}",
        **log.parts(),
    )


def _document(chosen: dict, metrics: dict, notes: list[str]) -> dict:
    totals = metrics.get("request_totals") or {}
    completed = int(base._number(totals.get("successful")) or 0)
    failed = int(base._number(totals.get("errored")) or 0) + int(
        base._number(totals.get("incomplete")) or 0
    )
    measured = completed + failed
    duration = base._number(chosen.get("duration"))
    doc: dict = {
        "completed": completed,
        "failed": failed,
        "error_rate": failed / measured if measured else 0.0,
        "num_prompts": measured,
        "duration": duration,
    }
    tokens_in = _successful(metrics, "prompt_token_count", "total_sum")
    tokens_out = _successful(metrics, "output_token_count", "total_sum")
    if tokens_in is not None:
        doc["total_input_tokens"] = int(tokens_in)
    if tokens_out is not None:
        doc["total_output_tokens"] = int(tokens_out)
    if duration:
        # Our definitions (successes and their tokens over the measured window), from
        # GuideLLM's counts and sums: its own rates are means of per-second rates.
        doc["request_throughput"] = completed / duration
        if tokens_out is not None:
            doc["output_throughput"] = tokens_out / duration
            doc["total_token_throughput"] = ((tokens_in or 0) + tokens_out) / duration
    for name, (ours, scale) in SAME_AS_OURS.items():
        doc.update(_statistics(metrics.get(name), ours, scale))
    itl = (metrics.get("inter_token_latency_ms") or {}).get("successful") or {}
    if base._number(itl.get("mean")) is not None and (itl.get("count") or 0) > 0:
        doc["mean_itl_ms"] = itl["mean"]  # token-weighted: the mean gap over all tokens
    for name, prefix in APART.items():
        for key, value in _statistics(metrics.get(name), "x", 1.0).items():
            doc[f"{prefix}_{key.removesuffix('_x_ms')}_ms"] = value
    strategy = ((chosen.get("config") or {}).get("strategy")) or {}
    doc["guidellm_strategy"] = _strategy(chosen)
    if strategy.get("streams") is not None:
        doc["max_concurrency"] = strategy["streams"]
    if strategy.get("rate") is not None:
        doc["request_rate"] = strategy["rate"]
    request_format = str(
        (((chosen.get("config") or {}).get("backend")) or {}).get("request_format") or ""
    )
    doc["endpoint"] = request_format if request_format.startswith("/") else "/v1/chat/completions"
    doc["stages"], doc["timeline"], doc["notes"], doc["spec"] = {}, [], [], None
    doc["server"] = {"available": False, "error": "not recorded by GuideLLM"}
    return base.json_safe(doc)


def _successful(metrics: dict, name: str, field: str) -> float | None:
    return base._number(((metrics.get(name) or {}).get("successful") or {}).get(field))


def _statistics(summary, ours: str, scale: float) -> dict:
    """mean/median/std/pNN of the successful requests, in ms, named as ours are."""
    if not isinstance(summary, dict):
        return {}
    found = summary.get("successful")
    if not isinstance(found, dict) or not (base._number(found.get("count")) or 0):
        return {}
    out = {}
    for theirs, name in (("mean", "mean"), ("median", "median"), ("std_dev", "std")):
        value = base._number(found.get(theirs))
        if value is not None:
            out[f"{name}_{ours}_ms"] = value * scale
    for label, p in PERCENTILES.items():
        value = base._number((found.get("percentiles") or {}).get(label))
        if value is not None:
            out[f"p{base._label(p)}_{ours}_ms"] = value * scale
    return out
