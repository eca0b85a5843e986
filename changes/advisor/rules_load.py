"""Rules on how the engine copes with its load: where requests wait (queue, KV cache,
prefill, decode), the prefix cache, and the latency tail (DOMAIN.md §1, §3, §4). Pure."""

from __future__ import annotations

import math
from collections.abc import Iterator

from changes.advisor import text
from changes.advisor.facts import EngineWindow, Snapshot, StageFacts
from changes.advisor.findings import CRITICAL, INFO, WARNING, Finding, Suggestion
from changes.advisor.registry import rule
from changes.advisor.rules_common import (
    BATCHED,
    FP8_KV,
    FP8_KV_DTYPES,
    FP8_WEIGHTS,
    MEMORY,
    SEQS,
    current_run,
    flag,
    hit_rate,
    lengths,
    prompt_per_request,
    tokens_per_request,
    windows,
)

# --- queue-bound -------------------------------------------------------------------------------
# One request waiting on average over the window: below that a queue is a passing burst.
QUEUE_WAITING_MIN = 1.0
# Running at this share of max_num_seqs or more: the sequence cap is what stops admission
# (the scheduler admits nothing past it, DOMAIN §3).
SEQS_FULL_SHARE = 0.9
# Peak KV use below this: the cache had room for more sequences. Above it the engine is
# KV-bound instead, and raising the cap would only preempt (see kv-bound).
QUEUE_KV_ROOM = 0.8
# A mean queue wait from here is "seconds": users see it in TTFT now → critical.
QUEUE_CRITICAL_MS = 1000.0
# Size a new cap to fill the KV cache to at most this share: the rest absorbs requests
# longer than the mean (vLLM preempts a sequence when a step finds no free block).
KV_FILL_TARGET = 0.9

# --- kv-bound ----------------------------------------------------------------------------------
# Mean KV use from this share: admission waits for blocks to free (vLLM admits a sequence
# only when its blocks fit), so the cache, not compute, sets the batch (DOMAIN §1).
KV_FULL_MEAN = 0.9
# Preemptions in the window from which users are hurt: a preempted sequence is thrown out and
# recomputed, its latency doubled.
PREEMPTIONS_MIN = 1
# Memory fraction to raise to when there is room: changes.advice warns above 0.95 (no
# headroom), and 10 % stays for activations, CUDA graphs and the sampler.
MEMORY_FRACTION_RAISE_TO = 0.9
# GPU memory in use above the configured fraction by more than this share: something else
# holds memory on the GPU, so raising the fraction could fail at start.
OTHER_MEMORY_SLACK = 0.05

# --- prefill-bound -----------------------------------------------------------------------------
# Prefill's share of TTFT from which prompt processing, not queueing, makes the first token
# late (DOMAIN §1: split TTFT into queue and prefill).
PREFILL_SHARE_MIN = 0.5
# Mean TTFT below this is fine for an interactive service whatever it is made of.
PREFILL_TTFT_MIN_MS = 500.0
# Mean prompt from which prefill is long: half of vLLM's small-GPU budget (2048 tokens), so
# two such prompts fill one step.
LONG_PROMPT_TOKENS = 1024
# The largest prefill budget the advisor proposes: a bigger step lets one long prompt stall
# every running decode (DOMAIN §3); SGLang's own default on the biggest GPUs is 16384.
BATCHED_TOKENS_MAX = 16384
# The smallest: vLLM's default on small GPUs; below it prefills crawl.
BATCHED_TOKENS_MIN = 2048

# --- decode-bound ------------------------------------------------------------------------------
# Inter-token latency from this value is slow for a reader: 40 ms/token is 25 tokens/s per
# stream, the least a streaming UI needs to stay ahead of reading (DOMAIN §1: decode speed).
ITL_SLOW_MS = 40.0
# At this concurrency or below, batching is not what slows decode: each step streams all the
# weights for a handful of sequences, so it is memory-bandwidth-bound.
LOW_CONCURRENCY = 4

# --- prefix-cache ------------------------------------------------------------------------------
# Share of prompt tokens in prefixes shared with other requests from which a prefix cache pays
# (a 300-token system prompt in 1,500-token prompts is 0.2) (DOMAIN §3, §4).
SHARED_PREFIX_MIN = 0.2
# A hit rate under this share of the shared share: most reusable tokens are missed, so the
# prompt format varies between requests (DOMAIN §4: per-user variation defeats reuse).
HIT_RATE_OF_SHARED_MIN = 0.5

