"""System checks of how the panel reaches hosts (``manage.py check --deploy``): agent traffic
in clear over a network hands out the bearer token and every engine setting."""

from django.conf import settings
from django.core.checks import Tags, Warning, register
from django.db import DatabaseError

from hosts.addresses import is_loopback
from hosts.choices import TransportKind
from hosts.models import Host

SHOWN = 10


@register(Tags.security, deploy=True)
def cleartext_agent_check(app_configs, **kwargs):
    found = []
    if settings.AGENT_ALLOW_CLEARTEXT:
        found.append(
            Warning(
                "AGENT_ALLOW_CLEARTEXT is on: hosts may be registered with plain-HTTP agents on "
                "other machines, whose bearer token anyone on the path can read and replay.",
                hint="Run each agent with --tls-cert/--tls-key, pin its certificate in the "
                "host's CA certificate, and unset AGENT_ALLOW_CLEARTEXT.",
                id="hosts.W001",
            )
        )
    # Reading rows is what Django keeps for database checks: they run only when asked
    # (`check --deploy --database default`), so a static deploy check (CI, image builds)
    # contacts nothing. Asked, a database that cannot be read says so.
    if not kwargs.get("databases"):
        return found
    try:
        rows = list(
            Host.objects.filter(transport=TransportKind.AGENT, agent_tls=False).values_list(
                "name", "address"
            )
        )
    except DatabaseError as exc:
        found.append(
            Warning(
                f"Cannot tell whether any host's agent is reached in plain HTTP: the hosts "
                f"could not be read ({exc.__class__.__name__}).",
                hint="Run the check again once the database is migrated and reachable.",
                id="hosts.W003",
            )
        )
        return found
    remote = sorted(name for name, address in rows if not is_loopback(address))
    if remote:
        names = ", ".join(remote[:SHOWN]) + (
            f" and {len(remote) - SHOWN} more" if len(remote) > SHOWN else ""
        )
        found.append(
            Warning(
                f"{len(remote)} host(s) reach their agent in plain HTTP over the network "
                f"(token and engine settings readable on the wire): {names}.",
                hint="Restart each agent with --tls-cert/--tls-key, then edit the host: turn "
                "on TLS, paste the agent's certificate as its CA certificate, and enter the "
                "token again.",
                id="hosts.W002",
            )
        )
    return found
