"""What the advisor reads about one deployment: plain frozen dataclasses, filled by the panel
(changes.services.diagnosis) from its database, its telemetry and a scrape of the engine, or by
tests from the simulator. A fact the panel could not get is None, and a rule that needs it says
nothing rather than guessing.

Units are in the names: ``_ms``, ``_s``, ``_bytes``, ``_pct`` (0-100), ``_w``, ``_mhz``;
shares and ratios (``kv_usage``, ``hit_rate``, ``error_rate``) are 0-1."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ConfigFacts:
    """The running config, with the engine's defaults filled in where the flag is unset."""

    engine: str  # "vllm" | "sglang"
    engine_version: str
    model: str
    settings: Mapping[str, Any]  # the config as stored: flag dest → value
    tensor_parallel: int = 1
    max_num_seqs: int | None = None  # vLLM max_num_seqs, SGLang max_running_requests
    max_model_len: int | None = None  # vLLM max_model_len, SGLang context_length
    max_num_batched_tokens: int | None = None  # SGLang: chunked_prefill_size
    chunked_prefill: bool | None = None
    prefix_caching: bool | None = None  # SGLang: not disable_radix_cache
    memory_fraction: float | None = None  # gpu_memory_utilization / mem_fraction_static
    kv_cache_dtype: str | None = None  # "auto", "fp8" …
    quantization: str | None = None  # None = the checkpoint's own precision
    weights_bytes: int | None = None  # the model's weights (catalog), whole model
    kv_bytes_per_token: int | None = None  # KV cache per token at the config's dtype, whole model
    kv_capacity_tokens: int | None = None  # as the engine reported or computed at start
    # Where the engine process may run: the config's placement, else what the host reports.
    cpus: tuple[int, ...] | None = None
    numa_node: int | None = None


@dataclass(frozen=True)
class GpuFacts:
    """One GPU the deployment uses, over the telemetry window."""

    index: int
    model: str
    memory_total_bytes: int | None = None
    numa_node: int | None = None
    utilization_pct: float | None = None  # mean over the window
    memory_used_bytes: int | None = None  # latest
    power_w: float | None = None  # mean
    power_limit_w: float | None = None
    temperature_c: float | None = None  # max
    sm_clock_mhz: float | None = None  # mean
    max_sm_clock_mhz: float | None = None
    # Clock-event (throttle) reasons seen in the window, NVML's names as the panel stores them
    # ("sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "idle" …),
    # with the share of samples each was active in.
    clock_events: Mapping[str, float] = field(default_factory=dict)
    pcie_tx_kbps: float | None = None
    pcie_rx_kbps: float | None = None


@dataclass(frozen=True)
class EngineWindow:
    """The engine's own /metrics over a window: gauges sampled, counters and histograms as
    deltas between its first and last scrape."""

    seconds: float  # length of the window
    ended_at: float  # Unix time of its last scrape
    source: str  # "live" (a scrape of the running engine) or "run N" (a benchmark's)
    requests: int | None = None  # finished in the window
    running_mean: float | None = None
    running_max: float | None = None
    waiting_mean: float | None = None
    waiting_max: float | None = None
    kv_usage_mean: float | None = None
    kv_usage_max: float | None = None
    preemptions: int | None = None
    prefix_cache_queries: float | None = None  # tokens looked up
    prefix_cache_hits: float | None = None
    hit_rate: float | None = None
    queue_ms: float | None = None  # mean per request (server-side)
    prefill_ms: float | None = None
    decode_ms: float | None = None
    ttft_ms: float | None = None
    itl_ms: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None


@dataclass(frozen=True)
class HostFacts:
    """The machine the engine runs on."""

    cpu_count: int | None = None
    load_1m: float | None = None  # run-queue length
    cpu_util_pct: float | None = None
    numa_cpus: Mapping[int, tuple[int, ...]] = field(default_factory=dict)  # node → its CPUs


@dataclass(frozen=True)
class StageFacts:
    """One load level of a benchmark run."""

    name: str
    concurrency: int | None = None
    request_rate: float | None = None
    requests: int | None = None
    error_rate: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p95_ms: float | None = None
    itl_p99_ms: float | None = None
    output_tokens_per_s: float | None = None
    max_concurrent: int | None = None


@dataclass(frozen=True)
class LengthFacts:
    """Prompt and output lengths, in tokens: of a run's requests or of a traffic sample."""

    input_p50: float | None = None
    input_p99: float | None = None
    output_p50: float | None = None
    output_p99: float | None = None
    total_p99: float | None = None  # prompt + output, per request
    shared_prefix_share: float | None = None  # share of prompt tokens in a prefix shared by others


@dataclass(frozen=True)
class RunFacts:
    """One finished benchmark run of the deployment."""

    run_id: int
    label: str
    profile: str  # "name vN"
    finished_at: float  # Unix time
    status: str  # succeeded / failed / cancelled
    config_current: bool  # run with the config that runs now
    completed: int = 0
    failed: int = 0
    error_rate: float | None = None
    errors_by_class: Mapping[str, int] = field(default_factory=dict)  # "HTTP_4XX" → n
    # Failed requests by cause, in the engine's words where it gave some ("maximum context
    # length is 8192 tokens …" → n), so a rule can tell a length refusal from a timeout.
    errors_by_message: Mapping[str, int] = field(default_factory=dict)
    warmup_requests: int = 0
    stages: tuple[StageFacts, ...] = ()
    lengths: LengthFacts | None = None
    server: EngineWindow | None = None
    output_tokens_per_s: float | None = None
    faster_than: int | None = None  # the run this one was compared with as faster, if any


@dataclass(frozen=True)
class Snapshot:
    """Everything the rules read about one deployment, at one moment."""

    deployment: str  # "host/name"
    taken_at: float  # Unix time
    config: ConfigFacts
    gpus: tuple[GpuFacts, ...] = ()
    engine: EngineWindow | None = None  # live; None when the engine could not be scraped
    host: HostFacts | None = None
    runs: tuple[RunFacts, ...] = ()  # newest first
    # Runs left out of ``runs`` because their numbers are the load generator's, not the
    # engine's (``benchmarks.evidence``): (run id, the refusal in words), newest first.
    refused_runs: tuple[tuple[int, str], ...] = ()
    traffic: LengthFacts | None = None  # from a traffic sample, when one exists
    telemetry_seconds: float | None = None  # the window the GPU facts cover