# --- tail-growth -------------------------------------------------------------------------------
# p99/p50 of TTFT at the heaviest stage from which the tail is overload, not noise: a healthy
# engine keeps p99 within 2-3× p50 (DOMAIN §1: spikes of overload live in the tail).
TAIL_RATIO_MAX = 3.0
# …and at least this many times the ratio at the lightest stage: it grows with load.
TAIL_GROWTH_MIN = 1.5
# …and a heaviest-stage p99 TTFT from this value: under 2 s a first token still reads as
# responsive in a chat, and a closed-loop stage that starts all its clients at once puts one
# wave of queued prefills into p99 (1.2 s in the simulator's healthy run) that is no overload.
TAIL_P99_MIN_MS = 2000.0


def _queue_finding(s: Snapshot, w: EngineWindow, seqs_flag: str) -> Finding | None:
    cap = s.config.max_num_seqs
    waiting, running = w.waiting_mean, w.running_max
    kv = w.kv_usage_max
    if cap is None or waiting is None or running is None or kv is None:
        return None
    if waiting < QUEUE_WAITING_MIN or running < SEQS_FULL_SHARE * cap or kv >= QUEUE_KV_ROOM:
        return None
    peak = running + (w.waiting_max if w.waiting_max is not None else waiting)
    want = text.pow2_up(peak)
    per_request = tokens_per_request(w)
    capacity = s.config.kv_capacity_tokens
    if capacity and per_request:
        holds = math.floor(capacity * KV_FILL_TARGET / per_request)
        bound = (
            f"{text.tokens(capacity)}; at {text.num(per_request)} tokens "
            f"per request {text.pct(KV_FILL_TARGET)} of it holds {holds:,} requests"
        )
    elif kv > 0:
        running_kv = w.running_mean if w.running_mean is not None else running
        kv_used = w.kv_usage_mean if w.kv_usage_mean else kv
        holds = math.floor(running_kv / kv_used * KV_FILL_TARGET)
        bound = (
            f"{text.num(running_kv)} running sequences used {text.pct(kv_used)} of the KV "
            f"cache, so {text.pct(KV_FILL_TARGET)} of it holds about {holds:,}"
        )
    else:
        return None
    new = min(want, holds)
    if new <= cap:
        return None  # the cache cannot hold more: that is kv-bound's finding, not this one
    settings = {seqs_flag: new}
    batched = s.config.max_num_batched_tokens
    if s.config.engine == "vllm" and batched is not None and batched < new:
        # vLLM refuses max_num_batched_tokens < max_num_seqs (vllm.py cross-check).
        settings["max_num_batched_tokens"] = new
    queue = f", each waiting {text.ms(w.queue_ms)} on average" if w.queue_ms else ""
    critical = (w.queue_ms or 0) >= QUEUE_CRITICAL_MS or waiting >= cap
    return Finding(
        rule="queue-bound",
        severity=CRITICAL if critical else WARNING,
        title=f"Requests queue at the {seqs_flag} cap while the KV cache has room",
        seen=(
            f"{text.num(waiting)} requests waiting on average (peak "
            f"{text.num(w.waiting_max if w.waiting_max is not None else waiting)}){queue} "
            f"{text.window(w)}, while up to {text.num(running)} of {cap} sequences ran and KV "
            f"use peaked at {text.pct(kv)}."
        ),
        why=(
            "The scheduler stops admitting at the sequence cap, not at the memory limit: "
            "requests wait in line although the GPU could batch them, and their TTFT carries "
            "the wait."
        ),
        evidence={
            "window_s": w.seconds,
            "waiting_mean": waiting,
            "waiting_max": w.waiting_max,
            "running_max": running,
            "max_num_seqs": cap,
            "kv_usage_max": kv,
            "queue_ms": w.queue_ms,
            "kv_holds_requests": holds,
        },
        source=w.source,
        suggestion=Suggestion(
            settings=settings,
            action=(
                f"Raise {seqs_flag} from {cap} to {new}: the peak of running + waiting "
                f"({text.num(peak)}) rounded up to a power of two is {want}, bounded by the KV "
                f"cache ({bound})."
            ),
        ),
    )


