"""Snapshots built by hand for the rule tests: ``healthy()`` is a deployment every rule
leaves alone (an 8B model on one H100, vLLM, a three-stage run of the running config), and
the ``with_*`` helpers change one part of it, so a test states only what it is about."""

from __future__ import annotations

from dataclasses import replace

from changes.advisor.facts import (
    ConfigFacts,
    EngineWindow,
    GpuFacts,
    HostFacts,
    LengthFacts,
    RunFacts,
    Snapshot,
    StageFacts,
)

GIB = 2**30
NOW = 1_790_000_000.0
H100 = "NVIDIA H100 80GB HBM3"
NODE0 = tuple(range(0, 32))
NODE1 = tuple(range(32, 64))


def config(engine: str = "vllm", **kw) -> ConfigFacts:
    base = dict(
        engine=engine,
        engine_version="0.11.0" if engine == "vllm" else "0.5.3",
        model="meta-llama/Llama-3.1-8B-Instruct",
        settings={},
        tensor_parallel=1,
        max_num_seqs=256,
        max_model_len=8192,
        max_num_batched_tokens=8192,
        chunked_prefill=True,
        prefix_caching=True,
        memory_fraction=0.9,
        kv_cache_dtype="auto",
        quantization=None,
        weights_bytes=16 * GIB,
        kv_bytes_per_token=131072,
        kv_capacity_tokens=400_000,
        cpus=tuple(range(0, 16)),
        numa_node=0,
    )
    base.update(kw)
    return ConfigFacts(**base)


def gpu(index: int = 0, **kw) -> GpuFacts:
    base = dict(
        index=index,
        model=H100,
        memory_total_bytes=80 * GIB,
        numa_node=0,
        utilization_pct=70.0,
        memory_used_bytes=int(0.9 * 80 * GIB),
        power_w=450.0,
        power_limit_w=700.0,
        temperature_c=62.0,
        sm_clock_mhz=1980.0,
        max_sm_clock_mhz=1980.0,
        clock_events={},
    )
    base.update(kw)
    return GpuFacts(**base)


def window(source: str = "live", **kw) -> EngineWindow:
    base = dict(
        seconds=60.0,
        ended_at=NOW,
        source=source,
        requests=600,
        running_mean=20.0,
        running_max=40.0,
        waiting_mean=0.0,
        waiting_max=0.0,
        kv_usage_mean=0.3,
        kv_usage_max=0.45,
        preemptions=0,
        prefix_cache_queries=600_000.0,
        prefix_cache_hits=360_000.0,
        hit_rate=0.6,
        queue_ms=5.0,
        prefill_ms=60.0,
        ttft_ms=80.0,
        itl_ms=12.0,
        prompt_tokens=600_000.0,
        generation_tokens=120_000.0,
    )
    base.update(kw)
    return EngineWindow(**base)


def stage(name: str, concurrency: int, **kw) -> StageFacts:
    base = dict(
        name=name,
        concurrency=concurrency,
        requests=300,
        error_rate=0.0,
        ttft_p50_ms=100.0,
        ttft_p95_ms=150.0,
        ttft_p99_ms=180.0,
        itl_p50_ms=10.0,
        itl_p95_ms=12.0,
        itl_p99_ms=14.0,
        output_tokens_per_s=1000.0,
        max_concurrent=concurrency,
    )
    base.update(kw)
    return StageFacts(**base)


STAGES = (
    stage("low", 1, ttft_p50_ms=100.0, ttft_p99_ms=180.0, itl_p50_ms=10.0),
    stage("normal", 16, ttft_p50_ms=150.0, ttft_p99_ms=300.0, itl_p50_ms=12.0),
    stage("peak", 64, ttft_p50_ms=250.0, ttft_p99_ms=600.0, itl_p50_ms=18.0),
)


def lengths(**kw) -> LengthFacts:
    base = dict(
        input_p50=1000.0,
        input_p99=3000.0,
        output_p50=200.0,
        output_p99=600.0,
        total_p99=3400.0,
        shared_prefix_share=0.3,
    )
    base.update(kw)
    return LengthFacts(**base)


def run(run_id: int = 12, **kw) -> RunFacts:
    base = dict(
        run_id=run_id,
        label="nightly",
        profile="chat v3",
        finished_at=NOW - 3600,
        status="succeeded",
        config_current=True,
        completed=900,
        failed=0,
        error_rate=0.0,
        errors_by_class={},
        errors_by_message={},
        warmup_requests=20,
        stages=STAGES,
        lengths=lengths(),
        server=window(f"run {run_id}", seconds=300.0, requests=900),
        output_tokens_per_s=3000.0,
        faster_than=None,
    )
    base.update(kw)
    return RunFacts(**base)


