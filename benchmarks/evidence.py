"""Whether a run's numbers may be evidence: the one rule every consumer calls.

A load generator measures the engine only while it keeps up itself. A starved client (a busy
machine, a saturated event loop) stamps chunks late, reads several token events at once (their
inter-token gaps read 0 ms), starts open-loop sends behind the schedule and adds its own delay
to TTFT: its numbers are the client's, not the engine's. Every run records the client's health
(``benchmarks.loadgen.runner.LoadRun.health``: event-loop lag, CPU share, late sends) beside the
engine's own view of the same window (its TTFT/ITL histograms, ``benchmarks.loadgen.scrape``);
``health_from_document`` gathers them when a run's results are stored and ``usable_as_evidence``
judges them. A run that fails a check is **client-limited**: its page and the API say so with
the numbers, and change verdicts, the CI gate, the advisor, capacity at SLO, sweeps and the cost
ranking refuse it in words ("client-limited: …").

A run without these measurements (recorded before them, imported from another tool) is
**unknown**, not client-limited: consumers accept it as before and show it as "not checked".

Pure: no Django; ``usable_as_evidence`` reads only ``run.client_health``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

# --- the tolerances ------------------------------------------------------------------------------
# Event-loop lag p99 above this: each read of every stream waited as long again, so TTFT and ITL
# carry the client's delay (a healthy loop oversleeps well under a millisecond; 20 ms is a whole
# decode step of a busy engine).
LOOP_LAG_P99_MS = 20.0
# The event loop's thread at this share of one core is saturated: it cannot read faster, so
# chunks queue in the socket and arrive "together".
CPU_SHARE_MAX = 0.90
# At or above this share of token chunks read together (several events at one read), ITL
# percentiles describe how often the client read, not the engine's pace (one in five gaps
# reading 0 ms moves p50/p95). Events the engine itself sent with several tokens are not the
# client's doing: at this share they make a caveat ("ITL per event"), not a refusal.
MULTI_TOKEN_SHARE_MAX = 0.20
# Open-loop sends starting this late (p99) against their schedule: the load applied was not the
# load asked for (the same bound as a sharded run's "behind" shard).
LATE_SEND_P99_MS = 50.0
# Client TTFT mean above the engine's own mean by more than max(this share, this floor): the
# difference is time in the client (network and HTTP framing explain a few ms, not half).
TTFT_TOLERANCE_SHARE = 0.50
TTFT_TOLERANCE_MS = 20.0
# Client ITL mean above the engine's by more than max(this share, this floor).
ITL_TOLERANCE_SHARE = 0.50
ITL_TOLERANCE_MS = 5.0

USABLE = "usable"
CLIENT_LIMITED = "client_limited"
UNKNOWN = "unknown"

# "report" where the load generator shares its CPU with simulated engines by design (a demo
# fleet on a laptop, the integration tests' simulators running 5x faster than real time): runs
# are judged and the page says what the check found, but no consumer refuses them. Anything
# else (the default): client-limited runs are refused. Read on each call.
MODE_ENV = "BENCHMARK_CLIENT_LIMITED"


@dataclass(frozen=True)
class Evidence:
    """The verdict on one run's measurements: ``state`` is usable, client_limited or unknown
    (nothing measured to judge by); ``reasons`` say why it is client-limited, with numbers;
    ``unchecked`` the checks that had no measurement; ``health`` what was judged."""

    state: str
    reasons: tuple[str, ...] = ()
    unchecked: tuple[str, ...] = ()
    health: dict = field(default_factory=dict, compare=False)
    # What the check found but did not enforce (MODE_ENV=report).
    reported: tuple[str, ...] = ()
    # What the numbers mean, though the client kept up (the engine streamed several tokens
    # an event: ITL is per event).
    caveats: tuple[str, ...] = ()

    @property
    def limited(self) -> bool:
        return self.state == CLIENT_LIMITED

    @property
    def usable(self) -> bool:
        """Whether consumers may use the run: unknown runs are allowed (flagged not checked)."""
        return not self.limited

    @property
    def refusal(self) -> str | None:
        """The words a consumer refuses the run with, or None when it may use it."""
        return "client-limited: " + "; ".join(self.reasons) if self.limited else None

    @property
    def summary(self) -> str:
        if self.limited:
            return self.refusal
        if self.state == UNKNOWN:
            return "client health not checked (no measurement of it in this run)"
        text = "client health checked: the load generator kept up"
        if self.unchecked:
            text += " (not checked: " + ", ".join(self.unchecked) + ")"
        if self.caveats:
            text += "; " + "; ".join(self.caveats)
        return text

    def to_dict(self) -> dict:
        return {
            "state": self.state,
            "limited": self.limited,
            "checked": self.state != UNKNOWN,
            "reasons": list(self.reasons),
            "unchecked": list(self.unchecked),
            "reported": list(self.reported),
            "caveats": list(self.caveats),
            "health": self.health,
        }


def _num(value) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _part(health: dict, name: str) -> dict:
    part = health.get(name) if isinstance(health, dict) else None
    return part if isinstance(part, dict) else {}


def _too_slow(client: float, engine: float, share: float, floor_ms: float) -> bool:
    return client - engine > max(share * engine, floor_ms)


def judge(health: dict | None) -> Evidence:
    """The rule, on a run's recorded health (``health_from_document``). Pure."""
    health = health if isinstance(health, dict) else {}
    reasons: list[str] = []
    unchecked: list[str] = []
    caveats: list[str] = []
    checked = 0

    lag = _part(health, "loop_lag_ms")
    p99 = _num(lag.get("p99"))
    if p99 is None:
        unchecked.append("event-loop lag")
    else:
        checked += 1
        if p99 > LOOP_LAG_P99_MS:
            top = _num(lag.get("max"))
            reasons.append(
                f"event-loop lag p99 {p99:.0f} ms"
                + (f" (max {top:.0f} ms)" if top is not None else "")
                + f" > {LOOP_LAG_P99_MS:.0f} ms"
            )

    share = _num(_part(health, "cpu").get("loop_thread_share"))
    if share is None:
        unchecked.append("CPU share")
    else:
        checked += 1
        if share >= CPU_SHARE_MAX:
            reasons.append(
                f"the load generator's event loop used {share:.0%} of one core "
                f"(≥ {CPU_SHARE_MAX:.0%})"
            )

    sends = _part(health, "sends")
    late_p99 = _num(sends.get("late_p99_ms"))
    if late_p99 is not None:
        checked += 1
        if late_p99 > LATE_SEND_P99_MS:
            late, scheduled = int(sends.get("late") or 0), int(sends.get("scheduled") or 0)
            top = _num(sends.get("late_max_ms")) or late_p99
            reasons.append(
                f"sends fell behind the schedule: {late} of {scheduled} started late, "
                f"p99 {late_p99:.0f} ms, up to {top:.0f} ms (limit p99 {LATE_SEND_P99_MS:.0f} ms)"
            )

    chunks = _part(health, "chunks")
    total = int(_num(chunks.get("token_chunks")) or 0)
    # Recorded since the two causes are told apart: only the client's reads count against it.
    # Before, one share held both: it is judged as it was.
    split = _num(chunks.get("coalesced_chunk_share")) is not None
    multi = _num(chunks.get("coalesced_chunk_share" if split else "multi_token_chunk_share"))
    if multi is None:
        unchecked.append("tokens per chunk")
    else:
        checked += 1
        if multi >= MULTI_TOKEN_SHARE_MAX:
            count = chunks.get("coalesced_chunks" if split else "multi_token_chunks")
            reasons.append(
                f"ITL not measurable: {multi:.0%} of chunks carried several tokens"
                + (" read at once" if split else "")
                + f" ({int(_num(count) or 0)} of {total}; limit {MULTI_TOKEN_SHARE_MAX:.0%})"
            )
    engine_share = _num(chunks.get("multi_token_event_share"))
    if engine_share is not None and engine_share >= MULTI_TOKEN_SHARE_MAX:
        caveats.append(
            f"ITL is per event, not per token: the engine sent several tokens in up to "
            f"{engine_share:.0%} of its events ({int(_num(chunks.get('multi_token_events')) or 0)}"
            f" of {total}), as it streams (e.g. --stream-interval, speculative decoding)"
        )

    client, engine = _part(health, "client"), _part(health, "engine")
    for label, key, tolerance, floor in (
        ("TTFT", "ttft_mean_ms", TTFT_TOLERANCE_SHARE, TTFT_TOLERANCE_MS),
        ("ITL", "itl_mean_ms", ITL_TOLERANCE_SHARE, ITL_TOLERANCE_MS),
    ):
        ours, theirs = _num(client.get(key)), _num(engine.get(key))
        if ours is None or theirs is None:
            unchecked.append(f"{label} against the engine's")
            continue
        checked += 1
        if _too_slow(ours, theirs, tolerance, floor):
            reasons.append(
                f"client {label} mean {ours:.1f} ms vs the engine's own {theirs:.1f} ms "
                f"(tolerance max({tolerance:.0%}, {floor:.0f} ms))"
            )

    errors = _part(health, "errors")
    client_errors = int(_num(errors.get("client_error")) or 0)
    if client_errors:
        measured = int(_num(errors.get("measured")) or 0)
        reasons.append(
            f"{client_errors} of {measured} requests failed in the load generator itself "
            "(client_error: unreadable streams, its own timeouts), not at the engine"
        )

    if reasons:
        state = CLIENT_LIMITED
    elif checked == 0:
        state = UNKNOWN
    else:
        state = USABLE
    return Evidence(state, tuple(reasons), tuple(unchecked), health, caveats=tuple(caveats))


