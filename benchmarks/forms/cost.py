"""Forms of the cost page (its GET parameters) and of the price list."""

from __future__ import annotations

import re

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS
from django.db.models import Max

from benchmarks import cost, cost_ranking
from benchmarks.choices import Pricing
from benchmarks.models import BenchmarkRun, LoadProfile, Price
from benchmarks.services.prices import PRICE_AS
from hosts.models import Host

RUN_CHOICES_SHOWN = 100
CURRENCY = re.compile(r"^[A-Z]{3}$")
FOCUS = re.compile(r"\d{1,18}(-(\d{1,18}|host))?")


class CostForm(forms.Form):
    """What the cost page assumes: how much of the paid time serves traffic, the pricing,
    the SLO a run must meet, which runs to compare and at which prices. Every field has a
    default, so a bare ``/cost/`` is a valid request."""

    DEFAULTS = {
        "utilisation_pct": "100",
        "restart_overhead_pct": "0",
        "pricing": Pricing.ON_DEMAND,
        "slo_ttft_p95_ms": "500",
        # Errors count unless the user clears the field: 1 % (cost_ranking.DEFAULT_MAX_ERROR_RATE).
        "max_error_rate_pct": f"{cost_ranking.DEFAULT_MAX_ERROR_RATE * 100:g}",
        "rank_by": "per_request",
    }

    utilisation_pct = forms.FloatField(
        label="Utilisation (%)",
        help_text="Share of the paid hours with traffic at the measured rate; the rest is idle.",
    )
    restart_overhead_pct = forms.FloatField(
        label="Restart overhead (%)",
        help_text="Share of the serving time lost to restarts, model loading and recovery.",
    )
    pricing = forms.ChoiceField(
        choices=Pricing.choices,
        help_text="Which price of each host (and of each instance type with the same GPUs) "
        "applies; chosen prices apply as they are.",
    )
    slo_ttft_p95_ms = forms.FloatField(
        label="SLO: p95 TTFT at most (ms)", required=False, min_value=0
    )
    max_error_rate_pct = forms.FloatField(
        label="SLO: error rate at most (%)",
        required=False,
        min_value=0,
        max_value=100,
        help_text=f"Default {cost_ranking.DEFAULT_MAX_ERROR_RATE * 100:g} %: a config that fails "
        "more requests is not cheap, whatever it costs per success. Empty: any error rate.",
    )
    rank_by = forms.ChoiceField(label="Cheapest by", choices=list(cost.METRICS.items()))
    profile = forms.ModelChoiceField(
        queryset=LoadProfile.objects.all(),
        required=False,
        label="Rank runs of profile",
        empty_label="the one most selected runs used",
        help_text="Only runs of one load profile are ranked: a config measured under a "
        "lighter load looks cheaper. Runs of other profiles are listed, not ranked.",
    )
    runs = forms.ModelMultipleChoiceField(
        queryset=BenchmarkRun.objects.filter(completed__isnull=False),
        required=False,
        help_text="Empty: the latest 20 succeeded runs.",
        widget=forms.SelectMultiple(attrs={"size": 6}),
    )
    price_as = forms.ChoiceField(
        label="Price each run at",
        required=False,
        choices=list(PRICE_AS.items()),
        help_text="Each run at each price is one option in the ranking: which config on "
        "which instance type is cheapest. Empty: the chosen prices if any, else the host's.",
    )
    prices = forms.ModelMultipleChoiceField(
        queryset=Price.objects.order_by("name", "pricing"),
        required=False,
        label="Chosen prices",
        help_text="Instance types to price every selected run at (with “each chosen price”).",
        widget=forms.SelectMultiple(attrs={"size": 6}),
    )
    # A row of the table: "<run pk>-host", "<run pk>-<price pk>", or a run pk (its first row).
    focus = forms.CharField(required=False, widget=forms.HiddenInput)

    def __init__(self, query=None, **kwargs):
        data = query.copy() if query is not None else None
        if data is not None:
            for key, value in self.DEFAULTS.items():
                if key not in data:
                    data[key] = value
        else:
            data = self.DEFAULTS
        super().__init__(data, **kwargs)
        # The select lists recent runs, not all 10,000: the query string may name any other.
        selected = data.getlist("runs") if hasattr(data, "getlist") else []
        shown = BenchmarkRun.objects.filter(completed__isnull=False).order_by("-created_at", "-pk")
        rows = list(
            shown.values_list(
                "pk", "label", "deployment__host__name", "deployment__name", "status"
            )[:RUN_CHOICES_SHOWN]
        )
        known = {str(row[0]) for row in rows}
        extra = [pk for pk in selected if pk.isdigit() and pk not in known]
        if extra:
            rows += list(
                shown.filter(pk__in=extra).values_list(
                    "pk", "label", "deployment__host__name", "deployment__name", "status"
                )
            )
        # Profiles that have runs to price, those used most recently first.
        used = (
            LoadProfile.objects.filter(runs__completed__isnull=False)
            .annotate(latest=Max("runs__created_at"))
            .order_by("-latest")
        )
        listed = [(profile.pk, str(profile)) for profile in used[:RUN_CHOICES_SHOWN]]
        wanted = data.get("profile") if hasattr(data, "get") else None
        if wanted and str(wanted).isdigit() and int(wanted) not in {pk for pk, _ in listed}:
            listed += [(p.pk, str(p)) for p in LoadProfile.objects.filter(pk=int(wanted))]
        self.fields["profile"].widget.choices = [("", self.fields["profile"].empty_label)] + listed
        self.fields["runs"].widget.choices = [
            (pk, f"#{pk} {label} · {host}/{name}{'' if status == 'succeeded' else ' · ' + status}")
            for pk, label, host, name, status in rows
        ]

    def clean_utilisation_pct(self):
        value = self.cleaned_data["utilisation_pct"]
        if not 0 < value <= 100:
            raise forms.ValidationError("Utilisation must be more than 0 % and at most 100 %.")
        return value

    def clean_restart_overhead_pct(self):
        value = self.cleaned_data["restart_overhead_pct"]
        if not 0 <= value < 100:
            raise forms.ValidationError(
                "Restart overhead must be at least 0 % and less than 100 %."
            )
        return value

    def clean_focus(self) -> str:
        # Only ever set by the page's own links: one that names no row (an edited URL, a
        # price since deleted) shows the cheapest, rather than a form error nobody can see.
        value = self.cleaned_data.get("focus") or ""
        return value if FOCUS.fullmatch(value) else ""

    def clean(self):
        data = super().clean()
        if not data.get("price_as"):
            data["price_as"] = "chosen" if data.get("prices") else "host"
        if data["price_as"] == "chosen" and not data.get("prices"):
            self.add_error("prices", "Choose at least one price to price the runs at.")
        return data

    def report_arguments(self) -> dict:
        """Keyword arguments of ``benchmarks.services.cost_report.cost_report``."""
        data = self.cleaned_data
        error = data.get("max_error_rate_pct")
        return {
            "runs": [run.pk for run in data.get("runs") or []],
            "utilisation": data["utilisation_pct"] / 100,
            "restart_overhead": data["restart_overhead_pct"] / 100,
            "pricing": data["pricing"],
            "slo": cost_ranking.Slo(
                ttft_p95_ms=data.get("slo_ttft_p95_ms"),
                max_error_rate=None if error is None else error / 100,
            ),
            "metric": data["rank_by"],
            "price_as": data["price_as"],
            "prices": [price.pk for price in data.get("prices") or []],
            "focus": data.get("focus") or None,
            "profile": data["profile"].pk if data.get("profile") else None,
        }


