"""What a run records about where and with what it ran, so it can be judged and reproduced:
the host, its GPUs, driver and libraries, the engine's own word on its version, the config
(secrets masked), the profile version and the load generator's spec."""

from __future__ import annotations

import httpx

from benchmarks.loadgen import __version__ as LOADGEN_VERSION
from benchmarks.models import GPU_SEPARATOR, BenchmarkRun
from hosts.engines.metrics import endpoints
from hosts.engines.redaction import is_secret, masked
from hosts.models import Deployment

# What the engine's version endpoint says that the record keeps.
REPORTED = ("version", "sglang_version", "torch_version", "cuda_version", "flashinfer_version")


def environment(run: BenchmarkRun, spec) -> dict:
    """What makes the run reproducible, as the host reported it when the run started. Also
    stores the run's GPU model and count (the history filters on them)."""
    deployment = run.deployment
    gpus = list(deployment.gpus.all()) or list(deployment.host.gpus.all())
    run.gpu_model = GPU_SEPARATOR.join(sorted({g.name for g in gpus}))[:100]
    run.gpu_count = len(gpus) or None
    run.save(update_fields=["gpu_model", "gpu_count"])
    return {
        "host": _host(deployment.host),
        "gpus": [
            {"index": g.index, "name": g.name, "uuid": g.uuid, "memory_bytes": g.memory_bytes}
            for g in gpus
        ],
        "engine": {
            "kind": deployment.engine,
            "declared_version": deployment.engine_version,
            "reported": engine_report(deployment),
            "model": deployment.model,
            "runner": deployment.runner,
            "url": deployment.engine_url,
        },
        "config": recorded_config(run.engine_config),
        "profile": {
            "id": run.load_profile_id,
            "name": run.load_profile.name,
            "version": run.load_profile.version,
        },
        "loadgen_version": LOADGEN_VERSION,
        "spec": spec.to_dict(),
    }


def _host(host) -> dict:
    return {
        "name": host.name,
        "hostname": host.hostname,
        "transport": host.transport,
        "agent_version": host.agent_version,
        "driver_version": host.driver_version,
        "cuda_version": host.cuda_version,
        # The engines' Python packages (vllm, torch, triton, NCCL, ...) as the host last
        # reported them: what /version does not say but changes the numbers.
        "libraries": dict(host.libraries or {}),
        "cpu_model": host.cpu_model,
        "cpu_count": host.cpu_count,
        "telemetry_source": host.telemetry_source,
        # What the agent says about its GPUs ("simulated GPUs (2 × H100 ...)"): on a simulated
        # host the record shows this instead of a driver and CUDA it does not have.
        "telemetry_note": host.telemetry_note,
    }


def recorded_config(config) -> dict | None:
    """A config version as a run records it: every value except the secrets."""
    if config is None:
        return None
    return {
        "id": config.pk,
        "version": config.version,
        # Secret values (the flag spec's api_key, HF_TOKEN, ...) are masked; every other
        # value is kept, so the record says what the run measured.
        "settings": masked(config.settings),
        "env": masked(config.env),
        "placement": config.placement,
    }


# The one rule for what a record must not keep (hosts.engines.redaction), under the name the
# compare view reads it by.
secret = is_secret


def engine_report(deployment: Deployment) -> dict:
    """The engine's own word on its version (vLLM ``/version``, SGLang ``/get_server_info``);
    empty when it does not answer: the run goes on, the record says it is unknown."""
    path = endpoints(deployment.engine).version
    if not path:
        return {}
    headers = {}
    if key := deployment.api_key():
        headers["Authorization"] = f"Bearer {key}"
    try:
        response = httpx.get(deployment.engine_url + path, headers=headers, timeout=3)
        data = response.json() if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: str(data[k])[:80] for k in REPORTED if k in data}
