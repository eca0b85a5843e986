"""Prometheus metrics with the real engines' families, labels, buckets and readings.

One class per engine and version the simulator reports: ``metrics_vllm`` (vLLM 0.11.0's
``PrometheusStatLogger``) and ``metrics_sglang`` (SGLang 0.5.3's ``metrics/collector.py``).
``EngineMetrics`` is what the runner drives; each module's docstring says what it models and
what it leaves out.
"""

from __future__ import annotations

from hosts.simulator.config import SimConfig
from hosts.simulator.core import EngineCore, Request, StepResult
from hosts.simulator.metrics_sglang import SglangMetrics
from hosts.simulator.metrics_vllm import VllmMetrics


class EngineMetrics:
    """The simulated engine's /metrics: fed each step, each inter-token gap (it is the core's
    ``itl`` sink) and each finished request."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.impl = VllmMetrics(cfg) if cfg.engine == "vllm" else SglangMetrics(cfg)
        self.registry = self.impl.registry

    def on_step(self, core: EngineCore, step: StepResult) -> None:
        self.impl.on_step(core, step)

    def append(self, seconds: float) -> None:
        """Inter-token gaps arrive here (the core's ``itl`` sink)."""
        self.impl.append(seconds)

    def on_finished(self, req: Request) -> None:
        self.impl.on_finished(req)

    def exposition(self) -> bytes:
        return self.impl.exposition()
