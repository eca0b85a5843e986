"""What a reviewer should know about a proposed engine change: domain warnings and the
simulator's predicted impact (pure: no Django, so it is tested fast and on its own).

The panel gathers the facts (the diff, the engine version, the observed request lengths, the
GPUs) and these functions turn them into words and numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from benchmarks.loadgen.profile import normalize
from benchmarks.loadgen.spec import SpecError
from hosts.engines import get_spec
from hosts.simulator.catalog import GPUS, UnknownModel, resolve_model
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
    """Domain warnings on a proposed change.

    ``diff`` is ``{flag: (running, proposed)}``, ``proposed`` the whole proposed settings,
    ``observed_p99_tokens`` the p99 of prompt + output tokens measured on the deployment (its
    latest benchmark), ``gpu_memory_bytes`` one GPU's memory.
    """
    out: list[Warning] = []
    spec = get_spec(engine)
    if len(diff) > 1:
        names = ", ".join(sorted(diff))
        out.append(
            Warning(
                "several_settings",
                f"{len(diff)} settings change at once ({names}): if the result moves you will "
                "not know which one moved it. Change one thing at a time.",
            )
        )
    if not diff:
        out.append(Warning("no_change", "Nothing differs from the running config."))

    memory_flag = MEMORY_FLAGS[engine]
    fraction = proposed.get(memory_flag)
    if isinstance(fraction, int | float) and fraction > MEMORY_FRACTION_LIMIT:
        out.append(
            Warning(
                "memory_headroom",
                f"{memory_flag} = {fraction:g} leaves under {1 - MEMORY_FRACTION_LIMIT:.0%} of "
                "GPU memory for activations and other processes: a burst of long prompts or "
                "a CUDA graph capture can then fail with out-of-memory.",
            )
        )

    context_flag = CONTEXT_FLAGS[engine]
    context = proposed.get(context_flag)
    if (
        isinstance(context, int)
        and observed_p99_tokens
        and context > CONTEXT_HEADROOM * observed_p99_tokens
    ):
        out.append(
            Warning(
                "context_too_long",
                f"{context_flag} = {context:,} is {context / observed_p99_tokens:.0f}× the p99 "
                f"prompt + output length measured on this deployment ({observed_p99_tokens:,} "
                "tokens): the engine reserves KV cache and admission budget for requests that "
                "do not come. Measure the real distribution and add a margin.",
            )
        )

    tp_flag = TP_FLAGS[engine]
    tp = proposed.get(tp_flag)
    if isinstance(tp, int) and tp > 1 and model and gpu_memory_bytes:
        try:
            weights = resolve_model(model).weight_bytes
        except UnknownModel:
            weights = None
        if weights is not None and weights < FITS_ONE_GPU_SHARE * gpu_memory_bytes:
            out.append(
                Warning(
                    "tp_small_model",
                    f"{tp_flag} = {tp} on a model whose weights ({weights / 2**30:.0f} GiB) fit "
                    f"one GPU ({gpu_memory_bytes / 2**30:.0f} GiB): tensor parallelism adds "
                    "communication on every layer. Compare against one GPU per replica.",
                )
            )

    for dest in sorted(diff):
        flag = spec.by_dest.get(dest)
        if flag is None or dest not in proposed:
            continue
        missing = spec.missing(flag, engine_version) if engine_version else None
        if missing:
            out.append(Warning("unsupported_flag", missing + "."))
        elif flag.until:
            out.append(
                Warning(
                    "flag_going_away",
                    f"{flag.option} is gone from {spec.title or spec.prog} {flag.until}: "
                    "an engine upgrade will refuse this config.",
                )
            )
        if not engine_version and (flag.since or flag.until):
            out.append(
                Warning(
                    "version_unknown",
                    f"The deployment's engine version is not recorded, so whether it has "
                    f"{flag.option} cannot be checked.",
                )
            )
        if not flag.performance:
            out.append(
                Warning(
                    "no_speed_effect",
                    f"{flag.option} does not change speed: a verification benchmark will not "
                    "show an effect.",
                )
            )
    return out


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


PREDICTED = (
    ("ttft_p50_ms", "TTFT p50", "ms", "lower"),
    ("ttft_p95_ms", "TTFT p95", "ms", "lower"),
    ("itl_p50_ms", "ITL p50", "ms", "lower"),
    ("itl_p95_ms", "ITL p95", "ms", "lower"),
    ("output_throughput", "Output tok/s", "tok/s", "higher"),
    ("kv_cache_capacity_tokens", "KV capacity", "tokens", "higher"),
    ("num_preemptions", "Preemptions", "", "lower"),
)


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
        metrics = []
        for key, label, unit, better in PREDICTED:
            old, new = b.get(key), a.get(key)
            change = None
            if old is not None and new is not None and old:
                change = (new - old) / old
            verdict = None
            if change is not None and abs(change) >= 0.02:
                improved = change < 0 if better == "lower" else change > 0
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
        rows.append(
            {
                "stage": name,
                "requests": workload.num_requests,
                "before_error": b.get("error"),
                "after_error": a.get("error"),
                "metrics": metrics,
            }
        )
    return {"available": True, "gpu": gpu, "num_gpus": num_gpus, "stages": rows}


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


def verdict(baseline: Mapping, after: Mapping, limits: Thresholds) -> dict:
    """Compare two runs' numbers (``error_rate``, ``ttft_p95_ms``, ``itl_p95_ms`` and the
    throughput, informative only). "A speed-up that raises errors is not a success": any
    check over its threshold makes the change a regression."""
    checks = []

    def relative(key: str, label: str, limit: float):
        old, new = baseline.get(key), after.get(key)
        if old is None or new is None:
            checks.append(
                {
                    "metric": key,
                    "label": label,
                    "baseline": old,
                    "after": new,
                    "ok": None,
                    "limit": f"+{limit:.0%}",
                    "note": "not measured",
                }
            )
            return
        change = (new - old) / old if old else (0.0 if new == old else math.inf)
        checks.append(
            {
                "metric": key,
                "label": label,
                "baseline": round(old, 3),
                "after": round(new, 3),
                "change": None if math.isinf(change) else round(change, 4),
                "limit": f"+{limit:.0%}",
                "ok": change <= limit,
            }
        )

    old_err = baseline.get("error_rate") or 0.0
    new_err = after.get("error_rate")
    if new_err is None:
        checks.append(
            {
                "metric": "error_rate",
                "label": "Error rate",
                "baseline": old_err,
                "after": None,
                "ok": False,
                "limit": f"+{limits.error_rate_increase:.1%} points",
                "note": "the verification run has no error rate",
            }
        )
    else:
        checks.append(
            {
                "metric": "error_rate",
                "label": "Error rate",
                "baseline": round(old_err, 4),
                "after": round(new_err, 4),
                "change": round(new_err - old_err, 4),
                "limit": f"+{limits.error_rate_increase:.1%} points",
                "ok": new_err - old_err <= limits.error_rate_increase,
            }
        )
    relative("ttft_p95_ms", "TTFT p95", limits.ttft_p95_regression)
    relative("itl_p95_ms", "ITL p95", limits.itl_p95_regression)
    old_tput, new_tput = baseline.get("output_tokens_per_s"), after.get("output_tokens_per_s")
    info = None
    if old_tput and new_tput is not None:
        info = round((new_tput - old_tput) / old_tput, 4)
    failed = [c for c in checks if c["ok"] is False]
    return {
        "regressed": bool(failed),
        "checks": checks,
        "throughput_change": info,
        "reason": "; ".join(f"{c['label']} {_shown(c)} (limit {c['limit']})" for c in failed),
    }


def _shown(check: dict) -> str:
    if check["metric"] == "error_rate":
        if check.get("after") is None:
            return "not measured"
        return f"{check['baseline']:.2%} → {check['after']:.2%}"
    if check.get("change") is None:
        return f"{check['baseline']} → {check['after']}"
    return f"{check['baseline']:.1f} → {check['after']:.1f} ms ({check['change']:+.0%})"