@rule("queue-bound")
def queue_bound(s: Snapshot) -> Iterator[Finding]:
    seqs_flag = flag(s, SEQS)
    if seqs_flag is None:
        return
    for w in windows(s):
        found = _queue_finding(s, w, seqs_flag)
        if found is not None:
            yield found
            return


def _other_memory(s: Snapshot) -> bool:
    """Whether some GPU holds more memory than the engine's fraction explains."""
    fraction = s.config.memory_fraction or 0
    for gpu in s.gpus:
        if gpu.memory_used_bytes and gpu.memory_total_bytes:
            if gpu.memory_used_bytes / gpu.memory_total_bytes > fraction + OTHER_MEMORY_SLACK:
                return True
    return False


def _kv_fix(s: Snapshot, w: EngineWindow) -> Suggestion:
    """One change at a time (DOMAIN §5), the least risky first: more memory for the cache,
    then an 8-bit cache, then fewer sequences; else a non-config action."""
    c = s.config
    memory_flag, seqs_flag, kv_dtype = flag(s, MEMORY), flag(s, SEQS), flag(s, FP8_KV)
    others = (
        "Other ways out: an FP8 KV cache, a lower max model length, fewer concurrent "
        "sequences, or tensor parallelism over more GPUs."
    )
    fraction = c.memory_fraction
    if memory_flag and fraction is not None and fraction < MEMORY_FRACTION_RAISE_TO:
        if not _other_memory(s):
            return Suggestion(
                settings={memory_flag: MEMORY_FRACTION_RAISE_TO},
                action=(
                    f"Raise {memory_flag} from {fraction:g} to {MEMORY_FRACTION_RAISE_TO:g}: "
                    f"GPU memory beyond the weights goes to the KV cache, and "
                    f"{text.pct(1 - MEMORY_FRACTION_RAISE_TO)} stays free for activations. "
                    + others
                ),
            )
    if kv_dtype and c.kv_cache_dtype is not None and c.kv_cache_dtype not in FP8_KV_DTYPES:
        return Suggestion(
            settings={"kv_cache_dtype": kv_dtype},
            action=(
                f"Store the KV cache in FP8 (kv_cache_dtype {c.kv_cache_dtype} → {kv_dtype}): "
                "half the bytes per token, about twice the tokens in the same memory. Check "
                "answer quality on representative prompts first (DOMAIN §4)."
            ),
        )
    per_request = tokens_per_request(w)
    if seqs_flag and c.max_num_seqs and c.kv_capacity_tokens and per_request:
        holds = math.floor(c.kv_capacity_tokens * KV_FILL_TARGET / per_request)
        new = text.pow2_down(holds)
        if new < c.max_num_seqs:
            return Suggestion(
                settings={seqs_flag: new},
                action=(
                    f"Lower {seqs_flag} from {c.max_num_seqs} to {new}: the KV cache holds "
                    f"{text.tokens(c.kv_capacity_tokens)}, at {text.num(per_request)} tokens "
                    f"per request {text.pct(KV_FILL_TARGET)} of it holds {holds:,} requests "
                    "(rounded down to a power of two). Fewer run at once, none is preempted."
                ),
            )
    return Suggestion(
        action=(
            "The KV cache is full at this load with the memory and dtype it has: spread the "
            "model over more GPUs (tensor parallelism) or use a GPU with more memory, or "
            "lower the max model length to what requests need."
        )
    )


@rule("kv-bound")
def kv_bound(s: Snapshot) -> Iterator[Finding]:
    for w in windows(s):
        preempted = w.preemptions is not None and w.preemptions >= PREEMPTIONS_MIN
        full = w.kv_usage_mean is not None and w.kv_usage_mean >= KV_FULL_MEAN
        if not (preempted or full):
            continue
        parts = []
        if w.kv_usage_mean is not None:
            peak = f" (peak {text.pct(w.kv_usage_max)})" if w.kv_usage_max is not None else ""
            parts.append(f"KV cache use averaged {text.pct(w.kv_usage_mean)}{peak}")
        if w.preemptions:
            parts.append(f"{w.preemptions:,} sequences were preempted")
        if w.waiting_mean:
            parts.append(f"{text.num(w.waiting_mean)} requests waited on average")
        yield Finding(
            rule="kv-bound",
            severity=CRITICAL if preempted else WARNING,
            title="The KV cache is full" + (": sequences are preempted" if preempted else ""),
            seen="; ".join(parts) + f" {text.window(w)}.",
            why=(
                "When the cache is full the engine stops admitting requests, and when a running "
                "sequence needs a block there is none: it is preempted and its prompt "
                "recomputed later, so latency jumps for the users it hits."
            ),
            evidence={
                "window_s": w.seconds,
                "kv_usage_mean": w.kv_usage_mean,
                "kv_usage_max": w.kv_usage_max,
                "preemptions": w.preemptions,
                "waiting_mean": w.waiting_mean,
                "memory_fraction": s.config.memory_fraction,
                "kv_cache_dtype": s.config.kv_cache_dtype,
                "kv_capacity_tokens": s.config.kv_capacity_tokens,
            },
            source=w.source,
            suggestion=_kv_fix(s, w),
        )
        return


