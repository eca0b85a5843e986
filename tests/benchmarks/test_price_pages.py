"""The price list and the price services: hourly prices per host, the create / edit / delete
pages with their audit entries and form errors, and who may see or change prices (the cost
page included)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from benchmarks.models import Price
from benchmarks.services import prices as services
from controlpanel.models import AuditEntry
from tests.factories import make_host

pytestmark = pytest.mark.django_db

# --- prices: services -----------------------------------------------------------------------


def test_hourly_prices_for_many_hosts_in_one_query():
    a, b, c = make_host(name="a"), make_host(name="b"), make_host(name="c", hourly_price=7)
    reserved = Price.objects.create(name="m1", pricing="reserved", hourly_price=Decimal("1.5"))
    reserved.hosts.add(a, b)
    second = Price.objects.create(name="z9", pricing="reserved", hourly_price=Decimal("9"))
    second.hosts.add(b)  # b under two names: the first by name wins, as hourly_price_for
    with CaptureQueriesContext(connection) as queries:
        found = services.hourly_prices_for([a, b, c], "reserved")
    assert len(queries) == 1
    for host in (a, b, c):
        assert found[host.pk] == services.hourly_price_for(host, "reserved")
    assert found[a.pk][:2] == (Decimal("1.5000"), "USD")
    assert found[c.pk][0] == Decimal("7.0000")


def test_hourly_price_for_falls_back_to_the_host():
    host = make_host(hourly_price=Decimal("3.10"))
    assert services.hourly_price_for(host) == (
        Decimal("3.10"),
        "USD",
        f"{host.name}'s hourly price",
    )


# --- prices: pages --------------------------------------------------------------------------


def price_data(**kw):
    data = {
        "name": "p5.48xlarge",
        "pricing": "on_demand",
        "hourly_price": "98.32",
        "currency": "usd",
        "gpu_model": "H100",
        "gpu_count": "8",
        "note": "list price",
    }
    data.update(kw)
    return data


def test_admin_creates_a_price_with_hosts_and_it_is_audited(client, admin):
    a, b = make_host(name="h-a"), make_host(name="h-b")
    client.force_login(admin)
    response = client.post(reverse("benchmarks:price_create"), price_data(hosts=[a.pk, b.pk]))
    assert response.status_code == 302 and response["Location"] == reverse("benchmarks:prices")
    price = Price.objects.get()
    assert price.currency == "USD" and price.hourly_price == Decimal("98.32")
    assert set(price.hosts.all()) == {a, b}
    entry = AuditEntry.objects.get(action="price.create")
    assert entry.actor == admin and entry.object_id == str(price.pk)
    assert entry.after["hourly_price"] == "98.3200" and sorted(entry.after["hosts"]) == sorted(
        [a.pk, b.pk]
    )


def test_price_list_shows_per_gpu_hour(client, viewer):
    host = make_host(name="listed-host")
    price = Price.objects.create(
        name="p5.48xlarge", hourly_price=Decimal("98.32"), gpu_count=8, gpu_model="H100"
    )
    price.hosts.add(host)
    client.force_login(viewer)
    response = client.get(reverse("benchmarks:prices"))
    page = response.content.decode()
    assert response.context["rows"][0]["per_gpu_hour"] == Decimal("12.29")
    assert "p5.48xlarge" in page and "listed-host" in page and "12.29 USD" in page
    # The viewer sees no edit, delete or add links.
    assert reverse("benchmarks:price_edit", args=[price.pk]) not in page
    assert reverse("benchmarks:price_create") not in page


def test_edit_changes_the_price_and_audits_before_and_after(client, admin):
    host = make_host()
    price = Price.objects.create(name="g6.xlarge", hourly_price=Decimal("0.80"))
    client.force_login(admin)
    url = reverse("benchmarks:price_edit", args=[price.pk])
    assert client.get(url).status_code == 200
    response = client.post(url, price_data(name="g6.xlarge", hourly_price="0.95", hosts=[host.pk]))
    assert response.status_code == 302
    price.refresh_from_db()
    assert price.hourly_price == Decimal("0.95") and list(price.hosts.all()) == [host]
    entry = AuditEntry.objects.get(action="price.update")
    assert entry.before["hourly_price"] == "0.8000" and entry.after["hourly_price"] == "0.9500"
    assert entry.before["hosts"] == [] and entry.after["hosts"] == [host.pk]


def test_saving_without_a_change_writes_no_audit_entry(client, admin):
    price = Price.objects.create(**{**price_data(currency="USD"), "hourly_price": Decimal("98.32")})
    client.force_login(admin)
    client.post(reverse("benchmarks:price_edit", args=[price.pk]), price_data())
    assert not AuditEntry.objects.filter(action="price.update").exists()


def test_duplicate_name_and_pricing_is_shown_on_the_form(client, admin):
    Price.objects.create(name="p5.48xlarge", pricing="on_demand", hourly_price=Decimal("98"))
    client.force_login(admin)
    response = client.post(reverse("benchmarks:price_create"), price_data())
    assert response.status_code == 200
    assert "already has a price under this pricing" in response.content.decode()
    assert Price.objects.count() == 1
    # Same name, other pricing: fine.
    response = client.post(reverse("benchmarks:price_create"), price_data(pricing="spot"))
    assert response.status_code == 302 and Price.objects.count() == 2


def test_a_host_has_one_price_per_pricing(client, admin):
    host = make_host(name="shared-host")
    taken = Price.objects.create(name="a.large", hourly_price=Decimal("1"))
    taken.hosts.add(host)
    client.force_login(admin)
    response = client.post(
        reverse("benchmarks:price_create"), price_data(name="b.large", hosts=[host.pk])
    )
    assert response.status_code == 200
    assert "shared-host (a.large)" in response.content.decode()
    # Editing the price that holds the host keeps it.
    response = client.post(
        reverse("benchmarks:price_edit", args=[taken.pk]),
        price_data(name="a.large", hosts=[host.pk]),
    )
    assert response.status_code == 302


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("currency", "U$D", "three letters"),
        ("currency", "EURO", "at most 3 characters"),
        ("hourly_price", "-1", "greater than or equal to 0"),
        ("name", "", "This field is required"),
    ],
)
def test_bad_price_input(client, admin, field, value, message):
    client.force_login(admin)
    response = client.post(reverse("benchmarks:price_create"), price_data(**{field: value}))
    assert response.status_code == 200 and message in response.content.decode()
    assert not Price.objects.exists()


def test_delete_asks_first_then_deletes_and_audits(client, admin):
    price = Price.objects.create(name="old.type", hourly_price=Decimal("5"))
    client.force_login(admin)
    url = reverse("benchmarks:price_delete", args=[price.pk])
    response = client.get(url)
    assert response.status_code == 200 and "Delete old.type" in response.content.decode()
    assert Price.objects.filter(pk=price.pk).exists()
    assert client.post(url).status_code == 302
    assert not Price.objects.filter(pk=price.pk).exists()
    entry = AuditEntry.objects.get(action="price.delete")
    assert entry.object_id == str(price.pk) and entry.before["name"] == "old.type"


# --- permissions ----------------------------------------------------------------------------


@pytest.fixture
def price(db):
    return Price.objects.create(name="perm.type", hourly_price=Decimal("1"))


def urls(price):
    return {
        "cost": reverse("cost"),
        "list": reverse("benchmarks:prices"),
        "create": reverse("benchmarks:price_create"),
        "edit": reverse("benchmarks:price_edit", args=[price.pk]),
        "delete": reverse("benchmarks:price_delete", args=[price.pk]),
    }


def test_anonymous_is_sent_to_login(client, price):
    for name, url in urls(price).items():
        for response in (client.get(url), client.post(url)):
            assert response.status_code == 302, name
            assert response["Location"].startswith(reverse("login") + "?next=")
    assert Price.objects.filter(pk=price.pk).exists()


def test_a_user_without_a_role_is_refused_everything(client, nobody, price):
    client.force_login(nobody)
    for name, url in urls(price).items():
        assert client.get(url).status_code == 403, name
    assert client.post(urls(price)["delete"]).status_code == 403


@pytest.mark.parametrize("role", ["viewer", "operator", "approver"])
def test_non_admins_see_but_do_not_change_prices(client, personas, price, role):
    client.force_login(personas[role])
    pages = urls(price)
    assert client.get(pages["cost"]).status_code == 200
    assert client.get(pages["list"]).status_code == 200
    for name in ("create", "edit", "delete"):
        assert client.get(pages[name]).status_code == 403, name
    assert client.post(pages["create"], price_data()).status_code == 403
    assert client.post(pages["edit"], price_data(name="x")).status_code == 403
    assert client.post(pages["delete"]).status_code == 403
    price.refresh_from_db()
    assert price.name == "perm.type" and Price.objects.count() == 1
    assert not AuditEntry.objects.filter(action__startswith="price.").exists()


def test_admin_may_do_everything(client, admin, price):
    client.force_login(admin)
    for name, url in urls(price).items():
        assert client.get(url).status_code == 200, name
    page = client.get(urls(price)["list"]).content.decode()
    assert urls(price)["edit"] in page and urls(price)["delete"] in page
