"""The scenarios and their row of the confusion matrix: each builds one deployment's Snapshot
from a simulated run (changes.advisor.scenarios.simulate) plus, where the simulator models
nothing, its own explicit condition (said in its docstring)."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from functools import cache

from changes.advisor.facts import HostFacts, LengthFacts, RunFacts, Snapshot
from changes.advisor.findings import CRITICAL, WARNING
from changes.advisor.scenarios.simulate import (
    CHAT_IN,
    CHAT_OUT,
    EPOCH,
    NUMA_CPUS,
    Dist,
    Sent,
    SimRun,
    Stage,
    chat_stages,
    config_facts,
    engine_window,
    gpu_facts,
    length_facts,
    run_facts,
    simulate,
)

# --- the scenarios -------------------------------------------------------------------------

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
# The demo fleet's llama-8b deployment, config v1 (hosts/demo.py FLEET; not imported: that
# module is Django's side).
DEMO_SETTINGS = {"gpu_memory_utilization": 0.9, "max_num_seqs": 256, "max_model_len": 8192}
CHAT = "Interactive chat v1"


def snapshot(
    name: str,
    run: SimRun,
    model: str = LLAMA_8B,
    profile: str = CHAT,
    warmup: int = 8,
    numa_node: int = 0,
    host: HostFacts | None = None,
    traffic: LengthFacts | None = None,
    runs: tuple[RunFacts, ...] = (),
    run_id: int = 1,
) -> Snapshot:
    """The deployment as the panel sees it after ``run``: the live window is the run's last
    stage (the deployment serving that load now), the latest run is the whole of it."""
    last = [run.stages[-1][1]]
    latest = run_facts(run, run_id, f"{name} #{run_id}", profile, warmup)
    return Snapshot(
        deployment=f"sim-h100-01/{name}",
        taken_at=EPOCH + last[0].end,
        config=config_facts(run, model, cpus=NUMA_CPUS[numa_node], numa_node=numa_node),
        gpus=gpu_facts(run, last),
        engine=engine_window(last, "live"),
        host=host or HostFacts(cpu_count=64, load_1m=6.0, cpu_util_pct=9.0, numa_cpus=NUMA_CPUS),
        runs=(latest, *runs),
        traffic=traffic,
        telemetry_seconds=round(last[0].end - last[0].start, 3),
    )


def sample_lengths(
    n: int, input_len: Dist, output_len: Dist, seed: int, prefix_len: int = 0, share: float = 0
) -> LengthFacts:
    """A traffic sample's lengths: ``n`` requests drawn from the distributions."""
    rng = random.Random(seed)  # noqa: S311 - workload lengths, not secrets
    items = []
    for _ in range(n):
        prefix = prefix_len if prefix_len and rng.random() < share else 0
        items.append(Sent(None, input_len.sample(rng) + prefix, output_len.sample(rng), prefix))
    return length_facts(items)


def healthy() -> Snapshot:
    """The demo's Llama-3.1-8B on one H100 (config v1: memory fraction 0.9, 256 sequences,
    8,192-token context) under the built-in chat profile (low 4, normal 16, peak 48
    concurrent; 8 warm-up requests excluded), the engine pinned to the GPU's NUMA node, a
    quiet host, and a traffic sample that looks like the profile. Nothing is wrong."""
    run = simulate(LLAMA_8B, DEMO_SETTINGS, "h100-sxm", chat_stages(), num_gpus=2, warmup=8)
    return snapshot("healthy", run, traffic=sample_lengths(400, CHAT_IN, CHAT_OUT, seed=7))


def max_num_seqs_4() -> Snapshot:
    """The demo deployment with ``--max-num-seqs 4`` under the chat profile: at peak (48
    clients) 4 sequences run, ~40 requests wait for seconds, and the KV cache is 1 % used."""
    settings = dict(DEMO_SETTINGS, max_num_seqs=4)
    run = simulate(LLAMA_8B, settings, "h100-sxm", chat_stages(), num_gpus=2, warmup=8)
    return snapshot("max-num-seqs-4", run)


