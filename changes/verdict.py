"""Whether an applied change did what it should: the verdict on a baseline and a verification
run (pure: no Django, so it is tested fast and on its own).

Latencies are judged only when the two runs measured under the same conditions (the same load
profile version, the same engine start state, about the same prefix-cache hit rate, enough
requests, both usable); otherwise the verdict is "inconclusive" and says why, as it is when a
difference lies inside the runs' noise band. ``changes.services.verification`` gathers the
runs' numbers and conditions; the apply pipeline acts on the outcome.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from benchmarks.metrics import BY_KEY, Metric, numbers


@dataclass(frozen=True)
class Thresholds:
    """How much worse the verification run may be than the baseline before a rollback."""

    error_rate_increase: float = 0.01  # absolute: 0.01 = one percentage point
    ttft_p95_regression: float = 0.2  # relative: 0.2 = 20 % slower
    itl_p95_regression: float = 0.2


@dataclass(frozen=True)
class PointsCheck:
    """A share (the error rate) may rise by at most ``threshold`` percentage points. A
    verification run without it fails the check: it cannot prove it is safe."""

    metric: Metric
    threshold: str  # the ``Thresholds`` field that bounds it

    def judge(self, baseline: Mapping, after: Mapping, limits: Thresholds) -> dict:
        limit = getattr(limits, self.threshold)
        key = self.metric.key
        old, new = baseline.get(key) or 0.0, after.get(key)
        check = {"metric": key, "label": self.metric.label}
        if new is None:
            return check | {
                "baseline": old,
                "after": None,
                "ok": False,
                "limit": f"+{limit:.1%} points",
                "note": "the verification run has no error rate",
            }
        return check | {
            "baseline": round(old, 4),
            "after": round(new, 4),
            "change": round(new - old, 4),
            "limit": f"+{limit:.1%} points",
            "limit_value": round(old + limit, 4),
            "ok": new - old <= limit,
        }

    def shown(self, check: dict) -> str:
        if check.get("after") is None:
            return "not measured"
        return f"{check['baseline']:.2%} → {check['after']:.2%}"


@dataclass(frozen=True)
class RelativeCheck:
    """A latency may grow by at most ``threshold`` of the baseline's. Unmeasured on either
    side, it says so and does not decide."""

    metric: Metric
    threshold: str  # the ``Thresholds`` field that bounds it

    def judge(self, baseline: Mapping, after: Mapping, limits: Thresholds) -> dict:
        limit = getattr(limits, self.threshold)
        key = self.metric.key
        old, new = baseline.get(key), after.get(key)
        check = {"metric": key, "label": self.metric.label}
        if old is None or new is None:
            return check | {
                "baseline": old,
                "after": new,
                "ok": None,
                "limit": f"+{limit:.0%}",
                "note": "not measured",
            }
        change = (new - old) / old if old else (0.0 if new == old else math.inf)
        return check | {
            "baseline": round(old, 3),
            "after": round(new, 3),
            "change": None if math.isinf(change) else round(change, 4),
            "limit": f"+{limit:.0%}",
            "limit_value": round(applied_limit(limit, old), 3),
            "ok": change <= limit,
        }

    def shown(self, check: dict) -> str:
        if check.get("change") is None:
            return f"{check['baseline']} → {check['after']}"
        unit = self.metric.unit
        return f"{check['baseline']:.1f} → {check['after']:.1f} {unit} ({check['change']:+.0%})"


def applied_limit(relative: float, baseline: float) -> float:
    """The one rule for a latency limit: fixed as a share when the change is proposed, it
    bounds the p95 at that share above the baseline the verdict compares against (never the
    run the change was proposed from): +20 % of a 412 ms baseline is 494.4 ms."""
    return baseline * (1 + relative)


def limit_text(check: Mapping, baseline_run=None) -> str:
    """A check's limit as it applies, in words, for the change page and the API alike:
    "+20 % of run #12's 412.0 ms = 494.4 ms"."""
    value = check.get("limit_value")
    if value is None or check.get("baseline") is None:
        return check.get("limit") or ""
    of = f"run #{baseline_run}'s" if baseline_run else "the baseline's"
    if check.get("metric") == "error_rate":
        return f"{check['limit']} on {of} {check['baseline']:.2%} = {value:.2%}"
    unit = BY_KEY[check["metric"]].unit if check.get("metric") in BY_KEY else ""
    return f"{check['limit']} of {of} {check['baseline']:.1f} {unit} = {value:.1f} {unit}"


# Flags whose larger value grows the decode batch: more sequences per step is the fix for
# queueing and its price is inter-token latency (on the demo, cap 32 → 64: ITL p95 19.7 →
# 26 ms). With the default +20 % ITL limit such a change is rolled back for the very cost it was
# chosen to pay.
BATCH_FLAGS = ("max_num_seqs", "max_running_requests")
# The most a larger batch may slow each token: ITL doubled, whatever the growth.
BATCH_ITL_MAX = 1.0


def batch_itl_limit(settings: Mapping, running: Mapping, default: float) -> float | None:
    """The ITL p95 limit of a change that grows the decode batch, from the change alone (never
    from a run, whose ITL would make it depend on which run it was proposed from): a decode
    step with k times the sequences takes at most k times as long, so ITL p95 may grow by the
    cap's growth (32 → 64: +100 %), never less than ``default`` and at most ``BATCH_ITL_MAX``.
    None when the change does not grow a known running cap."""
    growth = [
        settings[dest] / running[dest] - 1
        for dest in BATCH_FLAGS
        if isinstance(settings.get(dest), int)
        and isinstance(running.get(dest), int)
        and settings[dest] > running[dest] > 0
    ]
    if not growth:
        return None
    return round(min(BATCH_ITL_MAX, max(default, *growth)), 4)


# What a verification is judged by, in the order the verdict lists it: "a speed-up that
# raises errors is not a success", so errors come first and any failed check is a regression.
CHECKS = (
    PointsCheck(BY_KEY["error_rate"], "error_rate_increase"),
    RelativeCheck(BY_KEY["ttft_p95_ms"], "ttft_p95_regression"),
    RelativeCheck(BY_KEY["itl_p95_ms"], "itl_p95_regression"),
)
# Reported beside the checks, never a reason to roll back.
INFORMATIVE = BY_KEY["output_tokens_per_s"]
# The numbers of a run the verdict reads (``run_numbers``).
VERDICT_METRICS = (*(check.metric for check in CHECKS), INFORMATIVE)


# --- the conditions a run measured under ---------------------------------------------------------
# Two runs whose prefix-cache hit rates differ by more than this share measured different
# engines: 98.6 % against 0 % makes TTFT several times faster whatever the config.
PREFIX_HIT_TOLERANCE = 0.10
# Under this many successful requests a p95 is the slowest request or two: no verdict on it.
MIN_REQUESTS = 20
# The confidence of the run-to-run noise band around a p95 (``quantile_interval``).
NOISE_Z = 1.96


def quantile_interval(values: Iterable[float], q: float = 0.95, z: float = NOISE_Z):
    """A distribution-free confidence interval of the ``q`` quantile of ``values`` (order
    statistics around rank n·q, binomial spread ±z·√(n·q·(1-q))): ``(low, high)``, or None
    under MIN_REQUESTS values. The band within which a second run of the same load would put
    its p95: a difference inside it is noise, not the change."""
    ordered = sorted(v for v in values if v is not None and math.isfinite(v))
    n = len(ordered)
    if n < MIN_REQUESTS:
        return None
    spread = z * math.sqrt(n * q * (1 - q))
    low = max(1, math.ceil(n * q - spread))
    high = min(n, math.ceil(n * q + spread))
    return ordered[low - 1], ordered[high - 1]


def estimate_interval(estimate: float | None, standard_error: float | None, z: float = NOISE_Z):
    """The noise band ``(low, high)`` of an estimate with a known standard error (the ITL p95
    from batches of whole requests, ``benchmarks.loadgen.stats.itl_p95_standard_error``), or
    None when either is unknown. The low end stays above zero: a band's ratio is taken."""
    if estimate is None or standard_error is None:
        return None
    if not (math.isfinite(estimate) and math.isfinite(standard_error)) or estimate <= 0:
        return None
    spread = z * standard_error
    return max(estimate - spread, estimate * 1e-3), estimate + spread


