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


def make_profile(**kw) -> LoadProfile:
    data = dict(name=f"profile-{next(_seq)}", concurrency=8, input_tokens=256, output_tokens=64)
    data.update(kw)
    return LoadProfile.objects.create(**data)


def make_run(deployment: Deployment | None = None, **kw) -> BenchmarkRun:
    deployment = deployment or make_deployment()
    data = dict(deployment=deployment, load_profile=kw.pop("load_profile", None) or make_profile())
    data.update(kw)
    return BenchmarkRun.objects.create(**data)


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