# "Long prompts": RAG-like, 3-6k tokens, within the demo's 8,192-token context.
LONG_IN = Dist("uniform", 4500, 0, 3000, 6000)
LONG_OUT = Dist("normal", 200, 60, 32, 512)


def low_memory_long_prompts() -> Snapshot:
    """``--gpu-memory-utilization 0.5`` (KV for ~190k tokens instead of ~455k) with 3-6k-token
    prompts at 16 then 48 concurrent clients: the cache fills, running requests are preempted
    and recomputed, and requests queue behind it."""
    stages = (
        Stage("normal", 60, LONG_IN, LONG_OUT, concurrency=16),
        Stage("peak", 160, LONG_IN, LONG_OUT, concurrency=48),
    )
    settings = dict(DEMO_SETTINGS, gpu_memory_utilization=0.5)
    run = simulate(LLAMA_8B, settings, "h100-sxm", stages, num_gpus=2, warmup=4)
    return snapshot("memory-0.5-long-prompts", run, profile="Long prompts v1", warmup=4)


# The built-in "RAG long-prompt" profile's lengths (benchmarks/loadgen/profile.py BUILTINS).
RAG_IN = Dist("uniform", 6000, 0, 4000, 8000)
RAG_OUT = Dist("normal", 200, 60, 32, 512)


def long_prompts_small_budget() -> Snapshot:
    """Llama-3.1-8B on an A100-80GB (half the H100's prefill FLOP/s) with a 16,384-token
    context and ``--max-num-batched-tokens 512``, serving the RAG profile's 4-8k-token prompts
    at 1 request/s (Poisson): each prompt is prefilled in 8-16 chunks that share the budget
    with decodes, so the prefill, not the queue, makes most of a ~0.7 s time to first token."""
    stages = (Stage("steady", 90, RAG_IN, RAG_OUT, request_rate=1.0, max_concurrency=64),)
    settings = dict(DEMO_SETTINGS, max_model_len=16384, max_num_batched_tokens=512)
    run = simulate(LLAMA_8B, settings, "a100-80g", stages, num_gpus=1, warmup=4)
    snap = snapshot("small-token-budget", run, profile="RAG steady v1", warmup=4)
    return replace(snap, deployment="sim-a100-01/small-token-budget")


SYSTEM_PROMPT_IN = Dist("normal", 300, 100, 16, 1024)
SYSTEM_PROMPT_OUT = Dist("fixed", 150)


def _shared_prompt(prefix_caching: bool) -> SimRun:
    stages = (
        Stage(
            "main",
            300,
            SYSTEM_PROMPT_IN,
            SYSTEM_PROMPT_OUT,
            concurrency=32,
            prefix_len=2000,
            prefix_groups=4,
            prefix_share=0.9,
        ),
    )
    settings = dict(DEMO_SETTINGS, enable_prefix_caching=prefix_caching)
    return simulate(LLAMA_8B, settings, "h100-sxm", stages, num_gpus=2, warmup=8)


def prefix_caching_off() -> Snapshot:
    """``--no-enable-prefix-caching`` under the built-in shared-system-prompt profile (90 % of
    requests open with one of 4 system prompts of 2,000 tokens): every prompt is recomputed,
    hit rate 0 %."""
    run = _shared_prompt(False)
    return snapshot("prefix-caching-off", run, profile="Shared system prompt v1")


def prefix_caching_on() -> Snapshot:
    """The same shared-system-prompt load with prefix caching on (vLLM's default): the shared
    blocks are reused. The prefix-cache rule must stay quiet."""
    run = _shared_prompt(True)
    return snapshot("prefix-caching-on", run, profile="Shared system prompt v1")


def numa_mismatch() -> Snapshot:
    """The demo deployment under the chat profile with the engine process pinned to NUMA
    node 1's CPUs (32-63) while its GPU hangs off node 0. The simulator does not model the
    cost, so it is this scenario's condition: every step pays 1.5 ms more of host work
    (tokenising, scheduling and copies over the socket link), which the GPU waits for."""
    run = simulate(
        LLAMA_8B, DEMO_SETTINGS, "h100-sxm", chat_stages(), num_gpus=2, warmup=8, cpu_stall_s=1.5e-3
    )
    return snapshot("numa-mismatch", run, numa_node=1)


