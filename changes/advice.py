"""What a reviewer should know about a proposed engine change: domain warnings and the
simulator's predicted impact (pure: no Django, so it is tested fast and on its own).

The panel gathers the facts (the diff, the engine version, the observed request lengths, the
GPUs) and these functions turn them into words and numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from benchmarks.loadgen.profile import normalize
from benchmarks.loadgen.spec import SpecError
from benchmarks.metrics import BY_KEY, HIGHER, LOWER, Metric, numbers, pick
from hosts.engines import EngineSpec, Flag, get_spec
from hosts.engines.catalog import GPUS, UnknownModel, resolve_model
from hosts.simulator.config import StartupError
from hosts.simulator.predict import Workload, predict

# Above this share of GPU memory a small change in traffic has nowhere to go (DOMAIN.md §2).
MEMORY_FRACTION_LIMIT = 0.95
# max_model_len beyond this multiple of the longest real requests (p99 prompt + output)
# reserves KV cache and admission budget for requests that never come.
CONTEXT_HEADROOM = 4.0
# Weights under this share of one GPU's memory leave room for a useful KV cache on that GPU.
FITS_ONE_GPU_SHARE = 0.6
# Requests a prediction simulates per stage: enough for stable p95s, a fraction of a second.
PREDICTION_REQUESTS = 300

MEMORY_FLAGS = {"vllm": "gpu_memory_utilization", "sglang": "mem_fraction_static"}
CONTEXT_FLAGS = {"vllm": "max_model_len", "sglang": "context_length"}
TP_FLAGS = {"vllm": "tensor_parallel_size", "sglang": "tp_size"}


@dataclass(frozen=True)
class Warning:
    """One thing a reviewer should look at twice; ``code`` is stable for tests and filters."""

    code: str
    message: str

    def to_dict(self) -> dict:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True)
class Proposal:
    """What the warning rules look at: the proposed settings, what differs from the running
    ones (``{flag: (running, proposed)}``), and the facts known about the deployment."""

    engine: str
    spec: EngineSpec
    diff: Mapping[str, tuple]
    proposed: Mapping
    engine_version: str | None = None
    model: str = ""
    gpu_memory_bytes: int | None = None  # one GPU's memory
    observed_p99_tokens: int | None = None  # p99 of prompt + output, latest benchmark


def warnings_for(
    engine: str,
    diff: Mapping[str, tuple],
    proposed: Mapping,
    *,
    engine_version: str | None = None,
    model: str = "",
    gpu_memory_bytes: int | None = None,
    observed_p99_tokens: int | None = None,
) -> list[Warning]:
    """Domain warnings on a proposed change: what each rule of ``RULES`` finds, in order.

    ``diff`` is ``{flag: (running, proposed)}``, ``proposed`` the whole proposed settings,
    ``observed_p99_tokens`` the p99 of prompt + output tokens measured on the deployment (its
    latest benchmark), ``gpu_memory_bytes`` one GPU's memory.
    """
    proposal = Proposal(
        engine,
        get_spec(engine),
        diff,
        proposed,
        engine_version=engine_version,
        model=model,
        gpu_memory_bytes=gpu_memory_bytes,
        observed_p99_tokens=observed_p99_tokens,
    )
    return [warning for rule in RULES for warning in rule(proposal)]


def several_settings(p: Proposal) -> Iterator[Warning]:
    if len(p.diff) > 1:
        names = ", ".join(sorted(p.diff))
        yield Warning(
            "several_settings",
            f"{len(p.diff)} settings change at once ({names}): if the result moves you will "
            "not know which one moved it. Change one thing at a time.",
        )


def no_change(p: Proposal) -> Iterator[Warning]:
    if not p.diff:
        yield Warning("no_change", "Nothing differs from the running config.")


def memory_headroom(p: Proposal) -> Iterator[Warning]:
    flag = MEMORY_FLAGS[p.engine]
    fraction = p.proposed.get(flag)
    if isinstance(fraction, int | float) and fraction > MEMORY_FRACTION_LIMIT:
        yield Warning(
            "memory_headroom",
            f"{flag} = {fraction:g} leaves under {1 - MEMORY_FRACTION_LIMIT:.0%} of "
            "GPU memory for activations and other processes: a burst of long prompts or "
            "a CUDA graph capture can then fail with out-of-memory.",
        )


def context_too_long(p: Proposal) -> Iterator[Warning]:
    flag = CONTEXT_FLAGS[p.engine]
    context, p99 = p.proposed.get(flag), p.observed_p99_tokens
    if isinstance(context, int) and p99 and context > CONTEXT_HEADROOM * p99:
        yield Warning(
            "context_too_long",
            f"{flag} = {context:,} is {context / p99:.0f}× the p99 "
            f"prompt + output length measured on this deployment ({p99:,} "
            "tokens): the engine reserves KV cache and admission budget for requests that "
            "do not come. Measure the real distribution and add a margin.",
        )


def tp_small_model(p: Proposal) -> Iterator[Warning]:
    flag = TP_FLAGS[p.engine]
    tp, memory = p.proposed.get(flag), p.gpu_memory_bytes
    if not (isinstance(tp, int) and tp > 1 and p.model and memory):
        return
    try:
        weights = resolve_model(p.model).weight_bytes
    except UnknownModel:
        return
    if weights < FITS_ONE_GPU_SHARE * memory:
        yield Warning(
            "tp_small_model",
            f"{flag} = {tp} on a model whose weights ({weights / 2**30:.0f} GiB) fit "
            f"one GPU ({memory / 2**30:.0f} GiB): tensor parallelism adds "
            "communication on every layer. Compare against one GPU per replica.",
        )


def flag_warnings(p: Proposal) -> Iterator[Warning]:
    """What each changed flag the engine knows raises, flag by flag (``FLAG_RULES``)."""
    for dest in sorted(p.diff):
        flag = p.spec.by_dest.get(dest)
        if flag is None or dest not in p.proposed:
            continue
        for rule in FLAG_RULES:
            yield from rule(p, flag)


def flag_availability(p: Proposal, flag: Flag) -> Iterator[Warning]:
    """A flag the deployment's engine version lacks, or one a later version drops."""
    missing = p.spec.missing(flag, p.engine_version) if p.engine_version else None
    if missing:
        yield Warning("unsupported_flag", missing + ".")
    elif flag.until:
        yield Warning(
            "flag_going_away",
            f"{flag.option} is gone from {p.spec.title or p.spec.prog} {flag.until}: "
            "an engine upgrade will refuse this config.",
        )