def _within_noise(check: dict, limit: float, band) -> None:
    """Turn a pass or a failure the noise band cannot separate from the limit into "cannot
    judge": the change's range is the verification's band over the baseline's. Such a check
    is marked ``noisy``: more requests (``measure_more``) narrow the band."""
    (b_low, b_high), (a_low, a_high) = band
    if not b_low or check["ok"] is None:
        return
    low, high = a_low / b_high - 1, a_high / b_low - 1
    check["noise"] = [round(low, 4), round(high, 4)]
    if low <= limit < high:
        check.update(ok=None, noisy=True, note=CANNOT_JUDGE + noise_text(low, high, limit))


CANNOT_JUDGE = "cannot judge: "


def noise_text(low: float, high: float, limit: float) -> str:
    """Why a latency cannot be judged on its noise band, in the words every view shows."""
    return (
        f"run-to-run noise ±{(high - low) / 2:.0%} ({low:+.0%} to {high:+.0%}) spans the "
        f"limit +{limit:.0%}"
    )


# --- hard guards ----------------------------------------------------------------------------------
# KV-cache use (its peak over the run) from which the cache is saturated: a step that finds no
# free block preempts a sequence, which is recomputed and its latency doubled (DOMAIN §1).
KV_SATURATED = 0.95


def hard_guards(before: Mapping, after: Mapping) -> list[str]:
    """Harms of the change that count whatever the noise band says, each a reason to roll
    back: preemptions or a saturated KV cache under the change where the baseline had none,
    and an engine that restarted during the verification. ``before``/``after`` are the
    runs' conditions (``preemptions``, ``kv_cache_usage_max``, ``restarted``); a fact the
    baseline did not report is not compared (the engine's metrics were not scraped). The
    error rate is guarded by its own check, which no noise band ever relaxes."""
    found = []
    b_pre, a_pre = before.get("preemptions"), after.get("preemptions")
    if a_pre and b_pre == 0:
        found.append(f"{a_pre:,.0f} sequences preempted under the change, none in the baseline")
    b_kv, a_kv = before.get("kv_cache_usage_max"), after.get("kv_cache_usage_max")
    if a_kv is not None and b_kv is not None and a_kv >= KV_SATURATED > b_kv:
        found.append(
            f"the KV cache saturated under the change: {a_kv:.1%} at its fullest (the "
            f"baseline {b_kv:.1%}; saturated from {KV_SATURATED:.0%})"
        )
    if after.get("restarted"):
        found.append(f"the engine restarted during the verification ({after['restarted']})")
    return found