def power_capped() -> Snapshot:
    """The demo deployment under the chat profile on an H100 whose power limit is set to
    350 W of its 700 W TDP (``nvidia-smi -pl 350``; the simulator's GPU has no limit of its
    own, so this is the scenario's condition): the simulated telemetry's draw is held at the
    limit with sw_power_cap set and the SM clock lowered as (limit / draw)^(1/3), and the
    engine's compute runs at the clock the cap leaves."""
    run = simulate(
        LLAMA_8B, DEMO_SETTINGS, "h100-sxm", chat_stages(), num_gpus=2, warmup=8, power_cap_w=350
    )
    return snapshot("power-capped", run)


def oversized_context() -> Snapshot:
    """``--max-model-len 32768`` for traffic whose longest requests (p99 prompt + output) are
    ~1,500 tokens: short prompts (200-1,200) and answers (~150) at 16 then 48 clients."""
    short_in, short_out = Dist("uniform", 700, 0, 200, 1200), Dist("normal", 150, 50, 30, 300)
    stages = (
        Stage("normal", 120, short_in, short_out, concurrency=16),
        Stage("peak", 240, short_in, short_out, concurrency=48),
    )
    settings = dict(DEMO_SETTINGS, max_model_len=32768)
    run = simulate(LLAMA_8B, settings, "h100-sxm", stages, num_gpus=2, warmup=8)
    return snapshot("max-model-len-32768", run, profile="Short chat v1")


# A context the chat profile's long tail does not fit in: ~27 % of its requests ask for more.
SHORT_CONTEXT = 1152


def length_rejections() -> Snapshot:
    """``--max-model-len 1152`` under the chat profile (prompts up to 4,096, answers up to
    1,024 tokens): about a quarter of the requests are refused with vLLM's 400 "maximum
    context length" message. Run 2 looks faster than run 1 (the demo config's, no errors)
    only because the long requests it refused took no time."""
    before = simulate(LLAMA_8B, DEMO_SETTINGS, "h100-sxm", chat_stages(), num_gpus=2, warmup=8)
    settings = dict(DEMO_SETTINGS, max_model_len=SHORT_CONTEXT)
    after = simulate(LLAMA_8B, settings, "h100-sxm", chat_stages(), num_gpus=2, warmup=8)
    earlier = run_facts(before, 1, "length-rejections #1", CHAT, 8, config_current=False)
    snap = snapshot("length-rejections", after, runs=(earlier,), run_id=2)
    latest = snap.runs[0]
    faster = (latest.stages[-1].ttft_p95_ms or 0) < (earlier.stages[-1].ttft_p95_ms or 0)
    return replace(snap, runs=(replace(latest, faster_than=1 if faster else None), earlier))


def memory_fraction_098() -> Snapshot:
    """``--gpu-memory-utilization 0.98`` on the demo deployment under the chat profile: it
    starts and serves, with ~0.4 GiB of the 80 GiB left for anything else."""
    settings = dict(DEMO_SETTINGS, gpu_memory_utilization=0.98)
    run = simulate(LLAMA_8B, settings, "h100-sxm", chat_stages(), num_gpus=2, warmup=8)
    return snapshot("memory-0.98", run)


def tp2_small_model() -> Snapshot:
    """Llama-3.1-8B (16 GB of weights) split over both H100s with ``--tensor-parallel-size
    2`` under the chat profile: it fits one GPU many times over, and every step pays two
    all-reduces per layer."""
    settings = dict(DEMO_SETTINGS, tensor_parallel_size=2)
    run = simulate(LLAMA_8B, settings, "h100-sxm", chat_stages(), num_gpus=2, warmup=8)
    return snapshot("tp2-8b", run)