def version_unknown(p: Proposal, flag: Flag) -> Iterator[Warning]:
    if not p.engine_version and (flag.since or flag.until):
        yield Warning(
            "version_unknown",
            f"The deployment's engine version is not recorded, so whether it has "
            f"{flag.option} cannot be checked.",
        )


def no_speed_effect(p: Proposal, flag: Flag) -> Iterator[Warning]:
    if not flag.performance:
        yield Warning(
            "no_speed_effect",
            f"{flag.option} does not change speed: a verification benchmark will not "
            "show an effect.",
        )


def loads_code(p: Proposal) -> Iterator[Warning]:
    """A flag that makes the engine run code from outside the panel (``Flag.loads_code``):
    listed first, since it changes what runs on the GPU server, not how fast."""
    for dest in sorted(p.diff):
        flag = p.spec.by_dest.get(dest)
        if flag is not None and flag.loads_code_with(p.proposed.get(dest)):
            yield Warning(
                "loads_code",
                f"{flag.option} makes the engine load and run code from outside the panel "
                "(the model repository's Python, with the engine's access to the GPU server "
                "and its credentials). Only an Admin may propose or approve it, and an agent "
                "refuses it unless it was started with --allow-code-loading. Check where the "
                "model comes from before approving.",
            )


# The rules, in the order their warnings are listed.
RULES: tuple[Callable[[Proposal], Iterable[Warning]], ...] = (
    loads_code,
    several_settings,
    no_change,
    memory_headroom,
    context_too_long,
    tp_small_model,
    flag_warnings,
)
FLAG_RULES: tuple[Callable[[Proposal, Flag], Iterable[Warning]], ...] = (
    flag_availability,
    version_unknown,
    no_speed_effect,
)


# --- predicted impact --------------------------------------------------------------------------
def gpu_key(gpu_name: str) -> str | None:
    """The simulator's GPU key for an NVML name (``NVIDIA H100 80GB HBM3`` → ``h100-sxm``)."""
    for key, spec in GPUS.items():
        if spec.nvml_name == gpu_name:
            return key
    lowered = gpu_name.lower()
    for key in sorted(GPUS, key=len, reverse=True):
        family, _, size = key.partition("-")
        if family in lowered and (not size or size.rstrip("g") in lowered or size == "sxm"):
            return key
    return None


