"""The tuning sweep form: the load, the SLO, the objective, the budget, the twins that run
trials in parallel, and the space as one text row per performance flag of the deployment's
engine version ("16,32,64", "0.80:0.95:0.05", "true,false").

The space is read here with ``benchmarks.sweep.parse_space`` (pure) so that each bad row gets
its own error beside it; ``create_sweep`` reads it again with everything else and its
``SweepInvalid`` errors land on the matching fields (``add_service_errors``)."""

from __future__ import annotations

from django import forms

from benchmarks.models import LoadProfile
from benchmarks.sweep import SpaceError, parse_space
from changes.models_sweeps import LoadMode, Objective
from changes.services import facts
from hosts.engines.flags import EngineArgError
from hosts.models import Deployment

SPACE_PREFIX = "space_"
# Rows filled in for vLLM around the running value: its batch size is the usual first knob.
PREFILLED = ("max_num_seqs", "max_num_batched_tokens")
SLO_FIELDS = ("ttft_p95_ms", "ttft_p99_ms", "itl_p95_ms", "tpot_p95_ms", "min_output_tps_per_user")
# Where a service error's key goes on the form ("" and unknown keys: the top of the form).
SERVICE_FIELDS = {
    "load_profile": "load_profile",
    "load_mode": "load_mode",
    "objective": "objective",
    "twins": "twins",
    "max_trials": "max_trials",
    "max_minutes": "max_minutes",
    "max_steps": "max_steps",
}


class TwinChoice(forms.ModelMultipleChoiceField):
    def label_from_instance(self, obj: Deployment) -> str:
        return f"{obj.host.name}/{obj.name}"


def _limit(label: str, initial=None, help_text: str = "") -> forms.FloatField:
    return forms.FloatField(
        required=False, min_value=0, initial=initial, label=label, help_text=help_text
    )