# The cache state of an engine at a run's start (``Conditions.cache_state``).
COLD, WARM, UNKNOWN = "cold", "warm", "unknown"
CACHE_STATES = {
    COLD: "right after a restart (cold cache)",
    WARM: "on a warm engine (runs before it since the restart)",
    UNKNOWN: "on an engine whose restart the panel did not see",
}


def condition_rows(before: Mapping, after: Mapping) -> list[dict]:
    """The conditions of the two runs side by side, as the change page shows them."""

    def share(value):
        return None if value is None else round(value, 4)

    return [
        {
            "key": "profile",
            "label": "Load profile",
            "baseline": before.get("profile"),
            "after": after.get("profile"),
        },
        {
            "key": "cache_state",
            "label": "Engine at the start",
            "baseline": before.get("cache_state"),
            "after": after.get("cache_state"),
        },
        {
            "key": "prefix_cache_hit_rate",
            "label": "Prefix-cache hit rate",
            "percent": True,
            "baseline": share(before.get("prefix_cache_hit_rate")),
            "after": share(after.get("prefix_cache_hit_rate")),
        },
        {
            "key": "kv_cache_usage_max",
            "label": "KV cache use (max)",
            "percent": True,
            "baseline": share(before.get("kv_cache_usage_max")),
            "after": share(after.get("kv_cache_usage_max")),
        },
        {
            "key": "preemptions",
            "label": "Preemptions",
            "baseline": before.get("preemptions"),
            "after": after.get("preemptions"),
        },
        {
            "key": "error_rate",
            "label": "Error rate",
            "percent": True,
            "baseline": share(before.get("error_rate")),
            "after": share(after.get("error_rate")),
        },
        {
            "key": "requests",
            "label": "Successful requests",
            "baseline": before.get("requests"),
            "after": after.get("requests"),
        },
    ]


# Flags whose change moves the prefix cache by design (turns it on or off, resizes the pool
# it lives in): a hit rate that moves with them is the change's effect.
CACHE_FLAGS = {
    "vllm": frozenset(
        {"enable_prefix_caching", "gpu_memory_utilization", "block_size", "kv_cache_dtype"}
    ),
    "sglang": frozenset({"disable_radix_cache", "mem_fraction_static", "kv_cache_dtype"}),
}


def alters_cache(engine: str, changed: Iterable[str]) -> bool:
    """Whether a change of the flags ``changed`` alters the engine's prefix cache."""
    return bool(CACHE_FLAGS.get(engine, frozenset()) & set(changed))


