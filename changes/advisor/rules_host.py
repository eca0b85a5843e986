"""Rules on the machine under the engine: GPU clocks held down, CPUs starved, the engine on
the wrong NUMA node (DOMAIN.md §2). Pure."""

from __future__ import annotations

from collections.abc import Iterator

from changes.advisor import text
from changes.advisor.facts import Snapshot
from changes.advisor.findings import CRITICAL, WARNING, Finding, Suggestion
from changes.advisor.registry import rule

# --- gpu-throttled -----------------------------------------------------------------------------
# NVML clock-event reasons that hold clocks down for power or heat, by their name with case and
# underscores dropped (the agent stores "SwPowerCap", a snapshot may say "sw_power_cap").
# "Idle", application clocks, sync boost and display clocks are not throttling.
POWER_REASONS = {"swpowercap": "software power cap", "hwpowerbrakeslowdown": "power brake"}
THERMAL_REASONS = {
    "swthermalslowdown": "software thermal slowdown",
    "hwthermalslowdown": "hardware thermal slowdown",
    "hwslowdown": "hardware slowdown",
}
# Share of the window's samples a reason was active in from which it is a state, not a blip.
THROTTLE_SHARE_MIN = 0.1
# Mean utilisation from which a GPU is working: clocking down an idle GPU costs nothing.
BUSY_UTIL_PCT = 50.0
# Where the clocks are known, a mean SM clock at or above this share of the maximum is no
# finding: a GPU at full load touching its power limit dithers a few per cent below boost
# (the simulator's H100 at 673 of 700 W: 1,904 of 1,980 MHz); a 10 % slower clock is every
# step 10 % slower.
CLOCK_SHARE_MAX = 0.9

# --- cpu-bound / numa-mismatch -----------------------------------------------------------------
# Mean GPU utilisation under this while requests wait: the GPU is not what limits them
# (DOMAIN §2, §6: "GPU util low but slow"). A GPU fed by an engine with requests queued runs
# near 100 % (the simulator's healthy H100 reads 100 %); with its scheduler loop starved of CPU
# it reads 65 %.
GPU_UTIL_LOW_PCT = 75.0
# Peak requests waiting in the (live) window from which requests had to wait for the engine:
# under a closed-loop load below the sequence cap the wait is short and in front of the engine,
# so the mean stays under one while the peak shows it.
CPU_WAITING_MIN = 1.0
# Run-queue length per CPU from which the host's CPUs are saturated: every core has a task
# ready and the tokenizer or the engine's scheduler loop waits its turn.
LOAD_PER_CPU_MAX = 1.0
# Host CPU utilisation from which it is saturated.
CPU_UTIL_MAX_PCT = 90.0
# Mean queue wait from which users are hurt now (as rules_load.QUEUE_CRITICAL_MS).
CPU_QUEUE_CRITICAL_MS = 1000.0
# Share of the engine's CPUs on its GPUs' NUMA node under which it runs "off node": its
# memory and the GPU's DMA cross the socket link (DOMAIN §2: pin to the GPU's node).
NUMA_LOCAL_SHARE_MIN = 0.5


def _key(reason: str) -> str:
    return reason.replace("_", "").replace(" ", "").lower()


