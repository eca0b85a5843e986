"""Price workflows: which hourly price applies to a host, and keeping the price list. The cost
page's report is ``benchmarks.services.cost_report``; the arithmetic lives in
``benchmarks.cost``."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from decimal import Decimal

from django.conf import settings
from django.db import transaction

from benchmarks import cost
from benchmarks.choices import Pricing
from benchmarks.models import GPU_SEPARATOR, Price
from controlpanel.services import audit, snapshot
from hosts.services.gpus import gpu_facts

DEFAULT_RUN_COUNT = 20
# Which prices each selected run is evaluated under on the cost page.
PRICE_AS = {
    "host": "its host's price",
    "matching": "its host's price and every listed price for the same GPUs",
    "chosen": "each chosen price",
}
PRICE_FIELDS = [
    "name",
    "pricing",
    "hourly_price",
    "currency",
    "gpu_model",
    "gpu_count",
    "hosts",
    "note",
]


def _host_price_source(host, pricing: str) -> str:
    source = f"{host.name}'s hourly price"
    if pricing != Pricing.ON_DEMAND:
        # Said out loud: a spot page quietly showing on-demand prices would mislead.
        source += f" (no {Pricing(pricing).label.lower()} price listed: on-demand)"
    return source


def hourly_price_for(host, pricing: str = Pricing.ON_DEMAND) -> tuple[Decimal, str, str]:
    """(price per hour, currency, where it came from) for ``host`` under ``pricing``: the
    instance type's price when the host is linked to one with that pricing, else the host's
    own hourly price (which stands for on-demand)."""
    price = Price.objects.filter(hosts=host, pricing=pricing).order_by("name").first()
    if price is not None:
        return price.hourly_price, price.currency, str(price)
    return host.hourly_price, settings.PANEL_CURRENCY, _host_price_source(host, pricing)


def hourly_prices_for(hosts, pricing: str = Pricing.ON_DEMAND) -> dict:
    """``hourly_price_for`` of many hosts in one query: {host pk: (price, currency, source)}."""
    hosts = list(hosts)
    choices = host_price_choices(hosts, pricing)
    return {
        host.pk: (choices[host.pk].hourly_price, choices[host.pk].currency, choices[host.pk].source)
        for host in hosts
    }


@dataclass(frozen=True)
class PriceChoice:
    """One hourly price a run can be evaluated under: its host's own (``key`` "host") or a
    listed instance type's (``key`` its pk), with where it came from."""

    key: str
    hourly_price: Decimal
    currency: str
    source: str
    name: str
    price: Price | None = None


def listed(price: Price) -> PriceChoice:
    return PriceChoice(
        str(price.pk), price.hourly_price, price.currency, str(price), str(price), price
    )


def host_price_choices(hosts, pricing: str = Pricing.ON_DEMAND) -> dict[int, PriceChoice]:
    """Each host's price under ``pricing`` (as ``hourly_price_for``), in one query."""
    hosts = list(hosts)
    links = (
        Price.hosts.through.objects.filter(host__in=hosts, price__pricing=pricing)
        .select_related("price")
        .order_by("price__name")
    )
    found = {}
    for link in links:
        found.setdefault(link.host_id, link.price)
    result = {}
    for host in hosts:
        price = found.get(host.pk)
        if price is not None:
            result[host.pk] = replace(listed(price), key="host")
        else:
            result[host.pk] = PriceChoice(
                "host",
                host.hourly_price,
                settings.PANEL_CURRENCY,
                _host_price_source(host, pricing),
                host.name,
            )
    return result


def _words(name: str) -> list[str]:
    return [word for word in re.split(r"[\s\-_/]+", name.lower()) if word]


def same_gpus(price: Price, gpu_model: str, gpu_count: int | None) -> bool:
    """Whether ``price``'s instance type has the GPUs a run used: as many, and of the one
    model the run used (a run on mixed GPUs matches no instance type). The price's model
    names it in whole words, as people write it: "H100" and "H100 80GB" name "NVIDIA H100
    80GB HBM3"; "A100-SXM4-40GB" does not name an "NVIDIA A100-SXM4-80GB". A price without
    a GPU model and count matches nothing (choose it by hand)."""
    if not (price.gpu_model.strip() and price.gpu_count and gpu_model and gpu_count):
        return False
    if price.gpu_count != gpu_count or GPU_SEPARATOR in gpu_model:
        return False
    want, have = _words(price.gpu_model), _words(gpu_model)
    return any(have[i : i + len(want)] == want for i in range(len(have) - len(want) + 1))


# --- the price list -------------------------------------------------------------------------


def _stored(price: Price) -> dict:
    # Read back so both sides of a diff have the stored precision (2.5 is stored as 2.5000).
    return snapshot(Price.objects.prefetch_related("hosts").get(pk=price.pk), PRICE_FIELDS)


def create_price(actor, form) -> Price:
    with transaction.atomic():
        price = form.save()
        audit(actor, "price.create", price, after=_stored(price))
    return price


def update_price(actor, price: Price, form) -> Price:
    with transaction.atomic():
        before = _stored(price)
        price = form.save()
        after = _stored(price)
        if after != before:
            audit(actor, "price.update", price, before=before, after=after)
    return price


def delete_price(actor, price: Price) -> None:
    with transaction.atomic():
        audit(actor, "price.delete", price, before=_stored(price))
        price.delete()


def price_rows(prices) -> list[dict]:
    """The price list with per-GPU-hour and per-month figures."""
    rows = []
    for price in prices:
        per_gpu = price.hourly_price / price.gpu_count if price.gpu_count else None
        rows.append(
            {
                "price": price,
                "per_gpu_hour": per_gpu,
                "per_month": price.hourly_price * cost.HOURS_PER_MONTH,
                "text": {
                    "price": cost.money(price.hourly_price, price.currency, cost.EXACT),
                    "per_gpu_hour": cost.money(per_gpu, price.currency),
                },
            }
        )
    return rows


def deployment_target(deployment) -> dict:
    """What a prediction models for ``deployment`` (a sweep's, a what-if's): the simulator's
    GPU key and count, the time scale of a simulated engine (it runs that much faster than a
    real GPU, and its measured numbers with it), and the price of one GPU-hour (the host's
    hourly price over its GPUs)."""
    gpu, num_gpus, _ = gpu_facts(deployment)
    time_scale = 1.0
    if deployment.runner == "simulator":
        time_scale = float((deployment.simulator or {}).get("time_scale") or 1.0)
    price, currency, source = hourly_price_for(deployment.host)
    # Per GPU of the host: a deployment given some of its GPUs by index models only those.
    host_gpus = deployment.host.gpus.count() or num_gpus
    per_gpu = float(Decimal(price) / host_gpus) if price and host_gpus else None
    return {
        "gpu": gpu,
        "num_gpus": num_gpus,
        "time_scale": time_scale,
        "price_per_gpu_hour": per_gpu,
        "currency": currency,
        "price_source": source,
    }