def compare_conditions(before: Mapping, after: Mapping, *, cache_changed: bool = False) -> dict:
    """Whether two runs measured the same engine under the same load, so their latencies may
    be compared. ``before``/``after`` are ``Conditions`` dicts (``changes.services
    .verification.conditions``): ``profile``, ``cache_state``, ``prefix_cache_hit_rate``,
    ``kv_cache_usage_max``, ``error_rate``, ``requests`` and ``problem`` (why the run may not be
    used for a verdict at all, or None). ``cache_changed``: the change itself alters the
    prefix cache (turns it on or off, resizes the KV pool), so after the same start a moved
    hit rate is its effect, not a difference in conditions.

    Returns ``{"differ": [why no verdict can be drawn], "notes": [...], "rows": [...]}``. KV
    use is shown, never a reason the conditions differ: a memory or batching change moves it
    by design (a cache that saturates under the change is a ``hard_guards`` harm instead)."""
    differ, notes = [], []
    if before.get("problem"):
        differ.append(f"the baseline cannot be used: {before['problem']}")
    b_profile, a_profile = before.get("profile"), after.get("profile")
    if b_profile and a_profile and b_profile != a_profile:
        differ.append(
            f"the baseline ran {b_profile}, the verification {a_profile}: not the same load"
        )
    b_state, a_state = before.get("cache_state", UNKNOWN), after.get("cache_state", UNKNOWN)
    b_hits, a_hits = before.get("prefix_cache_hit_rate"), after.get("prefix_cache_hit_rate")
    same_start = b_state == a_state != UNKNOWN
    hits_known = b_hits is not None and a_hits is not None
    if hits_known and abs(a_hits - b_hits) > PREFIX_HIT_TOLERANCE:
        text = f"baseline ran with {b_hits:.1%} prefix-cache hits, verification with {a_hits:.1%}"
        if cache_changed and same_start:
            notes.append(text + ": the change alters the prefix cache, so this is its effect")
        else:
            differ.append(text + " — conditions differ")
    if b_state != a_state:
        started = (
            f"the baseline ran {CACHE_STATES.get(b_state, b_state)}, the verification "
            f"{CACHE_STATES.get(a_state, a_state)}"
        )
        if hits_known and abs(a_hits - b_hits) <= PREFIX_HIT_TOLERANCE:
            notes.append(started + ", with the same prefix-cache hit rate")
        elif not hits_known:
            differ.append(
                started + "; the engine did not report prefix-cache hits, so whether a warm "
                "cache made the difference cannot be told"
            )
    return {"differ": differ, "notes": notes, "rows": condition_rows(before, after)}