@rule("gpu-throttled")
def gpu_throttled(s: Snapshot) -> Iterator[Finding]:
    hit = []
    for gpu in s.gpus:
        if gpu.utilization_pct is None or gpu.utilization_pct < BUSY_UTIL_PCT:
            continue
        reasons = {
            _key(name): share
            for name, share in gpu.clock_events.items()
            if share >= THROTTLE_SHARE_MIN and _key(name) in POWER_REASONS | THERMAL_REASONS
        }
        clocked = gpu.sm_clock_mhz and gpu.max_sm_clock_mhz
        if clocked and gpu.sm_clock_mhz >= CLOCK_SHARE_MAX * gpu.max_sm_clock_mhz:
            continue
        if reasons:
            hit.append((gpu, reasons))
    if not hit:
        return
    parts, evidence, thermal = [], [], False
    for gpu, reasons in hit:
        words = ", ".join(
            f"{(POWER_REASONS | THERMAL_REASONS)[r]} {text.pct(share)} of the time"
            for r, share in sorted(reasons.items())
        )
        extra = []
        if gpu.sm_clock_mhz and gpu.max_sm_clock_mhz:
            extra.append(f"SM clock {gpu.sm_clock_mhz:.0f} of {gpu.max_sm_clock_mhz:.0f} MHz")
        if gpu.power_w and gpu.power_limit_w:
            extra.append(f"power {gpu.power_w:.0f} of {gpu.power_limit_w:.0f} W")
        if gpu.temperature_c is not None:
            extra.append(f"up to {gpu.temperature_c:.0f} °C")
        tail = f" ({', '.join(extra)})" if extra else ""
        parts.append(f"GPU {gpu.index} at {gpu.utilization_pct:.0f} % busy: {words}{tail}")
        thermal = thermal or any(r in THERMAL_REASONS for r in reasons)
        evidence.append(
            {
                "gpu": gpu.index,
                "utilization_pct": gpu.utilization_pct,
                "reasons": dict(reasons),
                "sm_clock_mhz": gpu.sm_clock_mhz,
                "max_sm_clock_mhz": gpu.max_sm_clock_mhz,
                "power_w": gpu.power_w,
                "power_limit_w": gpu.power_limit_w,
                "temperature_c": gpu.temperature_c,
            }
        )
    action = (
        "Check cooling: inlet air, fans and the chassis airflow around these GPUs "
        "(nvidia-smi -q -d TEMPERATURE,PERFORMANCE)."
        if thermal
        else "Check the power limit (nvidia-smi -q -d POWER): raise it toward the board's "
        "maximum with nvidia-smi -pl if the rack's power budget allows, or accept the lower "
        "clock and size capacity for it."
    )
    yield Finding(
        rule="gpu-throttled",
        severity=WARNING,
        title="Busy GPUs are held at lower clocks (" + ("heat" if thermal else "power") + ")",
        seen="; ".join(parts) + f", {text.telemetry(s.telemetry_seconds)}.",
        why=(
            "A throttled GPU looks busy but runs every step slower: utilisation stays high "
            "while TTFT and ITL rise, and no engine setting wins that time back."
        ),
        evidence={"window_s": s.telemetry_seconds, "gpus": evidence},
        source="telemetry",
        suggestion=Suggestion(action=action),
    )


def _gpu_util(s: Snapshot) -> float | None:
    values = [g.utilization_pct for g in s.gpus if g.utilization_pct is not None]
    return sum(values) / len(values) if values else None


def _starved(s: Snapshot) -> tuple[float, float] | None:
    """(mean GPU utilisation, peak requests waiting) when requests wait on a GPU that is
    not busy."""
    w = s.engine
    util = _gpu_util(s)
    if w is None or w.source != "live" or w.waiting_max is None or util is None:
        return None
    if util >= GPU_UTIL_LOW_PCT or w.waiting_max < CPU_WAITING_MIN:
        return None
    return util, w.waiting_max


