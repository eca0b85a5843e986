"""Price workflows: which hourly price applies to a host, and keeping the price list."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings

from benchmarks.choices import Pricing
from benchmarks.models import Price


def hourly_price_for(host, pricing: str = Pricing.ON_DEMAND) -> tuple[Decimal, str, str]:
    """(price per hour, currency, where it came from) for ``host`` under ``pricing``: the
    instance type's price when the host is linked to one with that pricing, else the host's
    own hourly price (which stands for on-demand)."""
    price = Price.objects.filter(hosts=host, pricing=pricing).order_by("name").first()
    if price is not None:
        return price.hourly_price, price.currency, str(price)
    return host.hourly_price, settings.PANEL_CURRENCY, f"{host.name}'s hourly price"
