"""Rules on the config's sizing: the context length against the requests that come, memory
headroom, and tensor parallelism (DOMAIN.md §2, §4, §6). Pure."""

from __future__ import annotations

import re
from collections.abc import Iterator

from changes.advisor import text
from changes.advisor.facts import RunFacts, Snapshot
from changes.advisor.findings import CRITICAL, INFO, WARNING, Finding, Suggestion
from changes.advisor.registry import rule
from changes.advisor.rules_common import CONTEXT, MEMORY, TP, current_run, flag, lengths, total_p99

# --- max-model-len-oversized -------------------------------------------------------------------
# The same multiple as changes.advice.CONTEXT_HEADROOM (a proposal past it is warned about):
# beyond 4× the p99 request the length only reserves KV cache and admission budget for
# requests that never come (DOMAIN §4, §6).
CONTEXT_HEADROOM = 4.0
# Margin over the observed p99 when proposing a length (DOMAIN §6: "measure the input
# distribution and add a margin").
CONTEXT_MARGIN = 1.25

# --- length-rejections -------------------------------------------------------------------------
# How the engines word a context-length refusal (vLLM's serving layer: "This model's maximum
# context length is N tokens"; vLLM's engine: "longer than the maximum model length"; SGLang:
# "is longer than the model's context length").
LENGTH_REFUSALS = (
    "maximum context length",
    "maximum model length",
    "model's context length",
    "context length exceeded",
)
# Share of a run's requests refused for length from which the finding is raised: one in a
# hundred turned away is a service problem, not an outlier.
LENGTH_REJECT_SHARE_MIN = 0.01
# From this share users are hurt at scale now → critical.
LENGTH_REJECT_CRITICAL = 0.05
_INPUT = re.compile(r"(\d+) input tokens|input \((\d+) tokens\)|prompt \(length (\d+)\)")
_REQUESTED = re.compile(r"too large: (\d+)|requested (\d+) tokens")

# --- no-memory-headroom ------------------------------------------------------------------------
# The same limit as changes.advice.MEMORY_FRACTION_LIMIT: above it a small change in traffic
# has nowhere to go (DOMAIN §2: leave headroom).
MEMORY_FRACTION_LIMIT = 0.95
# What the advisor proposes instead: 10 % left for activations, CUDA graphs and other
# processes, the usual vLLM default (gpu_memory_utilization 0.9).
MEMORY_FRACTION_SAFE = 0.9
# A run error that says memory ran out (CUDA and PyTorch word it so).
OOM_WORDS = ("out of memory", "outofmemory")

# --- tp-unneeded -------------------------------------------------------------------------------
# The same share as changes.advice.FITS_ONE_GPU_SHARE: weights under 60 % of one GPU leave
# room for a useful KV cache on that GPU, so splitting them only adds communication (DOMAIN §2).
FITS_ONE_GPU_SHARE = 0.6


def _length_refusals(run: RunFacts) -> tuple[int, int]:
    """(requests refused for length, longest request they needed or 0)."""
    refused, needed = 0, 0
    for message, count in run.errors_by_message.items():
        lowered = message.lower()
        if not any(words in lowered for words in LENGTH_REFUSALS):
            continue
        refused += count
        prompt = next((int(g) for m in _INPUT.finditer(message) for g in m.groups() if g), 0)
        asked = next((int(g) for m in _REQUESTED.finditer(message) for g in m.groups() if g), 0)
        needed = max(needed, prompt + (asked or 1) if prompt else asked)
    return refused, needed