class PriceForm(forms.ModelForm):
    """One instance type's hourly price under one pricing, and the hosts of that type."""

    class Meta:
        model = Price
        fields = [
            "name",
            "pricing",
            "hourly_price",
            "currency",
            "gpu_model",
            "gpu_count",
            "hosts",
            "note",
        ]
        widgets = {"hosts": forms.SelectMultiple(attrs={"size": 8})}
        help_texts = {
            "hourly_price": "Per hour for the whole instance (all its GPUs).",
            "currency": "ISO 4217 code, e.g. USD, EUR.",
            "hosts": "The hosts that are this instance type (hold Ctrl/⌘ to pick several).",
            "gpu_model": "As people write it (H100, A100-SXM4-40GB): the cost page prices runs "
            "on these GPUs at this price when its model names theirs in whole words.",
            "gpu_count": "GPUs in one instance; with the model, what runs it prices.",
        }
        error_messages = {
            NON_FIELD_ERRORS: {
                "unique_together": "This instance type already has a price under this "
                "pricing: edit that one instead."
            }
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["hosts"].queryset = Host.objects.order_by("name")

    def clean_currency(self):
        value = self.cleaned_data["currency"].strip().upper()
        if not CURRENCY.match(value):
            raise forms.ValidationError("A currency is three letters, e.g. USD.")
        return value

    def clean(self):
        data = super().clean()
        hosts, pricing = data.get("hosts"), data.get("pricing")
        if hosts and pricing:
            # Two prices for one host under one pricing would make its cost a coin toss.
            taken = (
                Price.hosts.through.objects.filter(host__in=hosts, price__pricing=pricing)
                .exclude(price_id=self.instance.pk)
                .select_related("host", "price")
                .order_by("host__name")
            )
            clashes = [f"{link.host.name} ({link.price.name})" for link in taken]
            if clashes:
                self.add_error(
                    "hosts",
                    f"Already priced under {Pricing(pricing).label.lower()}: "
                    f"{', '.join(clashes)}. A host has one price per pricing.",
                )
        return data
