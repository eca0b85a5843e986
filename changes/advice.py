"""What a reviewer should know about a proposed engine change: domain warnings and the
simulator's predicted impact (pure: no Django, so it is tested fast and on its own).

The panel gathers the facts (the diff, the engine version, the observed request lengths, the
GPUs) and these functions turn them into words and numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from benchmarks.loadgen.spec import SpecError
from benchmarks.metrics import BY_KEY, HIGHER, LOWER, pick

# gpu_key and workloads live with the catalog and the sweeps now; re-exported here so
# existing callers (``advice.gpu_key``, ``advice.workloads``) keep working.
from benchmarks.sweep.load import PREDICTION_REQUESTS, workloads  # noqa: F401
from hosts.engines import EngineSpec, Flag, get_spec
from hosts.engines.catalog import GPUS, UnknownModel, gpu_key, resolve_model  # noqa: F401
from hosts.simulator.config import StartupError
from hosts.simulator.predict import predict

# Above this share of GPU memory a small change in traffic has nowhere to go (DOMAIN.md §2).
MEMORY_FRACTION_LIMIT = 0.95
# max_model_len beyond this multiple of the longest real requests (p99 prompt + output)
# reserves KV cache and admission budget for requests that never come.
CONTEXT_HEADROOM = 4.0
# Weights under this share of one GPU's memory leave room for a useful KV cache on that GPU.
FITS_ONE_GPU_SHARE = 0.6

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
    *,
    model_after: str | None = None,
) -> dict:
    """Before → after for each stage of ``profile``, as the simulator predicts them
    (``model_after``: the model the change switches to, when it does).

    Returns ``{"available": False, "reason": ...}`` when the simulator cannot model the
    deployment (an unknown model or GPU), so the page can say why there is no prediction.
    A config the engine would refuse to start shows as ``{"ok": False, "error": ...}``.
    """
    try:
        resolve_model(model)
        if model_after:
            resolve_model(model_after)
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
        a = _one(engine, model_after or model, dict(after), gpu, workload, num_gpus)
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


# --- predicted harm, as warnings ---------------------------------------------------------------
# A predicted change at least this large (signed: + for a time, − for a rate) is harm a
# reviewer must read before approving, at the top of the page with the warnings, not only in
# a stage table below the fold. One definition: the preview, the stored warnings and the
# change page all read it.
PREDICTED_HARM = {
    "ttft_p95_ms": 0.20,
    "itl_p95_ms": 0.20,
    "output_throughput": -0.10,
}
# The codes of the warnings derived from the prediction (recomputed from it, never stale).
PREDICTION_CODES = frozenset({"would_not_start", "predicted_regression"})


def start_failures(prediction: Mapping | None) -> list[tuple[str, str]]:
    """``(stage, the engine's message)`` for each stage of a prediction in which the proposed
    config would not start (the simulator raised the real engine's startup error)."""
    if not prediction or not prediction.get("available"):
        return []
    return [
        (stage["stage"], stage["after_error"])
        for stage in prediction.get("stages", ())
        if stage.get("after_error")
    ]


def _shown(value, unit: str) -> str:
    if value is None:
        return "—"
    number = f"{value:,.1f}" if unit == "ms" else f"{value:,.0f}"
    return f"{number} {unit}".strip()


def _harmful(key: str, change) -> bool:
    limit = PREDICTED_HARM.get(key)
    if limit is None or change is None:
        return False
    return change >= limit if limit > 0 else change <= limit


def prediction_warnings(prediction: Mapping | None) -> list[Warning]:
    """Warnings from a prediction (``predicted_impact``'s result): a proposed config the engine
    would refuse to start, then each metric predicted worse than ``PREDICTED_HARM`` with every
    stage where it is, and its numbers."""
    warnings = []
    failures = start_failures(prediction)
    if failures:
        stages = ", ".join(stage for stage, _ in failures)
        error = failures[0][1].strip()
        error += "" if error.endswith((".", "!", "?")) else "."
        warnings.append(
            Warning(
                "would_not_start",
                f"The simulator predicts the engine would refuse to start with the proposed "
                f"config (stage {stages}): {error} Approving it needs an Admin's "
                "written override.",
            )
        )
    if not prediction or not prediction.get("available"):
        return warnings
    found: dict[str, list[str]] = {}
    labels = {}
    for stage in prediction.get("stages", ()):
        for m in stage.get("metrics", ()):
            if _harmful(m["key"], m.get("change")):
                labels[m["key"]] = m["label"]
                found.setdefault(m["key"], []).append(
                    f"{stage['stage']} {m['change'] * 100:+.0f} % "
                    f"({_shown(m['before'], m['unit'])} → {_shown(m['after'], m['unit'])})"
                )
    for key, limit in PREDICTED_HARM.items():
        if key in found:
            warnings.append(
                Warning(
                    "predicted_regression",
                    f"Predicted {labels[key]} worse: {'; '.join(found[key])}. Warned at "
                    f"{limit * 100:+.0f} % or worse.",
                )
            )
    return warnings


def with_prediction_warnings(warnings: Iterable[Mapping], prediction: Mapping | None) -> list:
    """Stored warnings (dicts) with those of the prediction recomputed and listed first: a
    change proposed before these warnings existed shows them too, and none is listed twice."""
    kept = [dict(w) for w in warnings if w.get("code") not in PREDICTION_CODES]
    return [w.to_dict() for w in prediction_warnings(prediction)] + kept
