"""The what-if form: a day's 24 hourly request rates, the SLO, replica bounds and the
scalers' timing. ``scaling.services.whatif.create_plan`` checks the same rules again."""

from __future__ import annotations

import re

from django import forms

from scaling.planning.whatif import MAX_RATE, PlanError, check_day

_SPLIT = re.compile(r"[\s,;]+")


class WhatIfForm(forms.Form):
    hourly_rates = forms.CharField(
        label="Requests/s per hour (00:00 to 23:00)",
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        help_text="24 numbers, separated by commas or spaces: each hour's mean request rate. "
        "Between hours the rate changes linearly (minute by minute). "
        f"0 to {MAX_RATE:,.0f} req/s.",
    )
    slo_ttft_p95_ms = forms.FloatField(label="SLO: p95 TTFT (ms)", min_value=1, max_value=600_000)
    min_replicas = forms.IntegerField(min_value=0, max_value=1000)
    max_replicas = forms.IntegerField(min_value=1, max_value=1000)
    fixed_replicas = forms.IntegerField(
        label="Fixed N",
        required=False,
        min_value=1,
        max_value=1000,
        help_text="Replicas of the fixed policy; empty: enough for the peak hour at the SLO.",
    )
    target_utilisation = forms.FloatField(
        label="Utilisation target (%)",
        min_value=1,
        max_value=100,
        help_text="The HPA's GPU-utilisation target.",
    )
    target_utilisation_high = forms.FloatField(
        label="Second utilisation target (%)",
        min_value=1,
        max_value=100,
        help_text="The same HPA rule at the high target teams move to when the first holds "
        "too many replicas; shown beside it.",
    )
    start_delay_s = forms.FloatField(
        label="Start-up delay (s)",
        required=False,
        min_value=0,
        max_value=3600,
        help_text="Empty: measured from this deployment's engine starts.",
    )
    stabilisation_s = forms.IntegerField(
        label="Scale-down stabilisation (s)", min_value=0, max_value=86_400
    )
    polling_interval_s = forms.IntegerField(
        label="Polling interval (s)", min_value=1, max_value=3600
    )

    def clean_hourly_rates(self) -> list[float]:
        text = self.cleaned_data["hourly_rates"].strip()
        parts = [p for p in _SPLIT.split(text) if p]
        try:
            values = [float(p) for p in parts]
        except ValueError:
            bad = next(p for p in parts if not _is_number(p))
            raise forms.ValidationError(f"{bad!r} is not a number of requests/s.") from None
        try:
            return check_day(values)
        except PlanError as exc:
            raise forms.ValidationError(f"{str(exc)[:1].upper()}{str(exc)[1:]}.") from None

    def clean(self):
        data = super().clean()
        low, high = data.get("min_replicas"), data.get("max_replicas")
        if low is not None and high is not None and low > high:
            self.add_error("min_replicas", f"More than the maximum ({high}).")
        fixed = data.get("fixed_replicas")
        if fixed is not None and high is not None and fixed > high:
            self.add_error("fixed_replicas", f"More than the maximum ({high}).")
        return data


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
