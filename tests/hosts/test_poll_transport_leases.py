"""The poller's cached transport is shared by threads (beat's fleet poll, a benchmark's own
readings, the embedded worker's jobs): one in use is never closed under its user (issue 37
item 2: an admin edited a host's price during a run, the next poll rebuilt the transport and
closed the old one mid-read — "Unreachable: [Errno 9] Bad file descriptor" for minutes while
telemetry kept flowing), and an edit that does not change how the host is reached keeps it."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest
from django.urls import reverse

from hosts.models import Host
from hosts.services import transports
from hosts.services.telemetry import poll_host
from tests.factories import make_host
from tests.hosts.test_host_trust import form_data

pytestmark = pytest.mark.django_db


class FakeTransport:
    """Counts its reads and fails a read after ``close()``, as a closed client does."""

    def __init__(self, host: Host):
        self.port = host.port
        self.closed = False
        self.reads = 0

    def telemetry(self) -> dict:
        if self.closed:
            raise transports.TransportError("[Errno 9] Bad file descriptor")
        self.reads += 1
        return {"gpus": []}

    def close(self) -> None:
        self.closed = True

    def __enter__(self):  # as hosts.transport.base.Transport
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture
def built(monkeypatch):
    """Every transport the cache builds, in order."""
    made: list[FakeTransport] = []

    def build(host, deployment=None):
        made.append(FakeTransport(host))
        return made[-1]

    monkeypatch.setattr(transports, "transport_for", build)
    yield made
    for pk in list(transports._poll_transports):
        transports.forget_transport(pk)


def edited(host: Host, **fields) -> Host:
    """The host row after an edit saved elsewhere (the admin, another process)."""
    Host.objects.filter(pk=host.pk).update(**fields)
    row = Host.objects.get(pk=host.pk)
    row.save()  # a full save, as the admin's: a new updated_at
    return Host.objects.get(pk=host.pk)


def test_a_price_edit_during_a_read_keeps_the_transport(built):
    host = make_host()
    with transports.poll_transport(host) as in_use:
        assert in_use.telemetry()
        newer = edited(host, hourly_price=Decimal("9.75"))
        assert newer.updated_at != host.updated_at
        # The next poll, with the edited row, while the first read is still going on.
        with transports.poll_transport(newer) as next_poll:
            assert next_poll is in_use
        assert not in_use.closed and in_use.telemetry()
    assert len(built) == 1 and not in_use.closed
    # A job still holding the row as it was before the edit polls beside beat: no rebuild.
    with transports.poll_transport(host) as again:
        assert again is in_use
    assert transports.has_poll_transport(host) and transports.has_poll_transport(newer)


def test_a_new_address_builds_a_new_transport_and_the_old_closes_after_its_user(built):
    host = make_host()
    with transports.poll_transport(host) as old:
        moved = edited(host, port=9200)
        with transports.poll_transport(moved) as fresh:
            assert fresh is not old and fresh.port == 9200
        assert not old.closed and old.telemetry()  # still being read by the first user
    assert old.closed and not fresh.closed


def test_a_transport_forgotten_by_another_thread_is_closed_by_its_last_user(built):
    host = make_host()
    with transports.poll_transport(host) as in_use:
        failed = threading.Thread(target=transports.forget_transport, args=(host.pk,))
        failed.start()
        failed.join()
        assert not in_use.closed and in_use.telemetry()
    assert in_use.closed
    with transports.poll_transport(host) as rebuilt:
        assert rebuilt is not in_use and not rebuilt.closed


def test_the_edit_page_keeps_the_transport_for_a_price_and_drops_it_for_a_port(
    built, client, admin
):
    host = make_host()
    poll_host(host)
    first = built[-1]
    client.force_login(admin)
    url = reverse("hosts:edit", args=[host.pk])
    response = client.post(url, form_data(host, hourly_price="7.5"))
    assert response.status_code == 302
    host.refresh_from_db()
    assert host.hourly_price == Decimal("7.5")
    poll_host(host)
    assert len(built) == 1 and first.reads == 2 and not first.closed
    response = client.post(url, form_data(host, port="9300", agent_token="test-token"))
    assert response.status_code == 302
    assert first.closed  # nobody held it: closed at once
    host.refresh_from_db()
    poll_host(host)
    assert len(built) == 2 and built[-1].port == 9300 and built[-1].reads == 1
    host.refresh_from_db()
    assert host.status == "online", host.last_error