def _mean(dist: Mapping) -> int:
    if dist.get("kind") == "empirical" and dist.get("values"):
        values = dist["values"]
        return max(1, round(sum(values) / len(values)))
    if dist.get("kind") == "uniform" and dist.get("low") is not None:
        return max(1, round((dist["low"] + dist.get("high", dist["low"])) / 2))
    return max(1, round(float(dist.get("mean") or 1)))


def _jitter(dist: Mapping) -> float:
    if dist.get("kind") == "fixed":
        return 0.0
    if dist.get("kind") == "uniform" and dist.get("low") is not None:
        mean = _mean(dist)
        return min(1.0, (dist.get("high", mean) - dist["low"]) / 2 / mean)
    return 0.5  # skewed distributions: a ±50 % spread around the mean stands in for the tail


def workloads(profile: Mapping) -> list[tuple[str, Workload]]:
    """One simulator workload per stage of a load profile (replays use their mean sizes)."""
    doc = normalize(dict(profile))
    replay = doc.get("replay")
    if replay:
        rows = replay.get("rows") or []
        if not rows:
            raise SpecError("the replay has no rows")
        span = (rows[-1][0] - rows[0][0]) or 1.0
        inputs = [r[1] for r in rows]
        outputs = [r[2] for r in rows]
        stage = {
            "name": "replay",
            "request_rate": len(rows) / span,
            "num_requests": len(rows),
        }
        input_dist = {"kind": "empirical", "values": inputs}
        output_dist = {"kind": "empirical", "values": outputs}
        stages = [stage]
    else:
        stages = doc["stages"]
        input_dist, output_dist = doc["input_len"], doc["output_len"]
    out = []
    for stage in stages:
        rate = stage.get("request_rate")
        concurrency = stage.get("concurrency") or stage.get("max_concurrency")
        count = stage.get("num_requests")
        if count is None and stage.get("duration_s"):
            count = (rate or concurrency or 1) * stage["duration_s"]
        count = int(min(PREDICTION_REQUESTS, max(20, count or PREDICTION_REQUESTS)))
        out.append(
            (
                stage["name"],
                Workload(
                    num_requests=count,
                    input_tokens=_mean(input_dist),
                    output_tokens=_mean(output_dist),
                    input_jitter=_jitter(input_dist),
                    output_jitter=_jitter(output_dist),
                    concurrency=None if rate else int(concurrency or 1),
                    request_rate=float(rate) if rate else None,
                    burstiness=float(stage.get("burstiness") or 1.0),
                    shared_prefix_tokens=int(doc.get("prefix_len") or 0),
                    num_prefixes=int(doc.get("prefix_groups") or 1),
                    seed=int(doc.get("seed") or 0),
                ),
            )
        )
    return out


# (key in the simulator's result, label, unit, better): the run metrics it predicts, under
# the registry's names, and two numbers only the simulator knows.
PREDICTED = (
    *(
        (m.key, m.label, m.unit, m.better)
        for m in pick("ttft_p50_ms", "ttft_p95_ms", "itl_p50_ms", "itl_p95_ms")
    ),
    ("output_throughput", BY_KEY["output_tokens_per_s"].short, "tok/s", HIGHER),
    ("kv_cache_capacity_tokens", "KV capacity", "tokens", HIGHER),
    ("num_preemptions", "Preemptions", "", LOWER),
)
# A predicted change smaller than this share is no verdict: the simulator is not that exact.
PREDICTED_SAME_WITHIN = 0.02


def _numbers(result: dict) -> dict:
    return {
        "ttft_p50_ms": result["ttft_ms"]["p50"],
        "ttft_p95_ms": result["ttft_ms"]["p95"],
        "itl_p50_ms": result["itl_ms"]["p50"],
        "itl_p95_ms": result["itl_ms"]["p95"],
        "output_throughput": result["output_throughput"],
        "kv_cache_capacity_tokens": result["kv_cache_capacity_tokens"],
        "num_preemptions": result["num_preemptions"],
    }


def _one(engine, model, settings, gpu, workload, num_gpus) -> dict:
    try:
        return {"ok": True, **_numbers(predict(engine, model, settings, gpu, workload, num_gpus))}
    except StartupError as exc:
        return {"ok": False, "error": str(exc)}


