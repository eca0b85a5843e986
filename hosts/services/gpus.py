"""Facts about the GPUs a deployment uses, for predictions, warnings and prices: how many, and
which simulator GPU model stands for them. One home for every app above (changes' advisor and
sweeps, scaling's what-if, the cost of a run)."""

from __future__ import annotations

from hosts.engines.catalog import GPUS, gpu_key
from hosts.models import Deployment


def gpu_count(deployment: Deployment) -> int | None:
    """The GPUs the deployment uses: those it was given by index, else (none given) its
    simulator's count or the whole host's."""
    assigned = deployment.gpus.count()
    if assigned:
        return assigned
    if deployment.runner == "simulator":
        return int((deployment.simulator or {}).get("num_gpus") or 1)
    count = deployment.host.gpus.count()
    return count or None


def gpu_facts(deployment: Deployment) -> tuple[str | None, int, int | None]:
    """``(simulator GPU key, GPU count, one GPU's memory)`` for predictions and warnings."""
    if deployment.runner == "simulator":
        key = (deployment.simulator or {}).get("gpu") or "h100-sxm"
        spec = GPUS.get(key)
        return key, gpu_count(deployment) or 1, spec.memory_bytes if spec else None
    gpu = deployment.gpus.first() or deployment.host.gpus.first()
    if gpu is None:
        return None, 1, None
    return gpu_key(gpu.name), gpu_count(deployment) or 1, gpu.memory_bytes
