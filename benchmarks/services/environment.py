"""What a run records about where and with what it ran, so it can be judged and reproduced:
the host, its GPUs, driver and libraries, the engine's own word on its version, the config
(secrets masked), the profile version and the load generator's spec."""

from __future__ import annotations

import httpx

from benchmarks.loadgen import __version__ as LOADGEN_VERSION
from benchmarks.models import GPU_SEPARATOR, BenchmarkRun
from hosts.engines.metrics import endpoints
from hosts.models import Deployment

SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
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
        "config": _config(run.engine_config),
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
    }


def _config(config) -> dict | None:
    if config is None:
        return None
    return {
        "id": config.pk,
        "version": config.version,
        "settings": {k: ("•••" if secret(k) else v) for k, v in config.settings.items()},
        "env": {k: ("•••" if secret(k) else v) for k, v in config.env.items()},
        "placement": config.placement,
    }


def secret(name: str) -> bool:
    """Settings and environment variables whose values a record must not keep
    (VLLM_API_KEY, HF_TOKEN, ...)."""
    return any(word in name.upper() for word in SECRET_WORDS)


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