def _budget_for(prompt: float) -> int:
    return max(BATCHED_TOKENS_MIN, min(BATCHED_TOKENS_MAX, text.pow2_up(prompt)))


def _prefill_fix(s: Snapshot, prompt: float, prompt_words: str) -> Suggestion:
    c = s.config
    budget_flag = flag(s, BATCHED)
    if c.chunked_prefill is False and budget_flag:
        if c.engine == "vllm":
            settings = {"enable_chunked_prefill": True}
            how = "Turn chunked prefill on (enable_chunked_prefill)"
        else:
            settings = {budget_flag: _budget_for(prompt)}
            how = f"Turn chunked prefill on ({budget_flag} {settings[budget_flag]:,})"
        return Suggestion(
            settings=settings,
            action=(
                f"{how}: long prefills then share steps with running decodes instead of "
                f"holding the whole batch for a full prompt ({prompt_words})."
            ),
        )
    budget = c.max_num_batched_tokens
    if budget_flag and budget and budget < prompt:
        new = _budget_for(prompt)
        if new > budget:
            return Suggestion(
                settings={budget_flag: new},
                action=(
                    f"Raise {budget_flag} from {budget:,} to {new:,} ({prompt_words}, rounded "
                    f"up to a power of two, at most {BATCHED_TOKENS_MAX:,}): a prompt then "
                    "prefills in fewer steps. A bigger step lets long prompts delay short "
                    "requests' tokens (DOMAIN §3): compare ITL before and after."
                ),
            )
    return Suggestion(
        action=(
            "Prefill itself is the work: send shorter prompts (only the needed parts of "
            "documents, summarised history), let the prefix cache reuse shared parts, or give "
            "the model more compute (tensor parallelism, a faster GPU)."
        )
    )


@rule("prefill-bound")
def prefill_bound(s: Snapshot) -> Iterator[Finding]:
    run = current_run(s)
    for w in windows(s):
        if w.prefill_ms is None or not w.ttft_ms:
            continue
        share = w.prefill_ms / w.ttft_ms
        prompt = prompt_per_request(w)
        if prompt is None and run is not None and run.lengths is not None:
            prompt = run.lengths.input_p50
        if prompt is None:
            continue
        if (
            w.ttft_ms < PREFILL_TTFT_MIN_MS
            or share < PREFILL_SHARE_MIN
            or prompt < LONG_PROMPT_TOKENS
        ):
            continue
        prompt_words = f"a mean prompt of {text.tokens(prompt)}"
        yield Finding(
            rule="prefill-bound",
            severity=WARNING,
            title="Prompt processing (prefill) makes the first token late",
            seen=(
                f"TTFT averaged {text.ms(w.ttft_ms)}, of which prefill {text.ms(w.prefill_ms)} "
                f"({text.pct(share)}), with {prompt_words} {text.window(w)}."
            ),
            why=(
                "Time to first token is queue wait plus prefill; here the prompts themselves "
                "take the time, so more sequences or memory will not help, while the prefill "
                "budget and prompt length will."
            ),
            evidence={
                "window_s": w.seconds,
                "ttft_ms": w.ttft_ms,
                "prefill_ms": w.prefill_ms,
                "queue_ms": w.queue_ms,
                "prefill_share": share,
                "prompt_tokens_mean": prompt,
                "max_num_batched_tokens": s.config.max_num_batched_tokens,
                "chunked_prefill": s.config.chunked_prefill,
            },
            source=w.source,
            suggestion=_prefill_fix(s, prompt, prompt_words),
        )
        return


