"""What several rules share: the engines' flag names for one idea, and where a rule finds
its numbers (the live window, the newest run of the running config). Pure: no Django."""

from __future__ import annotations

from collections.abc import Iterator

from changes.advisor.facts import EngineWindow, LengthFacts, RunFacts, Snapshot

# One idea, each engine's dest for it (hosts/engines/vllm.py and sglang.py FLAGS).
SEQS = {"vllm": "max_num_seqs", "sglang": "max_running_requests"}
CONTEXT = {"vllm": "max_model_len", "sglang": "context_length"}
MEMORY = {"vllm": "gpu_memory_utilization", "sglang": "mem_fraction_static"}
TP = {"vllm": "tensor_parallel_size", "sglang": "tp_size"}
# vLLM's per-step token budget; SGLang's prefill chunk (its -1 turns chunking off).
BATCHED = {"vllm": "max_num_batched_tokens", "sglang": "chunked_prefill_size"}
# The FP8 KV-cache value each accepts (vllm.KV_CACHE_DTYPES, sglang.KV_CACHE_DTYPES).
FP8_KV = {"vllm": "fp8", "sglang": "fp8_e4m3"}
# Weight quantisation both accept on an unquantised checkpoint (online FP8).
FP8_WEIGHTS = "fp8"
# KV dtypes already at 8 bits: nothing left to halve.
FP8_KV_DTYPES = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2"})


def flag(snapshot: Snapshot, table: dict[str, str]) -> str | None:
    """The deployment's engine's dest for an idea, or None for an engine we do not know."""
    return table.get(snapshot.config.engine)


def current_run(snapshot: Snapshot) -> RunFacts | None:
    """The newest run made with the config that runs now: what its numbers say still holds."""
    return next((run for run in snapshot.runs if run.config_current), None)


def windows(snapshot: Snapshot) -> Iterator[EngineWindow]:
    """The engine-metric windows a rule may read, most telling first: the live one, then the
    server side of the newest run of the running config (a peak stage shows what live
    traffic may not have reached yet)."""
    if snapshot.engine is not None:
        yield snapshot.engine
    run = current_run(snapshot)
    if run is not None and run.server is not None:
        yield run.server


def tokens_per_request(w: EngineWindow) -> float | None:
    """Mean prompt + generated tokens per finished request in a window."""
    if not w.requests or w.prompt_tokens is None or w.generation_tokens is None:
        return None
    return (w.prompt_tokens + w.generation_tokens) / w.requests


def prompt_per_request(w: EngineWindow) -> float | None:
    if not w.requests or w.prompt_tokens is None:
        return None
    return w.prompt_tokens / w.requests


def hit_rate(w: EngineWindow) -> float | None:
    """The prefix cache's hit rate: the engine's own, else hits / queries."""
    if w.hit_rate is not None:
        return w.hit_rate
    if w.prefix_cache_queries and w.prefix_cache_hits is not None:
        return w.prefix_cache_hits / w.prefix_cache_queries
    return None


def lengths(snapshot: Snapshot) -> tuple[LengthFacts, str] | None:
    """The request lengths that stand for the deployment's traffic: a real traffic sample,
    else the newest run of the running config; with where they came from."""
    if snapshot.traffic is not None:
        return snapshot.traffic, "traffic sample"
    run = current_run(snapshot)
    if run is not None and run.lengths is not None:
        return run.lengths, f"run {run.run_id}"
    return None


def total_p99(facts: LengthFacts) -> float | None:
    """p99 of prompt + output per request; the sum of the two p99s when only they are known
    (an upper bound: the longest prompts are not always the longest answers)."""
    if facts.total_p99 is not None:
        return facts.total_p99
    if facts.input_p99 is not None and facts.output_p99 is not None:
        return facts.input_p99 + facts.output_p99
    return None