def single_stream_slow_gpu() -> Snapshot:
    """Llama-3.1-8B in bf16 on an L4 (300 GB/s) serving one client at a time with long
    answers (200-token prompts, 512-token outputs): decode reads every weight per token,
    ~70 ms a token with nothing to batch."""
    stages = (Stage("single", 20, Dist("fixed", 200), Dist("fixed", 512), concurrency=1),)
    run = simulate(LLAMA_8B, DEMO_SETTINGS, "l4", stages, num_gpus=1, warmup=2)
    snap = snapshot("l4-single-stream", run, profile="Single stream v1", warmup=2)
    return replace(snap, deployment="sim-l4-01/l4-single-stream")


def cpu_starved() -> Snapshot:
    """The demo deployment under the chat profile on a host whose 64 CPUs are saturated by
    a co-located job (load 140, 99 % busy; the simulator has no CPU, so this is the
    scenario's condition), pinned correctly: every step waits 8 ms for the engine's host
    work, the GPU idles between steps while requests queue."""
    run = simulate(
        LLAMA_8B, DEMO_SETTINGS, "h100-sxm", chat_stages(), num_gpus=2, warmup=8, cpu_stall_s=8e-3
    )
    busy = HostFacts(cpu_count=64, load_1m=140.0, cpu_util_pct=99.0, numa_cpus=NUMA_CPUS)
    return snapshot("cpu-starved", run, host=busy)


def warmup_included() -> Snapshot:
    """The demo deployment's chat run with no warm-up requests: the first requests (CUDA
    graphs, caches cold) count in the results. The simulator has no cold start, so the
    condition is the run's warm-up count of 0."""
    run = simulate(LLAMA_8B, DEMO_SETTINGS, "h100-sxm", chat_stages(), num_gpus=2, warmup=0)
    return snapshot("warmup-included", run, warmup=0)


def client_limited_run() -> Snapshot:
    """The healthy deployment, and a newer run of it measured by a starved load generator
    (the machine busy): its numbers are the client's, so it is left out of the facts and
    said to be (``benchmarks.evidence``); nothing else is raised from it."""
    why = (
        "client-limited: event-loop lag p99 48 ms (max 210 ms) > 20 ms; ITL not measurable: "
        "64% of chunks carried several tokens (4100 of 6400; limit 20%)"
    )
    return replace(healthy(), refused_runs=((42, why),))


def bursty_overload() -> Snapshot:
    """Open-loop chat traffic in bursts (gamma shape 0.25) at 2, 5 then 8 requests/s on the
    demo deployment with ``--max-num-seqs 32``: the median stays under 0.2 s while the p99
    time to first token grows from 0.1 s to ~2.7 s (bursts queue behind the cap)."""
    stages = tuple(
        Stage(name, n, CHAT_IN, CHAT_OUT, request_rate=rate, max_concurrency=256, burstiness=0.25)
        for name, n, rate in (("low", 60, 2.0), ("normal", 150, 5.0), ("peak", 300, 8.0))
    )
    settings = dict(DEMO_SETTINGS, max_num_seqs=32)
    run = simulate(LLAMA_8B, settings, "h100-sxm", stages, num_gpus=2, warmup=8)
    return snapshot("bursty-tail", run, profile="Bursty chat v1")


def profile_unlike_traffic() -> Snapshot:
    """The demo deployment benchmarked with the chat profile (~600-token prompts) while its
    traffic sample (this scenario's condition: 400 requests as the panel would import them)
    is RAG: 3-6k-token prompts with short answers."""
    run = simulate(LLAMA_8B, DEMO_SETTINGS, "h100-sxm", chat_stages(), num_gpus=2, warmup=8)
    traffic = sample_lengths(400, LONG_IN, Dist("normal", 120, 40, 16, 400), seed=11)
    return snapshot("profile-unlike-traffic", run, traffic=traffic)


@dataclass(frozen=True)
class Scenario:
    """A scenario and its row of the confusion matrix."""

    build: object  # () -> Snapshot
    expect: frozenset[str]  # rule ids it must raise
    must_not: frozenset[str] = frozenset()  # rule ids it must not raise
    # The healthy scenario: no finding at these severities at all.
    quiet: frozenset[str] = frozenset()

    @property
    def doc(self) -> str:
        return (self.build.__doc__ or "").split("\n\n")[0].replace("\n", " ").strip()