@rule("length-rejections")
def length_rejections(s: Snapshot) -> Iterator[Finding]:
    context_flag = flag(s, CONTEXT)
    run = current_run(s)
    if run is None or context_flag is None:
        return
    total = run.completed + run.failed
    refused, needed = _length_refusals(run)
    if not total or not refused:
        return
    share = refused / total
    if share < LENGTH_REJECT_SHARE_MIN:
        return
    current = s.config.max_model_len
    p99 = total_p99(run.lengths) if run.lengths is not None else None
    longest = max(needed, p99 or 0)
    new = text.pow2_up(longest) if longest else None
    if current and new and new > current:
        how = (
            f"the longest request refused needed {text.tokens(needed)}"
            if needed >= (p99 or 0)
            else f"the run's p99 prompt + output is {text.tokens(p99)}"
        )
        settings = {context_flag: new}
        batched = s.config.max_num_batched_tokens
        if s.config.engine == "vllm" and s.config.chunked_prefill is False and batched:
            if batched < new:
                # Unchunked, vLLM refuses a step budget under the context (vllm.py check).
                settings["max_num_batched_tokens"] = new
        suggestion = Suggestion(
            settings=settings,
            action=(
                f"Raise {context_flag} from {current:,} to {new:,} ({how}, rounded up to a "
                "power of two), if the model supports that length; longer contexts take more "
                "KV cache per request. Otherwise cap prompt length on the client "
                "(summarise old turns, send only the needed parts of documents)."
            ),
        )
    else:
        suggestion = Suggestion(
            action=(
                "Cap prompt + max_tokens on the client to the context length (summarise old "
                "turns, send only the needed parts of documents), or serve these requests "
                "from a deployment with a longer context."
            )
        )
    limit = f" (limit {current:,} tokens)" if current else ""
    yield Finding(
        rule="length-rejections",
        severity=CRITICAL if share >= LENGTH_REJECT_CRITICAL else WARNING,
        title="Requests are refused for exceeding the context length",
        seen=(
            f"{refused:,} of {total:,} requests ({text.pct(share)}) in run {run.run_id} were "
            f"refused for length{limit}"
            + (f"; the longest needed {text.tokens(needed)}" if needed else "")
            + "."
        ),
        why=(
            "Each refusal is a user who got an error instead of an answer, and a benchmark's "
            "speed counts them as fast: the context length is below what the traffic needs."
        ),
        evidence={
            "refused": refused,
            "requests": total,
            "share": share,
            "max_model_len": current,
            "longest_needed": needed or None,
            "total_p99": p99,
        },
        source=f"run {run.run_id}",
        suggestion=suggestion,
    )


@rule("max-model-len-oversized")
def max_model_len_oversized(s: Snapshot) -> Iterator[Finding]:
    context_flag = flag(s, CONTEXT)
    current = s.config.max_model_len
    found = lengths(s)
    if context_flag is None or not current or current <= 0 or found is None:
        return
    facts, where = found
    p99 = total_p99(facts)
    if not p99 or current <= CONTEXT_HEADROOM * p99:
        return
    run = current_run(s)
    if run is not None and _length_refusals(run)[0]:
        return  # some requests need more than it allows: length-rejections says the opposite
    new = text.pow2_up(p99 * CONTEXT_MARGIN)
    if new >= current:
        return
    yield Finding(
        rule="max-model-len-oversized",
        severity=INFO,
        title=f"{context_flag} is far above the longest requests",
        seen=(
            f"{context_flag} is {current:,} tokens, {current / p99:.0f}× the p99 prompt + "
            f"output of {text.tokens(p99)} ({where})."
        ),
        why=(
            "The engine sizes admission and reserves KV cache for the longest request it "
            "accepts; a length far above what comes leaves less room for concurrent requests."
        ),
        evidence={
            "max_model_len": current,
            "total_p99": p99,
            "ratio": current / p99,
            "from": where,
        },
        source=where,
        suggestion=Suggestion(
            settings={context_flag: new},
            action=(
                f"Lower {context_flag} from {current:,} to {new:,}: the p99 "
                f"({text.tokens(p99)}) plus a {text.pct(CONTEXT_MARGIN - 1)} margin, rounded "
                "up to a power of two. Longer requests would then be refused: check the "
                "traffic's longest requests first."
            ),
        ),
    )


