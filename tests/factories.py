"""Small factories for the models; each returns a saved object with sensible defaults."""

from __future__ import annotations

import itertools
from decimal import Decimal

from benchmarks.models import BenchmarkRun, LoadProfile
from hosts.models import Deployment, EngineConfig, Gpu, Host

_seq = itertools.count(1)


def make_host(**kw) -> Host:
    n = next(_seq)
    data = dict(
        name=f"gpu-{n:03d}",
        address="127.0.0.1",
        transport="agent",
        port=9100,
        agent_token="test-token",
        hourly_price=Decimal("2.50"),
        labels={"zone": "test"},
    )
    data.update(kw)
    return Host.objects.create(**data)


def make_gpu(host: Host, **kw) -> Gpu:
    index = kw.pop("index", host.gpus.count())
    data = dict(
        host=host,
        index=index,
        uuid=f"GPU-test-{host.pk}-{index}",
        name="NVIDIA H100 80GB HBM3",
        memory_bytes=80 * 2**30,
        numa_node=0,
    )
    data.update(kw)
    return Gpu.objects.create(**data)


def make_deployment(host: Host | None = None, **kw) -> Deployment:
    host = host or make_host()
    n = next(_seq)
    data = dict(
        host=host,
        name=f"engine-{n}",
        engine="vllm",
        engine_version="0.11.0",
        model="meta-llama/Llama-3.1-8B-Instruct",
        port=8000 + n,
    )
    data.update(kw)
    return Deployment.objects.create(**data)


def make_config(deployment: Deployment, settings: dict | None = None, **kw) -> EngineConfig:
    return EngineConfig.objects.create_next(deployment, settings or {"max_num_seqs": 256}, **kw)


def make_profile(name: str | None = None, spec: dict | None = None, **kw) -> LoadProfile:
    """A profile version; ``spec`` defaults to a small closed-loop load (8 concurrent,
    256→64 tokens, 40 requests)."""
    spec = spec or {
        "stages": [{"name": "main", "concurrency": 8, "num_requests": 40}],
        "input_len": {"kind": "fixed", "mean": 256},
        "output_len": {"kind": "fixed", "mean": 64},
        "warmup_requests": 2,
    }
    return LoadProfile.objects.create_next(name or f"profile-{next(_seq)}", spec, **kw)


def make_run(deployment: Deployment | None = None, **kw) -> BenchmarkRun:
    deployment = deployment or make_deployment()
    data = dict(
        deployment=deployment,
        load_profile=kw.pop("load_profile", None) or make_profile(),
        engine=deployment.engine,
        engine_version=deployment.engine_version,
        model_name=deployment.model,
    )
    data.update(kw)
    return BenchmarkRun.objects.create(**data)


def make_finished_run(deployment: Deployment | None = None, **kw) -> BenchmarkRun:
    """A succeeded run with plausible headline numbers (override any of them)."""
    from django.utils import timezone

    now = timezone.now()
    data = dict(
        status="succeeded",
        started_at=now,
        finished_at=now,
        gpu_model="NVIDIA H100 80GB HBM3",
        gpu_count=1,
        duration_s=60.0,
        completed=600,
        failed=0,
        error_rate=0.0,
        ttft_p50_ms=120.0,
        ttft_p95_ms=300.0,
        ttft_p99_ms=450.0,
        itl_p50_ms=12.0,
        itl_p95_ms=20.0,
        itl_p99_ms=35.0,
        tpot_p50_ms=13.0,
        e2el_p99_ms=4000.0,
        request_throughput=10.0,
        output_tokens_per_s=1280.0,
        input_tokens_total=600 * 512,
        output_tokens_total=600 * 128,
        hourly_price=Decimal("2.50"),
        currency="USD",
    )
    data.update(kw)
    if data.get("cost_per_million_output") is None and data["output_tokens_per_s"]:
        data["cost_per_million_output"] = (
            float(data["hourly_price"]) / (data["output_tokens_per_s"] * 3600) * 1e6
        )
    return make_run(deployment, **data)


def ssh_private_key() -> str:
    """A fresh Ed25519 private key in OpenSSH format (what `ssh-keygen` writes)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return (
        Ed25519PrivateKey.generate()
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        .decode()
    )


def make_sim_deployment(host: Host, **kw) -> Deployment:
    """A deployment run by the simulator (Llama-3.1-8B on an H100) on a free port."""
    from tests.conftest import free_port

    data = dict(
        host=host,
        name="llama",
        engine="vllm",
        engine_version="0.11.0",
        model="meta-llama/Llama-3.1-8B-Instruct",
        port=free_port(),
        runner="simulator",
        simulator={"gpu": "h100-sxm", "startup_seconds": 0.3},
    )
    data.update(kw)
    return Deployment.objects.create(**data)