def predicted_impact(
    engine: str,
    model: str,
    before: Mapping,
    after: Mapping,
    gpu: str,
    num_gpus: int,
    profile: Mapping,
) -> dict:
    """Before → after for each stage of ``profile``, as the simulator predicts them.

    Returns ``{"available": False, "reason": ...}`` when the simulator cannot model the
    deployment (an unknown model or GPU), so the page can say why there is no prediction.
    A config the engine would refuse to start shows as ``{"ok": False, "error": ...}``.
    """
    try:
        resolve_model(model)
    except UnknownModel as exc:
        return {"available": False, "reason": str(exc)}
    if gpu not in GPUS:
        return {"available": False, "reason": f"The simulator does not model the GPU {gpu!r}."}
    try:
        stages = workloads(profile)
    except SpecError as exc:
        return {"available": False, "reason": f"The profile cannot be simulated: {exc}"}
    rows = []
    for name, workload in stages:
        b = _one(engine, model, dict(before), gpu, workload, num_gpus)
        a = _one(engine, model, dict(after), gpu, workload, num_gpus)
        rows.append(
            {
                "stage": name,
                "requests": workload.num_requests,
                "before_error": b.get("error"),
                "after_error": a.get("error"),
                "metrics": _predicted_metrics(b, a),
            }
        )
    return {"available": True, "gpu": gpu, "num_gpus": num_gpus, "stages": rows}


def _predicted_metrics(before: dict, after: dict) -> list[dict]:
    """Each ``PREDICTED`` number before → after, its relative change and its verdict."""
    metrics = []
    for key, label, unit, better in PREDICTED:
        old, new = before.get(key), after.get(key)
        change = None
        if old is not None and new is not None and old:
            change = (new - old) / old
        verdict = None
        if change is not None and abs(change) >= PREDICTED_SAME_WITHIN:
            improved = change < 0 if better == LOWER else change > 0
            verdict = "better" if improved else "worse"
        metrics.append(
            {
                "key": key,
                "label": label,
                "unit": unit,
                "before": _round(old),
                "after": _round(new),
                "change": None if change is None else round(change, 4),
                "verdict": verdict,
            }
        )
    return metrics


def _round(value):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return round(value, 2) if isinstance(value, float) else value


# --- verification ------------------------------------------------------------------------------
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
            "ok": change <= limit,
        }

    def shown(self, check: dict) -> str:
        if check.get("change") is None:
            return f"{check['baseline']} → {check['after']}"
        unit = self.metric.unit
        return f"{check['baseline']:.1f} → {check['after']:.1f} {unit} ({check['change']:+.0%})"


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


def _within_noise(check: dict, limit: float, band) -> None:
    """Turn a pass or a failure the noise band cannot separate from the limit into "cannot
    tell": the change's range is the verification's band over the baseline's."""
    (b_low, b_high), (a_low, a_high) = band
    if not b_low or check["ok"] is None:
        return
    low, high = a_low / b_high - 1, a_high / b_low - 1
    check["noise"] = [round(low, 4), round(high, 4)]
    if low <= limit < high:
        check.update(
            ok=None,
            note=f"within run-to-run noise ({low:+.0%} to {high:+.0%} against +{limit:.0%})",
        )


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
    use is shown, never a reason: a memory or batching change moves it by design."""
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

    ``noise``: ``{metric: (baseline band, verification band)}`` (``quantile_interval`` of
    each run's requests): a latency whose change could lie on either side of its limit within
    the bands is not judged ("within run-to-run noise"), rather than passed or failed.

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
    reasons = [
        f"{check['label']} {rule.shown(check)} (limit {check['limit']})" for rule, check in failed
    ]
    unusable = after_conditions.get("problem")
    if unusable:
        reasons.insert(0, f"the verification cannot be used: {unusable}")
    if reasons:
        outcome, reason = "regressed", "; ".join(reasons)
    else:
        unjudged = [
            f"{check['label']} ({check.get('note') or 'not measured'})"
            for _, check in judged
            if check["ok"] is None and check.get("note") != "conditions differ"
        ]
        cannot = compared["differ"] + (["not judged: " + ", ".join(unjudged)] if unjudged else [])
        outcome = "inconclusive" if cannot else "verified"
        reason = "; ".join(cannot)
    return {
        "outcome": outcome,
        "regressed": outcome == "regressed",
        "checks": [check for _, check in judged],
        "throughput_change": round((new - old) / old, 4) if old and new is not None else None,
        "reason": reason,
        "conditions": compared["rows"] if conditions else [],
        "notes": compared["notes"],
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