def _stage_load(stage: StageFacts) -> int | None:
    return stage.concurrency if stage.concurrency is not None else stage.max_concurrent


def _decode_fix(s: Snapshot) -> Suggestion:
    if s.config.quantization is None:
        return Suggestion(
            settings={"quantization": FP8_WEIGHTS},
            action=(
                "Quantise the weights to FP8 (quantization fp8): each decode step streams "
                "half the bytes, and at low concurrency that is most of the step. Validate "
                "accuracy and JSON-format compliance on representative queries first "
                "(DOMAIN §4)."
            ),
        )
    return Suggestion(
        action=(
            f"The weights are already quantised ({s.config.quantization}): a GPU with more "
            "memory bandwidth, or tensor parallelism to split each step, is what is left."
        )
    )


@rule("decode-bound")
def decode_bound(s: Snapshot) -> Iterator[Finding]:
    run = current_run(s)
    if run is not None:
        slow = [
            st
            for st in run.stages
            if st.itl_p50_ms is not None
            and st.itl_p50_ms >= ITL_SLOW_MS
            and _stage_load(st) is not None
            and _stage_load(st) <= LOW_CONCURRENCY
        ]
        if slow:
            st = min(slow, key=_stage_load)
            yield Finding(
                rule="decode-bound",
                severity=WARNING,
                title="Token generation is slow even at low concurrency",
                seen=(
                    f"ITL p50 {text.ms(st.itl_p50_ms)} ({1000 / st.itl_p50_ms:.0f} tokens/s "
                    f"per stream) at concurrency {_stage_load(st)} "
                    f"{text.stage(run.run_id, st.name)}."
                ),
                why=(
                    "With few sequences there is no batching to blame: every step reads all "
                    "the weights, so the GPU's memory bandwidth per byte of model sets the "
                    "speed each user sees."
                ),
                evidence={
                    "itl_p50_ms": st.itl_p50_ms,
                    "itl_p99_ms": st.itl_p99_ms,
                    "concurrency": _stage_load(st),
                    "stage": st.name,
                    "quantization": s.config.quantization,
                },
                source=f"run {run.run_id}",
                suggestion=_decode_fix(s),
            )
            return
    w = s.engine
    if w is None or w.itl_ms is None or w.running_mean is None:
        return
    if w.itl_ms >= ITL_SLOW_MS and w.running_mean <= LOW_CONCURRENCY:
        yield Finding(
            rule="decode-bound",
            severity=WARNING,
            title="Token generation is slow even at low concurrency",
            seen=(
                f"ITL averaged {text.ms(w.itl_ms)} ({1000 / w.itl_ms:.0f} tokens/s per "
                f"stream) with {text.num(w.running_mean)} sequences running {text.window(w)}."
            ),
            why=(
                "With few sequences there is no batching to blame: every step reads all the "
                "weights, so memory bandwidth per byte of model sets each user's speed."
            ),
            evidence={
                "window_s": w.seconds,
                "itl_ms": w.itl_ms,
                "running_mean": w.running_mean,
                "quantization": s.config.quantization,
            },
            source=w.source,
            suggestion=_decode_fix(s),
        )