def host(**kw) -> HostFacts:
    base = dict(
        cpu_count=64,
        load_1m=10.0,
        cpu_util_pct=30.0,
        numa_cpus={0: NODE0, 1: NODE1},
    )
    base.update(kw)
    return HostFacts(**base)


def healthy(engine: str = "vllm") -> Snapshot:
    return Snapshot(
        deployment="gpu-01/chat",
        taken_at=NOW,
        config=config(engine),
        gpus=(gpu(0),),
        engine=window(),
        host=host(),
        runs=(run(),),
        traffic=lengths(),
        telemetry_seconds=300.0,
    )


# --- one change each ---------------------------------------------------------------------------
def with_config(s: Snapshot, **kw) -> Snapshot:
    return replace(s, config=replace(s.config, **kw))


def with_live(s: Snapshot, **kw) -> Snapshot:
    return replace(s, engine=replace(s.engine, **kw))


def with_gpus(s: Snapshot, **kw) -> Snapshot:
    return replace(s, gpus=tuple(replace(g, **kw) for g in s.gpus))


def with_host(s: Snapshot, **kw) -> Snapshot:
    return replace(s, host=replace(s.host, **kw))


def with_run(s: Snapshot, **kw) -> Snapshot:
    """Change the newest run."""
    return replace(s, runs=(replace(s.runs[0], **kw), *s.runs[1:]))


def with_server(s: Snapshot, **kw) -> Snapshot:
    """Change the newest run's server-side window."""
    return with_run(s, server=replace(s.runs[0].server, **kw))


def with_lengths(s: Snapshot, **kw) -> Snapshot:
    """Change the newest run's lengths (and the traffic's, so both still agree)."""
    s = with_run(s, lengths=replace(s.runs[0].lengths, **kw))
    return replace(s, traffic=replace(s.traffic, **kw)) if s.traffic is not None else s


# --- checking a finding ------------------------------------------------------------------------
def running_settings(c: ConfigFacts) -> dict:
    """The config's sizing as the engine's flags, so a suggestion is validated together with
    the values it must agree with (vLLM's max_num_batched_tokens ≥ max_num_seqs …)."""
    if c.engine == "vllm":
        out = {
            "max_num_seqs": c.max_num_seqs,
            "max_num_batched_tokens": c.max_num_batched_tokens,
            "max_model_len": c.max_model_len,
            "enable_chunked_prefill": c.chunked_prefill,
            "enable_prefix_caching": c.prefix_caching,
            "gpu_memory_utilization": c.memory_fraction,
            "kv_cache_dtype": c.kv_cache_dtype,
            "tensor_parallel_size": c.tensor_parallel,
            "quantization": c.quantization,
        }
    else:
        out = {
            "max_running_requests": c.max_num_seqs,
            "context_length": c.max_model_len,
            "chunked_prefill_size": c.max_num_batched_tokens if c.chunked_prefill else -1,
            "disable_radix_cache": None if c.prefix_caching is None else not c.prefix_caching,
            "mem_fraction_static": c.memory_fraction,
            "kv_cache_dtype": c.kv_cache_dtype,
            "tp_size": c.tensor_parallel,
            "quantization": c.quantization,
        }
    return {k: v for k, v in out.items() if v is not None}


def assert_valid(s: Snapshot, finding) -> None:
    """The finding is complete and its suggested settings are what the engine accepts."""
    from hosts.engines import get_spec

    assert finding.title and finding.seen and finding.why and finding.source
    assert finding.evidence
    assert finding.suggestion is not None
    assert finding.suggestion.action or finding.suggestion.settings
    settings = dict(finding.suggestion.settings)
    if settings:
        merged = {**running_settings(s.config), **settings}
        clean, errors = get_spec(s.config.engine).validate(
            merged, s.config.engine_version, gpu_count=max(1, len(s.gpus))
        )
        assert not errors, errors
        assert {k: clean.get(k) for k in settings} == settings


def one(s: Snapshot, rule_id: str):
    """The one finding ``rule_id`` raises for ``s``, checked complete and valid."""
    from changes.advisor.engine import evaluate

    found = evaluate(s, only=[rule_id])
    assert len(found) == 1 and found[0].rule == rule_id, found
    assert_valid(s, found[0])
    return found[0]


def none(s: Snapshot, rule_id: str) -> bool:
    from changes.advisor.engine import evaluate

    return evaluate(s, only=[rule_id]) == []
