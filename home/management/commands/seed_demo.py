"""``manage.py seed_demo``: demo logins (one per role) and a small simulated fleet.

Idempotent: objects that already exist are left alone, so it runs at every ``make run``; only
the demo hosts' agent port and token are refreshed, since they belong to the local demo agents
(``hosts/demo.py``) that ``make run`` starts. GPUs are not seeded: the panel reads them from
the agents, as it would from a real server.
"""

from __future__ import annotations

import secrets
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand
from django.db import transaction

from benchmarks.services import probes
from benchmarks.services.profiles import ensure_builtin_profiles
from controlpanel.env import env_secret
from hosts import demo
from hosts.choices import DeploymentStatus, Runner, TransportKind
from hosts.models import Deployment, EngineConfig, Host

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
        knowledge = settings.VAR_DIR / "demo-fleet" / "knowledge.jsonl"
        probes.write_knowledge(knowledge)
        for index, spec in enumerate(demo.FLEET):
            host = self._host(index, spec)
            if not host.deployments.filter(name=spec.deployment).exists():
                self._deployment(host, index, spec)
            # The simulated engines answer the built-in probe sets from this file (their
            # quality model), also in a var/ seeded before quality probes existed.
            for deployment in host.deployments.filter(runner=Runner.SIMULATOR):
                if deployment.simulator.get("knowledge") != str(knowledge):
                    deployment.simulator = {**deployment.simulator, "knowledge": str(knowledge)}
                    deployment.save(update_fields=["simulator"])
        ensure_builtin_profiles()
        probes.sync_builtin_sets()

    def _host(self, index: int, spec: demo.DemoHost) -> Host:
        """The demo host, created once; a simulated one is re-pointed at its local agent."""
        token = demo.token_for(settings.VAR_DIR, spec)  # made now, for the agent to read
        host, created = Host.objects.get_or_create(
            name=spec.name,
            defaults=dict(
                address="127.0.0.1",
                transport=TransportKind.AGENT,
                port=demo.agent_port(index),
                hourly_price=Decimal(spec.price),
                labels={"zone": "lab", "simulated": "yes"},
                description="Simulated GPU server of the demo fleet (a local host agent).",
            ),
        )
        if host.labels.get("simulated") == "yes":
            # Its agent listens on loopback in plain HTTP: the one place cleartext is allowed.
            host.transport = TransportKind.AGENT
            host.address = "127.0.0.1"
            host.agent_tls = False
            host.port = demo.agent_port(index)
            # Typed in for this destination, so the token is bound here (Host.enter_secret).
            host.enter_secret("agent_token", token)
            host.save(update_fields=["transport", "address", "agent_tls", "port", "agent_token"])
        return host

    def _deployment(self, host: Host, index: int, spec: demo.DemoHost) -> Deployment:
        """The demo deployment with its config history, the last version active."""
        deployment = Deployment.objects.create(
            host=host,
            name=spec.deployment,
            engine=spec.engine,
            engine_version=spec.engine_version,
            model=spec.model,
            port=demo.engine_port(index),
            runner=Runner.SIMULATOR,
            simulator={"gpu": spec.gpu_key, "num_gpus": spec.gpus, "startup_seconds": 3},
            status=DeploymentStatus.UNKNOWN,
        )
        for number, engine_settings in enumerate(spec.versions, start=1):
            note = spec.notes[number - 1] if number <= len(spec.notes) else "demo: settings"
            note = "demo: initial settings" if number == 1 and not spec.notes else note
            config = EngineConfig.objects.create_next(deployment, engine_settings, note=note)
        deployment.active_config = config
        deployment.save(update_fields=["active_config"])
        return deployment


def demo_password() -> str:
    """DEMO_PASSWORD, or one generated at first start and kept in var/ (mode 0600)."""
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