def verdict(
    baseline: Mapping,
    after: Mapping,
    limits: Thresholds,
    conditions: tuple[Mapping, Mapping] | None = None,
    *,
    cache_changed: bool = False,
    noise: Mapping[str, tuple] | None = None,
) -> dict:
    """Compare two runs' numbers (``run_numbers``: ``error_rate``, ``ttft_p95_ms``,
    ``itl_p95_ms`` and the throughput, informative only) by ``CHECKS``, after checking that
    the runs measured under the same ``conditions`` (baseline's, verification's; see
    ``compare_conditions``).

    ``outcome`` is one of:

    - ``"regressed"``: a check is over its threshold, or the verification itself cannot be
      used (its errors): the new config is not shown to be safe. ``reason`` says why.
    - ``"inconclusive"``: the conditions differ (a warm cache against a cold one, another
      load, an unusable baseline) or a check cannot be judged (not measured, too few
      requests): no verdict, ``reason`` says why. Never reported as "within limits".
    - ``"verified"``: every check judged and within its threshold.

    ``noise``: ``{metric: (baseline band, verification band)}`` (TTFT: ``quantile_interval``
    of each run's requests; ITL: ``estimate_interval`` of its batch-means standard error): a
    latency whose change could lie on either side of its limit within
    the bands is not judged ("cannot judge: run-to-run noise ±X % … spans the limit"), rather
    than passed or failed; ``measure_more`` says more requests could settle it.

    ``hard_guards`` (preemptions or a saturated KV cache new under the change, an engine
    restart during the verification) regress whatever the bands and the conditions say.
    Each check carries ``limit_applied``: its limit on the baseline run (``applied_limit``).

    ``regressed`` is kept as the boolean the pipeline rolls back on."""
    before_conditions, after_conditions = conditions or ({}, {})
    compared = compare_conditions(before_conditions, after_conditions, cache_changed=cache_changed)
    judged = [(rule, rule.judge(baseline, after, limits)) for rule in CHECKS]
    requests = (before_conditions.get("requests"), after_conditions.get("requests"))
    if any(count is not None and count < MIN_REQUESTS for count in requests):
        few = min(count for count in requests if count is not None)
        for rule, check in judged:
            if isinstance(rule, RelativeCheck) and check["ok"] is not None:
                check.update(ok=None, note=f"too few requests ({few}) for a p95")
    for rule, check in judged:
        band = (noise or {}).get(rule.metric.key)
        if band and all(band) and isinstance(rule, RelativeCheck):
            _within_noise(check, getattr(limits, rule.threshold), band)
    if compared["differ"]:
        # Latencies measured under different conditions say nothing about the change; more
        # errors still do, unless the baseline itself is unusable.
        void = before_conditions.get("problem")
        for rule, check in judged:
            if check["ok"] is not None and (void or isinstance(rule, RelativeCheck)):
                check.update(ok=None, note="conditions differ")
    failed = [(rule, check) for rule, check in judged if check["ok"] is False]
    old, new = baseline.get(INFORMATIVE.key), after.get(INFORMATIVE.key)
    guards = hard_guards(before_conditions, after_conditions)
    reasons = [f"hard guard: {guard}" for guard in guards] + [
        f"{check['label']} {rule.shown(check)} (limit {check['limit']})" for rule, check in failed
    ]
    unusable = after_conditions.get("problem")
    if unusable:
        reasons.insert(0, f"the verification cannot be used: {unusable}")
    noisy = []
    if reasons:
        outcome, reason = "regressed", "; ".join(reasons)
    else:
        noisy = [
            f"cannot judge {check['label']}: {check['note'].removeprefix(CANNOT_JUDGE)}"
            for _, check in judged
            if check.get("noisy") and check["ok"] is None and check["note"].startswith(CANNOT_JUDGE)
        ]
        unjudged = [
            f"{check['label']} ({check.get('note') or 'not measured'})"
            for _, check in judged
            if check["ok"] is None
            and check.get("note") != "conditions differ"
            and not check.get("noisy")
        ]
        cannot = (
            compared["differ"]
            + noisy
            + (["not judged: " + ", ".join(unjudged)] if unjudged else [])
        )
        outcome = "inconclusive" if cannot else "verified"
        reason = "; ".join(cannot)
    baseline_run = before_conditions.get("run")
    for check in (check for _, check in judged):
        check["limit_applied"] = limit_text(check, baseline_run)
    return {
        "outcome": outcome,
        "regressed": outcome == "regressed",
        "checks": [check for _, check in judged],
        "throughput_change": round((new - old) / old, 4) if old and new is not None else None,
        "reason": reason,
        "conditions": compared["rows"] if conditions else [],
        "notes": compared["notes"],
        "guards": guards,
        # More requests would narrow the band: only noise (not the conditions) kept a
        # latency from being judged.
        "measure_more": bool(noisy) and not compared["differ"],
        "baseline_run": baseline_run,
        "verification_runs": list(after_conditions.get("runs") or ()),
    }


def run_numbers(run) -> dict:
    """The numbers ``verdict`` reads, off a run (any object with the run's columns); empty
    for no run."""
    return numbers(run, VERDICT_METRICS)


def numbers_text(values: Mapping) -> str:
    """``run_numbers`` in one line, as a change's timeline shows a benchmark:
    "TTFT p95 412 ms, ITL p95 21 ms, 1532 tok/s, errors 0.2%"."""

    def ms(key: str) -> str:
        value = values.get(key)
        return f"{BY_KEY[key].label} " + ("—" if value is None else f"{value:.0f} ms")

    rate, tput = values.get("error_rate"), values.get(INFORMATIVE.key)
    rate_text = "—" if rate is None else f"{rate:.1%}"
    tput_text = "—" if tput is None else f"{tput:.0f} {INFORMATIVE.unit}"
    return f"{ms('ttft_p95_ms')}, {ms('itl_p95_ms')}, {tput_text}, errors {rate_text}"


def verdict_text(result: dict) -> str:
    """A verdict in one line: how much each latency and the throughput moved, and, when no
    verdict could be drawn, "inconclusive" and why, so "within limits" never stands for
    "cannot tell"."""
    parts = [
        f"{check['label']} {check['change']:+.0%}"
        for check in result["checks"]
        if check.get("change") is not None and check["metric"] != "error_rate"
    ]
    if result.get("throughput_change") is not None:
        parts.append(f"output tok/s {result['throughput_change']:+.0%}")
    moved = ", ".join(parts)
    outcome = result.get("outcome") or ("regressed" if result["regressed"] else "verified")
    if outcome == "regressed":
        return "regression: " + result["reason"]
    if outcome == "inconclusive":
        return "inconclusive: " + result["reason"] + (f" (measured: {moved})" if moved else "")
    text = "within limits: " + moved if moved else "within limits"
    for note in result.get("notes") or ():
        text += f"; {note}"
    return text