def usable_as_evidence(run) -> Evidence:
    """The one rule: may ``run`` (a BenchmarkRun, anything with ``client_health``, or that
    health dict itself when a query read only that column) be used as evidence? Every consumer
    calls this and refuses a client-limited run in its words."""
    health = run if isinstance(run, dict) else getattr(run, "client_health", None)
    found = judge(health or {})
    if found.limited and os.environ.get(MODE_ENV, "").strip().lower() == "report":
        return replace(found, state=USABLE, reasons=(), reported=found.reasons)
    return found


def health_from_document(document: dict, engine_time_scale: float | None = None) -> dict:
    """The health a run's stored results are judged by, from a load generator result document
    (``Result.to_dict()``: the summary's keys at the top, ``server``, ``client_health``): the
    client's own health, tokens per chunk, client and engine TTFT/ITL of the window and the
    client-side errors. Empty parts are left out (an imported file has few of them).

    ``engine_time_scale``: the engine is a simulator whose clock runs this many wall seconds
    per simulated second (``--time-scale``). Its histograms are in its own seconds, the
    client's in wall seconds: the engine's TTFT/ITL are put in wall milliseconds so the two
    compare (a simulator 20x faster than real time otherwise always looks far slower than
    its client, and the check could never fire). At 0 (as fast as possible) its durations
    have no wall meaning: they are left out, and the check says it was not made."""
    document = document if isinstance(document, dict) else {}
    health = dict(document.get("client_health") or {})
    if _num(document.get("multi_token_chunk_share")) is not None:
        health["chunks"] = {
            key: document.get(key)
            for key in (
                "token_chunks",
                "multi_token_chunks",
                "multi_token_chunk_share",
                "coalesced_chunks",
                "coalesced_chunk_share",
                "multi_token_events",
                "multi_token_event_share",
            )
            if key in document
        }
    client = {
        "ttft_mean_ms": _num(document.get("mean_ttft_ms")),
        "itl_mean_ms": _num(document.get("mean_itl_ms")),
        "itl_p50_ms": _num(document.get("median_itl_ms")),
    }
    if any(v is not None for v in client.values()):
        health["client"] = client
    server = document.get("server") if isinstance(document.get("server"), dict) else {}
    if server.get("available"):
        scale = _num(engine_time_scale)
        scale = 1.0 if scale is None or scale < 0 else scale

        def wall(key: str) -> float | None:
            value = _num(server.get(key))
            return None if value is None or scale == 0 else value * scale

        engine = {
            "engine": server.get("engine"),
            "ttft_mean_ms": wall("server_mean_ttft_ms"),
            "ttft_p50_ms": wall("server_p50_ttft_ms"),
            "ttft_p95_ms": wall("server_p95_ttft_ms"),
            "itl_mean_ms": wall("server_mean_itl_ms"),
            "itl_p50_ms": wall("server_p50_itl_ms"),
            "itl_p95_ms": wall("server_p95_itl_ms"),
        }
        if scale != 1.0:
            engine["time_scale"] = scale
        health["engine"] = engine
    by_class = document.get("errors_by_class")
    if isinstance(by_class, dict) and health:
        measured = int(_num(document.get("completed")) or 0) + int(
            _num(document.get("failed")) or 0
        )
        health["errors"] = {
            "client_error": int(_num(by_class.get("client_error")) or 0),
            "measured": measured,
        }
    return health