def _s(build, expect=(), must_not=(), quiet=()) -> Scenario:
    return Scenario(build, frozenset(expect), frozenset(must_not), frozenset(quiet))


# "must not" lists only rules the scenario gives no honest reason to raise: a rule that may
# read the same symptom from another side (a starved CPU also queues requests; a power cap
# slows prefill) is left out of both lists for that scenario.
SCENARIOS: dict[str, Scenario] = {
    "healthy": _s(healthy, quiet=(CRITICAL, WARNING)),
    "max-num-seqs-4": _s(
        max_num_seqs_4,
        expect=("queue-bound",),
        must_not=("kv-bound", "no-memory-headroom", "cpu-bound", "numa-mismatch", "tp-unneeded"),
    ),
    "memory-0.5-long-prompts": _s(
        low_memory_long_prompts,
        expect=("kv-bound",),
        must_not=("queue-bound", "no-memory-headroom", "max-model-len-oversized"),
    ),
    "small-token-budget": _s(
        long_prompts_small_budget,
        expect=("prefill-bound",),
        must_not=("kv-bound", "decode-bound", "no-memory-headroom", "length-rejections"),
    ),
    "prefix-caching-off": _s(
        prefix_caching_off,
        expect=("prefix-cache",),
        must_not=("kv-bound", "no-memory-headroom", "numa-mismatch"),
    ),
    "prefix-caching-on": _s(
        prefix_caching_on, must_not=("prefix-cache", "kv-bound", "queue-bound")
    ),
    "numa-mismatch": _s(
        numa_mismatch,
        expect=("numa-mismatch",),
        must_not=("kv-bound", "gpu-throttled", "tp-unneeded", "no-memory-headroom"),
    ),
    "power-capped": _s(
        power_capped,
        expect=("gpu-throttled",),
        must_not=("numa-mismatch", "cpu-bound", "kv-bound", "no-memory-headroom"),
    ),
    "max-model-len-32768": _s(
        oversized_context,
        expect=("max-model-len-oversized",),
        must_not=("length-rejections", "kv-bound", "no-memory-headroom"),
    ),
    "length-rejections": _s(
        length_rejections,
        expect=("length-rejections", "errors-behind-speed"),
        must_not=("max-model-len-oversized", "kv-bound"),
    ),
    "memory-0.98": _s(
        memory_fraction_098,
        expect=("no-memory-headroom",),
        must_not=("kv-bound", "queue-bound", "numa-mismatch"),
    ),
    "tp2-8b": _s(
        tp2_small_model, expect=("tp-unneeded",), must_not=("kv-bound", "no-memory-headroom")
    ),
    "l4-single-stream": _s(
        single_stream_slow_gpu,
        # The 8,192-token context against a p99 of 712 tokens: true, and only advice (info).
        expect=("decode-bound", "max-model-len-oversized"),
        must_not=("queue-bound", "prefill-bound", "tp-unneeded", "prefix-cache"),
    ),
    "cpu-starved": _s(
        cpu_starved,
        expect=("cpu-bound",),
        must_not=("numa-mismatch", "gpu-throttled", "kv-bound", "no-memory-headroom"),
    ),
    "warmup-included": _s(
        warmup_included, expect=("warmup-included",), must_not=("kv-bound", "queue-bound")
    ),
    "client-limited-run": _s(
        client_limited_run,
        expect=("client-limited-run",),
        must_not=("warmup-included", "errors-behind-speed", "decode-bound"),
        quiet=(CRITICAL, WARNING),
    ),
    "bursty-tail": _s(
        bursty_overload,
        # 32 of 32 sequences running with 3.3 waiting on average and KV at 8 %: a true
        # queue-bound finding beside the tail.
        expect=("tail-growth", "queue-bound"),
        must_not=("kv-bound", "no-memory-headroom"),
    ),
    "profile-unlike-traffic": _s(
        profile_unlike_traffic,
        expect=("profile-unlike-traffic",),
        must_not=("queue-bound", "kv-bound", "length-rejections"),
    ),
}


@cache
def build(name: str) -> Snapshot:
    """A scenario's snapshot, built once per process (they are frozen and deterministic)."""
    return SCENARIOS[name].build()
