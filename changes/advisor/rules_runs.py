"""Rules on how the deployment was measured: errors behind a speed-up, warm-up inside the
numbers, a profile unlike the real traffic (DOMAIN.md §3, §5). Pure."""

from __future__ import annotations

from collections.abc import Iterator

from changes.advisor import text
from changes.advisor.facts import LengthFacts, RunFacts, Snapshot
from changes.advisor.findings import CRITICAL, INFO, WARNING, Finding, Suggestion
from changes.advisor.registry import rule
from changes.advisor.rules_common import current_run

# --- errors-behind-speed -----------------------------------------------------------------------
# A run called faster with an error rate from this value is suspect: one request in a hundred
# failed, and failures finish fast (DOMAIN §5: a speed-up that raises errors is no success).
ERROR_RATE_MAX = 0.01
# …and at least this much above the run it was compared with (one percentage point).
ERROR_RATE_RISE = 0.01
# The running config's newest run failing this share of requests is flagged even with nothing
# to compare: its latency and throughput describe only the requests that worked.
ERROR_RATE_HIGH = 0.05

# --- warmup-included ---------------------------------------------------------------------------
# A first stage whose TTFT p99 is this many times its p50 carries cold-start requests (CUDA
# graph capture, empty caches): the warning form of the finding.
WARMUP_TAIL_RATIO = 5.0
# The warm-up to propose: at least this many requests…
WARMUP_MIN_REQUESTS = 10
# …or this many per slot of the first stage's concurrency, so every slot has warmed.
WARMUP_PER_SLOT = 2

# --- profile-unlike-traffic --------------------------------------------------------------------
# Ratio between the profile's and the traffic's length percentiles from which the benchmark
# measures another workload: prefill and KV use scale with length (DOMAIN §5: realistic input
# lengths).
PROFILE_RATIO_MAX = 2.0
# Difference in shared-prefix share from which prefix-cache results do not carry over.
PREFIX_SHARE_DIFF_MAX = 0.3
LENGTH_FIELDS = (
    ("input_p50", "prompt p50"),
    ("input_p99", "prompt p99"),
    ("output_p50", "output p50"),
    ("output_p99", "output p99"),
)


def _error_rate(run: RunFacts) -> float | None:
    if run.error_rate is not None:
        return run.error_rate
    total = run.completed + run.failed
    return run.failed / total if total else None


