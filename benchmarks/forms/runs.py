"""Launching a benchmark: which deployment, which profile version, a label, and how many
load generators send its load."""

from __future__ import annotations

from django import forms

from benchmarks.models import MAX_SHARDS, LoadProfile
from benchmarks.services.shards import refusal
from hosts.models import Deployment


class DeploymentChoice(forms.ModelChoiceField):
    def label_from_instance(self, obj: Deployment) -> str:
        config = f"config v{obj.active_config.version}" if obj.active_config else "no config"
        return f"{obj} · {obj.get_engine_display()} {obj.engine_version} · {obj.model} · {config}"


class ProfileChoice(forms.ModelChoiceField):
    def label_from_instance(self, obj: LoadProfile) -> str:
        return f"{obj} — {obj.summary}"


class RunForm(forms.Form):
    deployment = DeploymentChoice(
        queryset=Deployment.objects.select_related("host", "active_config").order_by(
            "host__name", "name"
        ),
        help_text="The engine under test; it runs with its active config version.",
    )
    load_profile = ProfileChoice(
        queryset=LoadProfile.objects.none(),
        label="Load profile",
        help_text="The newest version of each profile (or the version you came from).",
    )
    label = forms.CharField(
        max_length=100, required=False, help_text="e.g. 'baseline' or 'max-num-seqs 512'."
    )
    shards = forms.IntegerField(
        label="Load generators",
        min_value=1,
        max_value=MAX_SHARDS,
        initial=1,
        required=False,
        help_text=f"1 to {MAX_SHARDS}. More than one splits the profile's one schedule over "
        "workers of the loadgen queue, for loads one process cannot send on time "
        "(request-rate stages only).",
    )

    def __init__(self, *args, extra_profile: LoadProfile | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        profiles = LoadProfile.objects.latest()
        if extra_profile is not None:
            profiles = LoadProfile.objects.filter(pk__in=profiles.values("pk")) | (
                LoadProfile.objects.filter(pk=extra_profile.pk)
            )
        self.fields["load_profile"].queryset = profiles.order_by("name", "-version")

    def clean_shards(self) -> int:
        return self.cleaned_data["shards"] or 1  # left empty: one load generator

    def clean(self):
        data = super().clean()
        profile, shards = data.get("load_profile"), data.get("shards")
        if profile is not None and shards is not None:
            try:
                problem = refusal(profile.spec, shards)
            except ValueError:
                problem = None  # a profile that cannot run is refused when it starts
            if problem:
                self.add_error("shards", problem)
        return data
