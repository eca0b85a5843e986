"""Simulated GPU telemetry in the shape the host agent reads from NVML.

Memory follows what the engine reserved; utilisation is the busy share of recent wall time;
power climbs from idle to TDP with load and compute intensity; temperature trails power; the SM
clock drops with a power-cap throttle reason once power reaches the limit.
"""

from __future__ import annotations

import time
from collections import deque

from hosts.simulator.config import SimConfig

# nvmlClocksEventReasons bits (REFERENCE.md)
IDLE, SW_POWER_CAP = 0x1, 0x4
WINDOW = 2.0  # seconds of history behind utilisation


class Telemetry:
    """Tracks engine activity and renders per-GPU readings."""

    def __init__(self, cfg: SimConfig, clock=time.monotonic):
        self.cfg = cfg
        self.clock = clock
        self.busy: deque[tuple[float, float, float]] = deque()  # (end, seconds, intensity)
        self.prompt_tokens = 0
        self.started = clock()
        self.temperature = [31.0] * cfg.num_gpus
        self.last_sample = self.started

    def record_step(self, seconds: float, prefill_tokens: int, decode_tokens: int) -> None:
        now = self.clock()
        intensity = 1.0 if prefill_tokens > 256 else 0.55 + min(decode_tokens, 512) / 1200
        self.busy.append((now, seconds, intensity))
        self.prompt_tokens += prefill_tokens
        while self.busy and self.busy[0][0] < now - WINDOW:
            self.busy.popleft()

    def _load(self) -> tuple[float, float]:
        now = self.clock()
        while self.busy and self.busy[0][0] < now - WINDOW:
            self.busy.popleft()
        busy = sum(s for _, s, _ in self.busy)
        util = min(1.0, busy / WINDOW) if self.busy else 0.0
        intensity = (sum(s * i for _, s, i in self.busy) / busy) if busy else 0.0
        return util, intensity

    def sample(self) -> list[dict]:
        cfg, gpu = self.cfg, self.cfg.gpu
        util, intensity = self._load()
        now = self.clock()
        dt = max(now - self.last_sample, 1e-3)
        self.last_sample = now
        readings = []
        for index in range(cfg.num_gpus):
            active = index < cfg.tp
            u = util if active else 0.0
            power = gpu.idle_watts + (gpu.tdp_watts - gpu.idle_watts) * u * (0.45 + 0.6 * intensity)
            capped = power >= gpu.tdp_watts * 0.98
            power = min(power, gpu.tdp_watts)
            target_temp = 30 + 48 * power / gpu.tdp_watts
            # First-order lag towards the target temperature (τ ≈ 20 s).
            self.temperature[index] += (target_temp - self.temperature[index]) * min(1, dt / 20)
            sm_clock = gpu.max_sm_clock_mhz if u > 0 else 345
            if capped:
                sm_clock = int(gpu.max_sm_clock_mhz * 0.9)
            reasons = (IDLE if u == 0 else 0) | (SW_POWER_CAP if capped else 0)
            used = cfg.reserved_bytes if active else 0.5 * 2**20 * 512
            readings.append(
                {
                    "index": index,
                    "uuid": f"GPU-sim-{gpu.key}-{index:02d}",
                    "name": gpu.nvml_name,
                    "memory_total_bytes": gpu.memory_bytes,
                    "memory_used_bytes": int(min(used, gpu.memory_bytes)),
                    "utilization_gpu_pct": round(u * 100),
                    "utilization_memory_pct": round(u * 100 * (1 - 0.5 * intensity)),
                    "temperature_c": round(self.temperature[index]),
                    "power_w": round(power, 1),
                    "power_limit_w": gpu.tdp_watts,
                    "sm_clock_mhz": sm_clock,
                    "mem_clock_mhz": gpu.max_mem_clock_mhz,
                    "max_sm_clock_mhz": gpu.max_sm_clock_mhz,
                    "clocks_event_reasons": reasons,
                    "pcie_tx_kbps": round(u * 900 + 40),
                    "pcie_rx_kbps": round(u * 600 + 30 * intensity),
                    "numa_node": 0 if index < max(1, cfg.num_gpus // 2) else 1,
                }
            )
        return readings