def _classes(run: RunFacts) -> str:
    top = sorted(run.errors_by_class.items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{name} {n:,}" for name, n in top)


def _compared(s: Snapshot) -> tuple[RunFacts, RunFacts | None] | None:
    """The newest run called faster than another, with that other run when the snapshot has
    it."""
    for run in s.runs:
        if run.faster_than is not None:
            base = next((r for r in s.runs if r.run_id == run.faster_than), None)
            return run, base
    return None


@rule("errors-behind-speed")
def errors_behind_speed(s: Snapshot) -> Iterator[Finding]:
    pair = _compared(s)
    if pair is not None:
        run, base = pair
        rate = _error_rate(run)
        base_rate = _error_rate(base) if base is not None else None
        rose = base_rate is None or rate is not None and rate - base_rate >= ERROR_RATE_RISE
        if rate is not None and rate >= ERROR_RATE_MAX and rose:
            than = (
                f" against {text.pct(base_rate)} in run {base.run_id}"
                if base_rate is not None
                else ""
            )
            classes = f" ({_classes(run)})" if run.errors_by_class else ""
            yield Finding(
                rule="errors-behind-speed",
                severity=CRITICAL,
                title=f"Run {run.run_id} is faster, with more errors",
                seen=(
                    f"Run {run.run_id}, reported faster than run {run.faster_than}, failed "
                    f"{run.failed:,} of {run.completed + run.failed:,} requests "
                    f"({text.pct(rate)}){than}{classes}."
                ),
                why=(
                    "Failed requests end early and leave the GPU to the rest, so a config "
                    "that fails more looks faster; a speed-up that raises the error rate is "
                    "not a success (DOMAIN §5)."
                ),
                evidence={
                    "run": run.run_id,
                    "compared_with": run.faster_than,
                    "error_rate": rate,
                    "compared_error_rate": base_rate,
                    "errors_by_class": dict(run.errors_by_class),
                },
                source=f"run {run.run_id}",
                suggestion=Suggestion(
                    action=(
                        f"Do not adopt run {run.run_id}'s config on its speed: find the cause "
                        "of its errors first, then compare again with the same profile."
                    )
                ),
            )
            return
    run = current_run(s)
    rate = _error_rate(run) if run is not None else None
    if rate is None or rate < ERROR_RATE_HIGH:
        return
    classes = f" ({_classes(run)})" if run.errors_by_class else ""
    yield Finding(
        rule="errors-behind-speed",
        severity=CRITICAL,
        title=f"Run {run.run_id} failed {text.pct(rate)} of its requests",
        seen=(
            f"Run {run.run_id} (the running config) failed {run.failed:,} of "
            f"{run.completed + run.failed:,} requests ({text.pct(rate)}){classes}."
        ),
        why=(
            "Its latency and throughput describe only the requests that worked: the failed "
            "ones are users who got an error, and they make the run look faster than it is."
        ),
        evidence={
            "run": run.run_id,
            "error_rate": rate,
            "errors_by_class": dict(run.errors_by_class),
        },
        source=f"run {run.run_id}",
        suggestion=Suggestion(
            action="Find the cause of the errors (the run's error classes and messages) "
            "before reading its speed."
        ),
    )


@rule("warmup-included")
def warmup_included(s: Snapshot) -> Iterator[Finding]:
    if not s.runs:
        return
    run = s.runs[0]
    if run.warmup_requests or not run.completed:
        return
    first = run.stages[0] if run.stages else None
    ratio = None
    if first is not None and first.ttft_p50_ms and first.ttft_p99_ms is not None:
        ratio = first.ttft_p99_ms / first.ttft_p50_ms
    slots = (first.concurrency or first.max_concurrent or 0) if first is not None else 0
    propose = max(WARMUP_MIN_REQUESTS, WARMUP_PER_SLOT * slots)
    polluted = ratio is not None and ratio >= WARMUP_TAIL_RATIO
    tail = (
        f"; its first stage {first.name} has TTFT p99 {text.ms(first.ttft_p99_ms)}, "
        f"{ratio:.1f}× its p50 of {text.ms(first.ttft_p50_ms)}"
        if ratio is not None
        else ""
    )
    yield Finding(
        rule="warmup-included",
        severity=WARNING if polluted else INFO,
        title=f"Run {run.run_id} measured without a warm-up",
        seen=f"Run {run.run_id} ({run.profile}) sent no warm-up requests{tail}.",
        why=(
            "The first requests after a start pay for CUDA graph capture, empty caches and "
            "lazy allocation; counted in the results they inflate the tail and make runs "
            "disagree (DOMAIN §3, §5: warm-up excluded)."
        ),
        evidence={
            "run": run.run_id,
            "warmup_requests": 0,
            "first_stage": first.name if first is not None else None,
            "first_stage_tail_ratio": ratio,
        },
        source=f"run {run.run_id}",
        suggestion=Suggestion(
            action=(
                f"Set warmup_requests: {propose} in the load profile ({WARMUP_PER_SLOT} per "
                f"slot of the first stage's concurrency, at least {WARMUP_MIN_REQUESTS}) and "
                "run it again."
            )
        ),
    )


def _differences(profile: LengthFacts, traffic: LengthFacts) -> list[tuple[str, float, float]]:
    out = []
    for field, label in LENGTH_FIELDS:
        ran, real = getattr(profile, field), getattr(traffic, field)
        if ran and real and max(ran / real, real / ran) >= PROFILE_RATIO_MAX:
            out.append((label, ran, real))
    ran, real = profile.shared_prefix_share, traffic.shared_prefix_share
    if ran is not None and real is not None and abs(ran - real) >= PREFIX_SHARE_DIFF_MAX:
        out.append(("shared-prefix share", ran, real))
    return out


def _value(label: str, value: float) -> str:
    return text.pct(value) if label == "shared-prefix share" else text.tokens(value)


@rule("profile-unlike-traffic")
def profile_unlike_traffic(s: Snapshot) -> Iterator[Finding]:
    traffic = s.traffic
    run = next((r for r in s.runs if r.lengths is not None), None)
    if traffic is None or run is None:
        return
    diffs = _differences(run.lengths, traffic)
    if not diffs:
        return
    words = "; ".join(
        f"{label} {_value(label, ran)} in the run vs {_value(label, real)} in the traffic"
        for label, ran, real in diffs
    )
    target = ", ".join(f"{label} {_value(label, real)}" for label, real in _traffic_values(traffic))
    yield Finding(
        rule="profile-unlike-traffic",
        severity=WARNING,
        title=f"Run {run.run_id}'s profile does not look like the real traffic",
        seen=f"Run {run.run_id} ({run.profile}) against the traffic sample: {words}.",
        why=(
            "Prefill time, KV use and prefix-cache gains all scale with request shape: a "
            "result on other lengths does not predict this deployment (DOMAIN §5: realistic "
            "input lengths)."
        ),
        evidence={
            "run": run.run_id,
            "differences": [
                {"what": label, "run": ran, "traffic": real} for label, ran, real in diffs
            ],
        },
        source=f"run {run.run_id}",
        suggestion=Suggestion(
            action=(f"Build the load profile from the traffic sample ({target}) and measure again.")
        ),
    )


def _traffic_values(traffic: LengthFacts) -> list[tuple[str, float]]:
    out = [(label, getattr(traffic, f)) for f, label in LENGTH_FIELDS if getattr(traffic, f)]
    if traffic.shared_prefix_share is not None:
        out.append(("shared-prefix share", traffic.shared_prefix_share))
    return out


# --- client-limited-run ------------------------------------------------------------------------
@rule("client-limited-run")
def client_limited_run(s: Snapshot) -> Iterator[Finding]:
    """The runs the other rules did not read, and why: a run whose numbers are the load
    generator's (``benchmarks.evidence``) is left out of ``runs``, never silently."""
    if not s.refused_runs:
        return
    newest, why = s.refused_runs[0]
    more = len(s.refused_runs) - 1
    yield Finding(
        rule="client-limited-run",
        severity=INFO,
        title=f"Run {newest} not used as evidence" + (f" (and {more} more)" if more else ""),
        seen="; ".join(f"Run {run_id} is {text}" for run_id, text in s.refused_runs) + ".",
        why=(
            "A starved load generator measures itself: late reads coalesce chunks (ITL 0 ms), "
            "its own delay lands in TTFT, its own read errors count as failures. The advisor "
            "judges the engine only from runs whose client kept up."
        ),
        evidence={"runs": [run_id for run_id, _ in s.refused_runs]},
        source=f"run {newest}",
        suggestion=Suggestion(
            action=(
                "Run the profile again on a quieter machine, or spread its load over several "
                "load generators (shards on workers of the loadgen queue)."
            )
        ),
    )