@rule("cpu-bound")
def cpu_bound(s: Snapshot) -> Iterator[Finding]:
    starved, host = _starved(s), s.host
    if starved is None or host is None:
        return
    util, waiting = starved
    per_cpu = host.load_1m / host.cpu_count if host.load_1m is not None and host.cpu_count else None
    busy = []
    if per_cpu is not None and per_cpu >= LOAD_PER_CPU_MAX:
        busy.append(f"load {host.load_1m:.1f} on {host.cpu_count} CPUs ({per_cpu:.1f} per CPU)")
    if host.cpu_util_pct is not None and host.cpu_util_pct >= CPU_UTIL_MAX_PCT:
        busy.append(f"CPU {host.cpu_util_pct:.0f} % busy")
    if not busy:
        return
    w = s.engine
    pinned = f"; the engine may use {len(s.config.cpus)} CPUs" if s.config.cpus else ""
    critical = (w.queue_ms or 0) >= CPU_QUEUE_CRITICAL_MS
    yield Finding(
        rule="cpu-bound",
        severity=CRITICAL if critical else WARNING,
        title="Requests wait on the CPU while the GPU idles",
        seen=(
            f"GPU utilisation averaged {util:.0f} % while up to {text.num(waiting)} requests "
            f"waited {text.window(w)}; the host shows {' and '.join(busy)}{pinned}."
        ),
        why=(
            "Tokenisation, request handling and the engine's scheduling loop run on the CPU; "
            "when the CPUs are saturated the GPU waits for work and TTFT grows although the "
            "GPU has capacity to spare."
        ),
        evidence={
            "window_s": w.seconds,
            "gpu_util_pct": util,
            "waiting_max": waiting,
            "waiting_mean": w.waiting_mean,
            "queue_ms": w.queue_ms,
            "load_1m": host.load_1m,
            "cpu_count": host.cpu_count,
            "cpu_util_pct": host.cpu_util_pct,
            "engine_cpus": len(s.config.cpus) if s.config.cpus else None,
        },
        source=w.source,
        suggestion=Suggestion(
            action=(
                "Find what takes the CPUs (top -H): move the web proxy and other services off "
                "the engine's cores, lift a container CPU limit, and give the engine dedicated "
                "cores on its GPUs' NUMA node; decide how many by benchmark (DOMAIN §2)."
            )
        ),
    )


def _cpu_list(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] → "0-3,8": the form the deployment's placement takes."""
    out, start = [], None
    for i, cpu in enumerate(cpus):
        if start is None:
            start = cpu
        if i + 1 == len(cpus) or cpus[i + 1] != cpu + 1:
            out.append(str(start) if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(out)


@rule("numa-mismatch")
def numa_mismatch(s: Snapshot) -> Iterator[Finding]:
    gpu_nodes = {g.numa_node for g in s.gpus}
    if not s.gpus or None in gpu_nodes:
        return
    host, cpus = s.host, s.config.cpus
    numa_cpus = host.numa_cpus if host is not None else {}
    local_cpus = sorted(c for node in gpu_nodes for c in numa_cpus.get(node, ()))
    if cpus and local_cpus:
        local = len(set(cpus) & set(local_cpus)) / len(cpus)
        placed = f"{text.pct(local)} of the engine's {len(cpus)} CPUs are on"
    elif s.config.numa_node is not None:
        local = 1.0 if s.config.numa_node in gpu_nodes else 0.0
        placed = f"the engine is pinned to node {s.config.numa_node}, not"
    else:
        return
    if local >= NUMA_LOCAL_SHARE_MIN:
        return
    nodes = ", ".join(str(n) for n in sorted(gpu_nodes))
    starved = _starved(s)
    load = (
        f" GPU utilisation averaged {starved[0]:.0f} % while up to {text.num(starved[1])} "
        f"requests waited {text.window(s.engine)}."
        if starved
        else ""
    )
    target = f" (CPUs {_cpu_list(local_cpus)})" if local_cpus else ""
    yield Finding(
        rule="numa-mismatch",
        severity=WARNING,
        title="The engine runs off its GPUs' NUMA node",
        seen=f"GPUs {', '.join(str(g.index) for g in s.gpus)} hang off NUMA node {nodes}; "
        f"{placed} that node, in the running config's placement.{load}",
        why=(
            "Every host-to-GPU copy and the engine's own memory then cross the socket link: "
            "slower transfers and a starved scheduler loop, which shows as long TTFT on a GPU "
            "that is not busy."
        ),
        evidence={
            "gpu_numa_nodes": sorted(gpu_nodes),
            "engine_numa_node": s.config.numa_node,
            "engine_cpus": list(cpus) if cpus else None,
            "local_share": local,
            "gpu_util_pct": starved[0] if starved else None,
            "waiting_max": starved[1] if starved else None,
        },
        source="config",
        suggestion=Suggestion(
            action=(
                f"Pin the engine to NUMA node {nodes}{target}: set the deployment's placement "
                "(numa_node and cpus) to the GPUs' node, so its threads and memory sit "
                "beside them."
            )
        ),
    )
