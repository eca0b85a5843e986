"""The what-if form: a day's 24 hourly request rates (typed, or measured from a traffic sample
with the typed ones filling the hours it does not cover), the SLO, replica bounds and the
scalers' timing. ``scaling.services.whatif.create_plan`` checks the same rules again."""

from __future__ import annotations

import re

from django import forms

from benchmarks.choices import ProfileSource
from benchmarks.loadgen import traffic
from benchmarks.models import LoadProfile
from scaling.planning.dayshape import (
    MIN_COVERAGE_S,
    DayShape,
    DayShapeError,
    hourly_from_sample,
    rows_from_replay,
)
from scaling.planning.whatif import MAX_RATE, PlanError, check_day

_SPLIT = re.compile(r"[\s,;]+")


class WhatIfForm(forms.Form):
    hourly_rates = forms.CharField(
        label="Requests/s per hour (00:00 to 23:00)",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        help_text="24 numbers, separated by commas or spaces: each hour's mean request rate. "
        "Between hours the rate changes linearly (minute by minute). "
        f"0 to {MAX_RATE:,.0f} req/s. With a traffic sample: the hours it does not cover.",
    )
    traffic_sample = forms.FileField(
        label="Traffic sample (JSONL or CSV, with timestamps)",
        required=False,
        help_text="One request a line: input_tokens, output_tokens and a timestamp (epoch "
        "seconds or ISO-8601; times without a zone are read as UTC). Each hour of the day "
        f"(UTC) the sample covers for {MIN_COVERAGE_S / 60:g} minutes or more takes its "
        "measured rate; times in seconds from a start are placed from 00:00. At most "
        f"{traffic.MAX_ROWS:,} rows / {traffic.MAX_BYTES // 2**20} MB.",
    )
    replay_profile = forms.ModelChoiceField(
        label="Or a replay profile's requests",
        required=False,
        # The rows (up to 100,000 a profile) are read only for the one chosen.
        queryset=LoadProfile.objects.filter(source=ProfileSource.REPLAY)
        .only("id", "name", "version")
        .order_by("name", "-version"),
        help_text="Its requests at their own times (× its time scale), placed from 00:00.",
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

    def clean_hourly_rates(self) -> list[float] | None:
        text = self.cleaned_data["hourly_rates"].strip()
        parts = [p for p in _SPLIT.split(text) if p]
        if not parts:
            return None  # clean() asks for them unless a sample gives every hour
        try:
            values = [float(p) for p in parts]
        except ValueError:
            bad = next(p for p in parts if not _is_number(p))
            raise forms.ValidationError(f"{bad!r} is not a number of requests/s.") from None
        if len(values) == 24 and not any(values):
            return values  # a quiet fallback for a sample's busy hours; clean() decides
        try:
            return check_day(values)
        except PlanError as exc:
            raise forms.ValidationError(_sentence(exc)) from None

    def clean(self):
        data = super().clean()
        data["sample"] = None
        rates = data.get("hourly_rates")
        upload, profile = data.get("traffic_sample"), data.get("replay_profile")
        if upload and profile:
            self.add_error("replay_profile", "Choose a traffic sample or a replay profile.")
        elif (upload or profile) and "hourly_rates" not in self.errors:
            self._day_from_sample(data, upload, profile)
        elif "hourly_rates" not in self.errors:
            if rates is None:
                self.add_error("hourly_rates", "Give 24 hourly rates, or a traffic sample.")
            else:
                try:
                    check_day(rates)  # an all-zero day, let through above for a sample
                except PlanError as exc:
                    self.add_error("hourly_rates", _sentence(exc))
        low, high = data.get("min_replicas"), data.get("max_replicas")
        if low is not None and high is not None and low > high:
            self.add_error("min_replicas", f"More than the maximum ({high}).")
        fixed = data.get("fixed_replicas")
        if fixed is not None and high is not None and fixed > high:
            self.add_error("fixed_replicas", f"More than the maximum ({high}).")
        return data

    def _day_from_sample(self, data: dict, upload, profile: LoadProfile | None) -> None:
        """The day's rates from the sample (``hourly_rates`` fills the hours it does not
        cover) and what the plan keeps of it as ``sample``; errors go on the sample's field."""
        field = "traffic_sample" if upload else "replay_profile"
        try:
            if upload:
                # Refused by its size before anything reads it into memory.
                if upload.size > traffic.MAX_BYTES:
                    raise DayShapeError(
                        f"the file is {upload.size / 2**20:.0f} MB; a sample is at most "
                        f"{traffic.MAX_BYTES // 2**20} MB"
                    )
                rows, name = traffic.parse(upload.read(), filename=upload.name), upload.name
            else:
                rows, name = rows_from_replay(profile.spec.get("replay") or {}), str(profile)
            shape = hourly_from_sample(rows, data.get("hourly_rates"))
            hourly = check_day(shape.hourly)
        except (traffic.TrafficError, DayShapeError, PlanError) as exc:
            self.add_error(field, _sentence(exc))
        except RecursionError:  # a JSONL line nested thousands deep
            self.add_error(field, "The sample is nested too deeply to be a traffic sample.")
        else:
            data["hourly_rates"] = hourly
            data["sample"] = sample_summary(shape, name)


def sample_summary(shape: DayShape, filename: str) -> dict:
    """What the plan keeps of a sample: where its hours came from, not its rows."""
    return {
        "filename": filename[:200],
        "requests": shape.requests,
        "covered_hours": shape.covered_hours,
        "fallback_hours": shape.fallback_hours,
        "placement": shape.placement,
        "mean_input_tokens": shape.mean_input_tokens,
        "mean_output_tokens": shape.mean_output_tokens,
    }


def _sentence(exc: Exception) -> str:
    text = str(exc)
    return f"{text[:1].upper()}{text[1:]}."


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