def _shown(value) -> str:
    if value is None:
        return "engine default"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _around(value) -> str:
    """×0.5, ×1, ×2 of a running integer: a first space that brackets where it runs."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        return ""
    return ",".join(str(v) for v in sorted({value // 2, value, value * 2}))


class SweepForm(forms.Form):
    """A new sweep of one deployment; ``sweep_kwargs()`` is what ``create_sweep`` takes."""

    title = forms.CharField(max_length=120, required=False, help_text="Empty: “Tune <name>”.")
    load_profile = forms.ModelChoiceField(
        LoadProfile.objects.none(),
        label="Load profile",
        help_text="Its lengths, prefixes and request count; the sweep varies only the load.",
    )
    load_mode = forms.ChoiceField(choices=LoadMode.choices, initial=LoadMode.RATE, label="Load")
    ttft_p95_ms = _limit("p95 TTFT ≤ (ms)", 500)
    ttft_p99_ms = _limit("p99 TTFT ≤ (ms)")
    itl_p95_ms = _limit("p95 ITL ≤ (ms)")
    tpot_p95_ms = _limit("p95 TPOT ≤ (ms)")
    max_error_rate = forms.FloatField(
        min_value=0, max_value=100, initial=1, label="Errors ≤ (%)", required=False
    )
    min_output_tps_per_user = _limit("Output tok/s per user ≥")
    objective = forms.ChoiceField(choices=Objective.choices, initial=Objective.TPS_PER_GPU)
    max_trials = forms.IntegerField(
        min_value=1, max_value=30, initial=4, label="Trials", help_text="The control included."
    )
    max_minutes = forms.IntegerField(min_value=2, max_value=24 * 60, initial=60, label="Minutes")
    max_steps = forms.IntegerField(
        min_value=2, max_value=12, initial=5, label="Benchmarks per trial"
    )
    twins = TwinChoice(
        Deployment.objects.none(),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Also run trials on",
        help_text="Same engine, model and GPUs: trials run side by side.",
    )
    extra_flag = forms.CharField(
        required=False, max_length=100, label="Other flag", help_text="Its setting name."
    )
    extra_values = forms.CharField(required=False, max_length=500, label="Values")

    def __init__(self, deployment: Deployment, twins, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.deployment = deployment
        running = deployment.active_config
        self.running = dict(running.settings) if running else {}
        self.fields["load_profile"].queryset = LoadProfile.objects.latest().order_by("name")
        self.fields["twins"].queryset = Deployment.objects.filter(
            pk__in=[t.pk for t in twins]
        ).select_related("host")
        self.version_problem = ""
        try:
            flags = facts.spec_flags(deployment)
        except EngineArgError as exc:
            self.version_problem = str(exc)
            flags = []
        # Only what a sweep may vary: the others would be refused by parse_space anyway.
        self.flags = {
            f.dest: f for f in flags if f.performance and not f.secret and not f.loads_code
        }
        for dest, flag in self.flags.items():
            field = forms.CharField(required=False, max_length=500, label=flag.option)
            field.flag = flag
            field.running = _shown(self.running.get(dest, flag.default))
            if deployment.engine == "vllm" and dest in PREFILLED:
                field.initial = _around(self.running.get(dest))
            self.fields[SPACE_PREFIX + dest] = field

    def space_rows(self):
        return [self[SPACE_PREFIX + dest] for dest in self.flags]

    # --- reading it ---------------------------------------------------------------------------
    def space(self) -> dict:
        data = self.cleaned_data
        out = {
            dest: data[SPACE_PREFIX + dest] for dest in self.flags if data.get(SPACE_PREFIX + dest)
        }
        extra = (data.get("extra_flag") or "").strip().lstrip("-").replace("-", "_")
        if extra:
            out[extra] = data.get("extra_values") or ""
        return out

    def slo(self) -> dict:
        data = self.cleaned_data
        slo = {k: data.get(k) for k in SLO_FIELDS if data.get(k) is not None}
        rate = data.get("max_error_rate")
        slo["max_error_rate"] = (1.0 if rate is None else rate) / 100
        return slo

    def clean(self):
        data = super().clean()
        space = self.space()
        if not space:
            self.add_error(None, "Give values to at least one flag of the space.")
            return data
        if not any(data.get(k) is not None for k in SLO_FIELDS) and not self.errors.keys() & set(
            SLO_FIELDS
        ):
            self.add_error(
                None, "Set at least one SLO limit (a latency or the per-user speed floor)."
            )
        try:
            parse_space(self.deployment.engine, self.deployment.engine_version or None, space)
        except SpaceError as exc:
            for flag, message in exc.errors.items():
                self.add_error(self._space_field(flag), message or str(exc))
        return data

    def _space_field(self, flag: str) -> str | None:
        if SPACE_PREFIX + flag in self.fields:
            return SPACE_PREFIX + flag
        if flag and flag == (self.cleaned_data.get("extra_flag") or "").strip().lstrip("-").replace(
            "-", "_"
        ):
            return "extra_values"
        return None

    def sweep_kwargs(self) -> dict:
        data = self.cleaned_data
        return {
            "title": data.get("title") or "",
            "profile": data["load_profile"],
            "space": self.space(),
            "slo": self.slo(),
            "load_mode": data["load_mode"],
            "objective": data["objective"],
            "max_trials": data["max_trials"],
            "max_minutes": data["max_minutes"],
            "max_steps": data["max_steps"],
            "twin_deployments": list(data.get("twins") or []),
        }

    def add_service_errors(self, exc) -> None:
        """A ``SweepInvalid``'s errors on the fields they name (the space's on its rows);
        the rest at the top."""
        for flag, message in (getattr(exc, "space_errors", None) or {}).items():
            self.add_error(self._space_field(flag), message)
        for key, message in exc.errors.items():
            if key == "space" and getattr(exc, "space_errors", None):
                continue  # shown on its rows just above
            if key == "slo":
                message = f"SLO: {message}"
            elif key == "space":
                message = f"Space: {message}"
            self.add_error(SERVICE_FIELDS.get(key), message)

    def error_summary(self) -> list[str]:
        return [
            f"{self.fields[name].label or name}: {error}"
            for name, errors in self.errors.items()
            if name != "__all__"
            for error in errors
        ]


class SweepCommentForm(forms.Form):
    comment = forms.CharField(required=False, max_length=2000, widget=forms.Textarea)
