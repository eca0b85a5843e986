"""Reachability checks: the service against real sockets, the task's bookkeeping, the views."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from controlpanel.choices import OperationStatus
from controlpanel.models import AuditEntry, InvalidTransition
from hosts import tasks
from hosts.choices import CheckOutcome
from hosts.models import HostCheck
from hosts.services import checks
from hosts.transport.base import AuthError, TransportError
from tests.conftest import free_port
from tests.factories import make_host

pytestmark = pytest.mark.django_db


def test_reachable_host(listener):
    check = HostCheck.objects.create(host=make_host(port=listener))
    checks.run_host_check(check)
    check.refresh_from_db()
    assert check.status == OperationStatus.SUCCEEDED and check.reachable is True
    assert check.latency_ms is not None and check.latency_ms >= 0
    assert check.started_at <= check.finished_at


def test_unreachable_host_is_a_finished_check_not_a_failure():
    port = free_port()  # nothing listens there
    check = HostCheck.objects.create(host=make_host(port=port))
    checks.run_host_check(check)
    check.refresh_from_db()
    assert check.status == OperationStatus.SUCCEEDED and check.reachable is False
    assert f"127.0.0.1:{port}" in check.detail and check.latency_ms is None
    assert check.outcome == CheckOutcome.UNREACHABLE


def test_task_records_an_unexpected_error_on_the_row(monkeypatch):
    check = HostCheck.objects.create(host=make_host())

    def boom(check):
        check.transition_to(OperationStatus.RUNNING)
        raise RuntimeError("transport exploded")

    monkeypatch.setattr(checks, "run_host_check", boom)
    with pytest.raises(RuntimeError):
        tasks.check_host.run(check.pk)
    check.refresh_from_db()
    assert check.status == OperationStatus.FAILED
    assert check.error == "RuntimeError: transport exploded" and check.finished_at


def test_task_ignores_finished_and_missing_checks(listener):
    check = HostCheck.objects.create(host=make_host(port=listener))
    checks.run_host_check(check)
    finished_at = HostCheck.objects.get(pk=check.pk).finished_at
    tasks.check_host.run(check.pk)  # a redelivery does nothing
    assert HostCheck.objects.get(pk=check.pk).finished_at == finished_at
    tasks.check_host.run(999999)


def test_status_machine_refuses_going_backwards(listener):
    check = HostCheck.objects.create(host=make_host(port=listener))
    checks.run_host_check(check)
    with pytest.raises(InvalidTransition):
        check.transition_to(OperationStatus.RUNNING)


def test_request_enqueues_after_commit(operator, django_capture_on_commit_callbacks, monkeypatch):
    sent = []
    monkeypatch.setattr(tasks.check_host, "apply_async", lambda args, **kw: sent.append(args[0]))
    host = make_host()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        check = checks.request_host_check(operator, host)
        assert sent == []  # nothing leaves before the row is committed
    for callback in callbacks:
        callback()
    assert sent == [check.pk]
    assert AuditEntry.objects.filter(action="host.check", object_id=str(host.pk)).exists()


def test_sweep_checks_every_host_and_prunes_old_checks(settings, monkeypatch):
    monkeypatch.setattr(tasks.check_host, "apply_async", lambda args, **kw: None)
    a, b = make_host(), make_host()
    old = HostCheck.objects.create(host=a)
    HostCheck.objects.filter(pk=old.pk).update(
        created_at=timezone.now() - timedelta(days=settings.HOST_CHECK_RETENTION_DAYS + 1)
    )
    queued = checks.check_all_hosts()
    assert {c.host_id for c in queued} == {a.pk, b.pk}
    assert all(c.requested_by is None for c in queued)
    assert not HostCheck.objects.filter(pk=old.pk).exists()


def test_check_view_queues_a_check_and_tells_htmx_to_refresh(client, operator, monkeypatch):
    monkeypatch.setattr(tasks.check_host, "apply_async", lambda args, **kw: None)
    host = make_host()
    client.force_login(operator)
    response = client.post(reverse("hosts:check", args=[host.pk]), HTTP_HX_REQUEST="true")
    assert response.status_code == 204 and response["HX-Trigger"] == "checks-changed"
    assert host.checks.get().requested_by == operator
    fragment = client.get(reverse("hosts:checks", args=[host.pk])).content.decode()
    assert "<table>" in fragment and "Queued" in fragment and 'id="checks"' not in fragment
    page = client.get(host.get_absolute_url()).content.decode()
    assert "checks-changed from:body" in page and 'hx-swap="innerHTML"' in page


def test_check_view_without_htmx_redirects_to_the_host(client, operator, monkeypatch):
    monkeypatch.setattr(tasks.check_host, "apply_async", lambda args, **kw: None)
    host = make_host()
    client.force_login(operator)
    response = client.post(reverse("hosts:check", args=[host.pk]))
    assert response.status_code == 302 and response["Location"] == host.get_absolute_url()


def test_check_view_refuses_get(client, operator):
    client.force_login(operator)
    assert client.get(reverse("hosts:check", args=[make_host().pk])).status_code == 405


class _Refusing:
    """A transport whose host answers the port but refuses what we send."""

    def __init__(self, exc):
        self.exc = exc

    def __enter__(self):
        raise self.exc

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize(
    ("exc", "outcome", "label"),
    [
        (AuthError("token rejected"), CheckOutcome.AUTH_FAILED, "Credentials refused"),
        (TransportError("Connection refused"), CheckOutcome.FAILED, "Connection failed"),
    ],
)
def test_a_refused_connection_is_a_red_outcome_not_succeeded(
    client, operator, listener, monkeypatch, exc, outcome, label
):
    """The check ran to its end (status succeeded), but the badge says what it found."""
    monkeypatch.setattr(checks, "transport_for", lambda host: _Refusing(exc))
    host = make_host(port=listener)
    check = checks.run_host_check(HostCheck.objects.create(host=host))
    check.refresh_from_db()
    assert check.status == OperationStatus.SUCCEEDED and check.outcome == outcome
    assert outcome.colour == "red"
    client.force_login(operator)
    fragment = client.get(reverse("hosts:checks", args=[host.pk])).content.decode()
    assert f'<span class="badge red" data-check-outcome="{outcome.value}">{label}</span>' in (
        fragment
    )
    assert "Succeeded" not in fragment
    dashboard = client.get(reverse("dashboard")).content.decode()
    assert f'data-check-outcome="{outcome.value}">{label}' in dashboard
    assert "Succeeded" not in dashboard


def test_a_port_without_credentials_is_not_called_connected(listener):
    check = HostCheck.objects.create(host=make_host(port=listener, agent_token=""))
    checks.run_host_check(check)
    check.refresh_from_db()
    assert check.outcome == CheckOutcome.PORT_OPEN and CheckOutcome.PORT_OPEN.colour == "amber"


def test_a_check_that_has_not_run_shows_its_status(client, operator):
    host = make_host()
    HostCheck.objects.create(host=host)
    client.force_login(operator)
    fragment = client.get(reverse("hosts:checks", args=[host.pk])).content.decode()
    assert '<span class="badge grey">Queued</span>' in fragment
