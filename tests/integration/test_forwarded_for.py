"""Issue 38 item 8: the per-address login limit must not trust ``X-Forwarded-For`` from any
peer, or a client picks the address it is throttled by, a fresh one per try. The production web
process (compose's command) believes the header only from FORWARDED_ALLOW_IPS: here once with
the test client not among them (the header is ignored: the client's own address is locked
out), once with it as the trusted proxy (the header names each client)."""

from __future__ import annotations

import re

import httpx
import pytest

from controlpanel.models import AuditEntry
from tests.conftest import free_port
from tests.integration.processes import compose_command

pytestmark = pytest.mark.integration

LIMIT = 3


def web(start, production_env, trusted: str):
    port = free_port()
    env = {
        **production_env,
        "WEB_HOST": "127.0.0.1",
        "WEB_PORT": str(port),
        "WEB_CONCURRENCY": "1",
        "FORWARDED_ALLOW_IPS": trusted,
        "LOGIN_ADDRESS_FAILURE_LIMIT": str(LIMIT),
        "LOGIN_FAILURE_LIMIT": "50",
    }
    process = start(f"web-{trusted}", compose_command("web"), env)
    process.wait_for_output("Application startup complete", 60)
    return f"http://127.0.0.1:{port}"


def bad_logins(base: str, count: int) -> list[int]:
    """``count`` wrong passwords for different accounts, each claiming another address."""
    codes = []
    with httpx.Client(base_url=base, timeout=30) as client:
        for i in range(count):
            page = client.get("/accounts/login/")
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
            answer = client.post(
                "/accounts/login/",
                data={"username": f"nobody-{i}", "password": "wrong", "csrfmiddlewaretoken": token},
                headers={"X-Forwarded-For": f"203.0.113.{i + 1}"},
            )
            codes.append(answer.status_code)
    return codes


@pytest.mark.django_db(transaction=True)
def test_x_forwarded_for_is_believed_only_from_the_configured_proxy(production_env, start):
    untrusted = web(start, production_env, trusted="10.9.9.9")
    codes = bad_logins(untrusted, LIMIT + 1)
    # Each try claimed a new address; the limit counted the one the client really has (the
    # failure that reaches it is answered with the lockout).
    assert codes == [200] * (LIMIT - 1) + [429, 429], codes
    addresses = set(
        AuditEntry.objects.filter(action="login.failed").values_list("remote_addr", flat=True)
    )
    assert addresses == {"127.0.0.1"}, addresses

    AuditEntry.objects.all().delete()
    from axes.models import AccessAttempt

    AccessAttempt.objects.all().delete()
    proxied = web(start, production_env, trusted="127.0.0.1")
    codes = bad_logins(proxied, LIMIT + 1)
    assert codes == [200] * (LIMIT + 1), codes  # four clients behind the proxy, one try each
    addresses = set(
        AuditEntry.objects.filter(action="login.failed").values_list("remote_addr", flat=True)
    )
    assert addresses == {f"203.0.113.{i + 1}" for i in range(LIMIT + 1)}, addresses