def _oom_errors(s: Snapshot) -> int:
    run = current_run(s)
    if run is None:
        return 0
    return sum(
        n
        for message, n in run.errors_by_message.items()
        if any(w in message.lower() for w in OOM_WORDS)
    )


@rule("no-memory-headroom")
def no_memory_headroom(s: Snapshot) -> Iterator[Finding]:
    memory_flag = flag(s, MEMORY)
    fraction = s.config.memory_fraction
    if memory_flag is None or fraction is None or fraction <= MEMORY_FRACTION_LIMIT:
        return
    ooms = _oom_errors(s)
    used = [
        g.memory_used_bytes / g.memory_total_bytes
        for g in s.gpus
        if g.memory_used_bytes and g.memory_total_bytes
    ]
    in_use = f"; GPU memory in use peaks at {text.pct(max(used))}" if used else ""
    oom = f"; {ooms:,} requests failed out of memory in the newest run" if ooms else ""
    yield Finding(
        rule="no-memory-headroom",
        severity=CRITICAL if ooms else WARNING,
        title=f"{memory_flag} leaves no memory headroom",
        seen=f"{memory_flag} is {fraction:g} (above {MEMORY_FRACTION_LIMIT:g}) in the running "
        f"config{in_use}{oom} {text.telemetry(s.telemetry_seconds)}.",
        why=(
            "Weights and KV cache take nearly all GPU memory, so a burst of long prompts, a "
            "CUDA graph capture or another process on the GPU fails with out-of-memory "
            "instead of slowing down."
        ),
        evidence={
            "memory_fraction": fraction,
            "limit": MEMORY_FRACTION_LIMIT,
            "memory_used_share_max": max(used) if used else None,
            "oom_errors": ooms,
        },
        source="config",
        suggestion=Suggestion(
            settings={memory_flag: MEMORY_FRACTION_SAFE},
            action=(
                f"Lower {memory_flag} from {fraction:g} to {MEMORY_FRACTION_SAFE:g}, leaving "
                f"{text.pct(1 - MEMORY_FRACTION_SAFE)} of each GPU free; the KV cache shrinks "
                "by that much, so compare concurrency before and after."
            ),
        ),
    )


@rule("tp-unneeded")
def tp_unneeded(s: Snapshot) -> Iterator[Finding]:
    tp_flag = flag(s, TP)
    c = s.config
    memories = [g.memory_total_bytes for g in s.gpus if g.memory_total_bytes]
    if tp_flag is None or c.tensor_parallel <= 1 or not c.weights_bytes or not memories:
        return
    one_gpu = min(memories)
    share = c.weights_bytes / one_gpu
    if share >= FITS_ONE_GPU_SHARE:
        return
    yield Finding(
        rule="tp-unneeded",
        severity=INFO,
        title=f"Tensor parallelism ({c.tensor_parallel} GPUs) on a model that fits one",
        seen=(
            f"The weights of {c.model} take {text.gib(c.weights_bytes)}, {text.pct(share)} of "
            f"one GPU's {text.gib(one_gpu)}, and {tp_flag} is {c.tensor_parallel} in the "
            "running config."
        ),
        why=(
            "Tensor parallelism exchanges activations between GPUs on every layer; for a "
            "model that fits one GPU, one replica per GPU often serves more at lower latency "
            "(DOMAIN §2: compare against a single GPU)."
        ),
        evidence={
            "weights_bytes": c.weights_bytes,
            "gpu_memory_bytes": one_gpu,
            "weights_share": share,
            "tensor_parallel": c.tensor_parallel,
        },
        source="config",
        suggestion=Suggestion(
            settings={tp_flag: 1},
            action=(
                f"Benchmark {tp_flag} 1 against {c.tensor_parallel} with the same profile; if "
                f"it holds, run {c.tensor_parallel} one-GPU replicas behind a load balancer."
            ),
        ),
    )