@rule("prefix-cache")
def prefix_cache(s: Snapshot) -> Iterator[Finding]:
    found = lengths(s)
    if found is None or found[0].shared_prefix_share is None:
        return
    facts, where = found
    shared = facts.shared_prefix_share
    if shared < SHARED_PREFIX_MIN:
        return
    if s.config.prefix_caching is False:
        if s.config.engine == "vllm":
            settings = {"enable_prefix_caching": True}
        elif s.config.engine == "sglang":
            settings = {"disable_radix_cache": False}
        else:
            return
        yield Finding(
            rule="prefix-cache",
            severity=WARNING,
            title="Prefix caching is off while requests share prefixes",
            seen=f"{text.pct(shared)} of prompt tokens are in shared prefixes ({where}), "
            "and the prefix cache is off.",
            why=(
                "Every request recomputes the same system prompt or document: with the cache "
                "on, those tokens are prefilled once and reused, cutting TTFT and GPU work."
            ),
            evidence={"shared_prefix_share": shared, "prefix_caching": False, "from": where},
            source=where,
            suggestion=Suggestion(
                settings=settings,
                action="Turn the prefix cache on (" + ", ".join(settings) + ") and keep the "
                "shared part of the prompt first and byte-identical between requests.",
            ),
        )
        return
    for w in windows(s):
        rate = hit_rate(w)
        if rate is None or s.config.prefix_caching is None and not w.prefix_cache_queries:
            continue
        if rate >= HIT_RATE_OF_SHARED_MIN * shared:
            return
        yield Finding(
            rule="prefix-cache",
            severity=INFO,
            title="The prefix cache misses most of the shared prefixes",
            seen=(
                f"Prefix-cache hit rate {text.pct(rate)} {text.window(w)}, while "
                f"{text.pct(shared)} of prompt tokens are in shared prefixes ({where})."
            ),
            why=(
                "A prefix only hits when it is byte-identical and at the start: a timestamp, a "
                "user name or a reordered system prompt defeats reuse (DOMAIN §4)."
            ),
            evidence={"window_s": w.seconds, "hit_rate": rate, "shared_prefix_share": shared},
            source=w.source,
            suggestion=Suggestion(
                action=(
                    "Stabilise the prompt format: put the shared system prompt and documents "
                    "first, identical for every request, and move per-user or per-request "
                    "parts (names, dates, IDs) after them."
                )
            ),
        )
        return


def _ordered_stages(stages: tuple[StageFacts, ...]) -> list[StageFacts]:
    """Stages from the lightest load to the heaviest: by request rate when every stage has
    one (a rate-driven stage's concurrency is only its cap), else by concurrency, else in the
    profile's order (low → normal → peak, DOMAIN §5)."""
    if all(st.request_rate is not None for st in stages):
        return sorted(stages, key=lambda st: st.request_rate)
    if all(_stage_load(st) is not None for st in stages):
        return sorted(stages, key=_stage_load)
    return list(stages)


@rule("tail-growth")
def tail_growth(s: Snapshot) -> Iterator[Finding]:
    run = current_run(s)
    if run is None:
        return
    stages = [st for st in run.stages if st.ttft_p50_ms and st.ttft_p99_ms is not None]
    if len(stages) < 2:
        return
    stages = _ordered_stages(tuple(stages))
    low, high = stages[0], stages[-1]
    low_ratio = low.ttft_p99_ms / low.ttft_p50_ms
    high_ratio = high.ttft_p99_ms / high.ttft_p50_ms
    if high_ratio < TAIL_RATIO_MAX or high_ratio < TAIL_GROWTH_MIN * low_ratio:
        return
    if high.ttft_p99_ms < TAIL_P99_MIN_MS:
        return
    if s.config.chunked_prefill is False and s.config.engine == "vllm":
        suggestion = Suggestion(
            settings={"enable_chunked_prefill": True},
            action=(
                "Turn chunked prefill on: without it a long prompt holds a whole step and "
                "every request behind it waits, which is what a growing p99 looks like."
            ),
        )
    else:
        suggestion = Suggestion(
            action=(
                f"Hold the load under what stage {low.name} offered, or give interactive "
                "traffic a max queue wait and priorities and keep long and short requests in "
                "separate queues (DOMAIN §4); add replicas for the peak."
            )
        )
    yield Finding(
        rule="tail-growth",
        severity=WARNING,
        title="The TTFT tail grows with load",
        seen=(
            f"TTFT p99/p50 went from {low_ratio:.1f}× (p50 {text.ms(low.ttft_p50_ms)}, p99 "
            f"{text.ms(low.ttft_p99_ms)}) at stage {low.name} to {high_ratio:.1f}× (p50 "
            f"{text.ms(high.ttft_p50_ms)}, p99 {text.ms(high.ttft_p99_ms)}) at stage "
            f"{high.name}, in run {run.run_id}."
        ),
        why=(
            "When p99 grows faster than p50, a minority of requests queue behind others: the "
            "median looks fine while one user in a hundred waits many times longer."
        ),
        evidence={
            "stages": [
                {"name": st.name, "ttft_p50_ms": st.ttft_p50_ms, "ttft_p99_ms": st.ttft_p99_ms}
                for st in stages
            ],
            "low_ratio": low_ratio,
            "high_ratio": high_ratio,
        },
        source=f"run {run.run_id}",
        suggestion=suggestion,
    )
