"""``manage.py seed_demo``: demo logins (one per role) and a small simulated fleet.

Idempotent: objects that already exist are left alone, so it runs at every ``make run``.
"""

from __future__ import annotations

import secrets
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand
from django.db import transaction

from benchmarks.choices import Dataset, LoadMode
from benchmarks.models import LoadProfile
from hosts.choices import DeploymentStatus, EngineKind, TransportKind
from hosts.models import Deployment, EngineConfig, Gpu, Host

GIB = 2**30

# name, transport, port, price/h, labels, [(gpu name, memory GiB, numa)]
FLEET = [
    (
        "sim-h100-01",
        TransportKind.AGENT,
        9101,
        "9.80",
        {"zone": "lab", "simulated": "yes"},
        [("NVIDIA H100 80GB HBM3", 80, 0), ("NVIDIA H100 80GB HBM3", 80, 1)],
    ),
    (
        "sim-a100-01",
        TransportKind.AGENT,
        9102,
        "3.67",
        {"zone": "lab", "simulated": "yes"},
        [("NVIDIA A100-SXM4-80GB", 80, 0)],
    ),
    (
        "sim-l40s-01",
        TransportKind.SSH,
        9103,
        "1.86",
        {"zone": "lab", "simulated": "yes"},
        [("NVIDIA L40S", 48, 0)],
    ),
]
# host, name, engine, version, model, port, gpu indexes, [settings of v1, v2...]
DEPLOYMENTS = [
    (
        "sim-h100-01",
        "llama-8b",
        EngineKind.VLLM,
        "0.11.0",
        "meta-llama/Llama-3.1-8B-Instruct",
        8001,
        [0],
        [
            {"gpu_memory_utilization": 0.9, "max_num_seqs": 256},
            {"gpu_memory_utilization": 0.9, "max_num_seqs": 512, "max_num_batched_tokens": 8192},
        ],
    ),
    (
        "sim-h100-01",
        "qwen-7b",
        EngineKind.SGLANG,
        "0.5.3",
        "Qwen/Qwen2.5-7B-Instruct",
        30000,
        [1],
        [{"mem_fraction_static": 0.85, "max_running_requests": 256}],
    ),
    (
        "sim-a100-01",
        "mistral-7b",
        EngineKind.VLLM,
        "0.11.0",
        "mistralai/Mistral-7B-Instruct-v0.3",
        8001,
        [0],
        [{"gpu_memory_utilization": 0.9, "max_model_len": 8192}],
    ),
]
PROFILES = [
    ("chat-low", "Interactive chat, light load.", LoadMode.CLOSED, 4, None, 512, 128),
    ("chat-peak", "Interactive chat at peak hour.", LoadMode.CLOSED, 64, None, 512, 256),
    (
        "rag-long-prompt",
        "Retrieval-augmented answers: long prompts, short outputs.",
        LoadMode.OPEN,
        32,
        4.0,
        6000,
        200,
    ),
]
ROLE_USERS = [
    ("admin", "Admin"),
    ("approver", "Approver"),
    ("operator", "Operator"),
    ("viewer", "Viewer"),
]


class Command(BaseCommand):
    help = "Create demo logins (admin, approver, operator, viewer) and a demo fleet."

    def handle(self, *args, **options):
        password = demo_password()
        with transaction.atomic():
            self._users(password)
            self._fleet()
        self.stdout.write(
            self.style.SUCCESS("Demo logins (all share one password):\n")
            + "".join(f"  {user:<9} ({role})\n" for user, role in ROLE_USERS)
            + f"  password: {password}\n"
        )

    def _users(self, password):
        User = get_user_model()
        for username, role in ROLE_USERS:
            user, created = User.objects.get_or_create(username=username)
            if created:
                user.set_password(password)
                user.is_staff = user.is_superuser = role == "Admin"
                user.save()
            user.groups.add(Group.objects.get(name=role))

    def _fleet(self):
        if Host.objects.exists():
            return
        hosts = {}
        for n, (name, transport, port, price, labels, gpus) in enumerate(FLEET):
            host = Host.objects.create(
                name=name,
                address="127.0.0.1",
                transport=transport,
                port=port,
                hourly_price=Decimal(price),
                labels=labels,
                description="Simulated GPU server of the demo fleet.",
            )
            for index, (gpu_name, gib, numa) in enumerate(gpus):
                Gpu.objects.create(
                    host=host,
                    index=index,
                    name=gpu_name,
                    memory_bytes=gib * GIB,
                    numa_node=numa,
                    uuid=f"GPU-demo-{n:02d}-{index:02d}",
                )
            hosts[name] = host
        for host_name, name, engine, version, model, port, gpu_idx, versions in DEPLOYMENTS:
            host = hosts[host_name]
            deployment = Deployment.objects.create(
                host=host,
                name=name,
                engine=engine,
                engine_version=version,
                model=model,
                port=port,
                status=DeploymentStatus.UNKNOWN,
            )
            deployment.gpus.set(host.gpus.filter(index__in=gpu_idx))
            for number, engine_settings in enumerate(versions, start=1):
                config = EngineConfig.objects.create_next(
                    deployment,
                    engine_settings,
                    note="demo: initial settings" if number == 1 else "demo: larger batches",
                )
            deployment.active_config = config
            deployment.save(update_fields=["active_config"])
        for name, description, mode, concurrency, rate, inp, out in PROFILES:
            LoadProfile.objects.get_or_create(
                name=name,
                defaults=dict(
                    description=description,
                    mode=mode,
                    concurrency=concurrency,
                    request_rate=rate,
                    input_tokens=inp,
                    output_tokens=out,
                    dataset=Dataset.RANDOM,
                ),
            )


def demo_password() -> str:
    """DEMO_PASSWORD, or one generated at first start and kept in var/ (mode 0600)."""
    from controlpanel.env import env_secret

    configured = env_secret("DEMO_PASSWORD")
    if configured:
        return configured
    path = settings.VAR_DIR / "demo-password"
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(9)
    path.touch(mode=0o600)
    path.write_text(password)
    return password
