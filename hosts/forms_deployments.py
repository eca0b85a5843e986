"""The "New deployment" form: what an operator types to start an engine on a host. The form
reads the fields; every rule about them is the service's (hosts.services.deployments), whose
refusals come back onto the fields they name."""

from __future__ import annotations

from django import forms

from hosts.choices import EngineKind, LaunchStyle
from hosts.engines.flags import EngineArgError, engine_version
from hosts.models import ENGINE_NAME, Host
from hosts.services import deployments as service

# The service's field names that the form names otherwise.
FORM_FIELD = {"settings": "flags"}


class GpuCheckboxes(forms.CheckboxSelectMultiple):
    """One box per GPU of the host; a GPU another engine holds is shown but cannot be ticked."""

    def __init__(self, *args, used: dict[int, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.used = used or {}

    def create_option(self, name, value, label, selected, index, subindex=None, attrs=None):
        option = super().create_option(name, value, label, selected, index, subindex, attrs)
        if int(value) in self.used:
            option["attrs"]["disabled"] = True
        return option


class DeploymentForm(forms.Form):
    name = forms.RegexField(
        ENGINE_NAME,
        label="Name",
        max_length=63,
        error_messages={"invalid": "Lower-case letters, digits and '-' (a unit/container name)."},
        help_text="Also the engine's unit or container name on the host.",
    )
    engine = forms.ChoiceField(label="Engine", choices=EngineKind.choices)
    engine_version = forms.CharField(
        label="Engine version",
        max_length=40,
        help_text="The release installed on the host, e.g. 0.11.0 (vLLM) or 0.5.3 (SGLang): "
        "it sets which flags exist.",
    )
    model = forms.CharField(
        label="Model",
        max_length=200,
        widget=forms.TextInput(attrs={"list": "catalogue-models", "autocomplete": "off"}),
        help_text="A catalogue model (its size is known, so the fit is checked), a Hugging Face "
        "repo id such as meta-llama/Llama-3.1-8B-Instruct, or an absolute path on the host.",
    )
    gpus = forms.TypedMultipleChoiceField(label="GPUs", coerce=int, required=False)
    port = forms.IntegerField(label="Port", min_value=1, max_value=65535)
    launch_style = forms.ChoiceField(
        label="Launch style", choices=LaunchStyle.choices, initial=LaunchStyle.PROCESS
    )
    flags = forms.CharField(
        label="Engine flags",
        required=False,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        help_text="Optional: one --flag value per line, as on the engine's command line (e.g. "
        "--max-num-seqs 256). Several GPUs set the tensor-parallel size unless given here.",
    )

    def __init__(self, host: Host, *args, **kwargs):
        # Labels read exactly "Engine", "Engine version", … (no colon) for people and tests.
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)
        self.host = host
        self.settings: dict = {}
        used = service.gpu_users(host)
        choices = []
        for gpu in host.gpus.order_by("index"):
            label = f"GPU {gpu.index} · {gpu.name} · {gpu.memory_bytes / 2**30:.0f} GiB"
            if gpu.index in used:
                label += f" · used by {used[gpu.index]}"
            choices.append((gpu.index, label))
        self.fields["gpus"].choices = choices
        self.fields["gpus"].widget = GpuCheckboxes(used=used, choices=choices)
        self.fields["port"].initial = service.free_port(host)
        self.models = service.catalogue_models()

    def clean(self):
        data = super().clean()
        engine, version = data.get("engine"), data.get("engine_version")
        if engine and data.get("flags") is not None:
            try:
                engine_version(version)
            except EngineArgError:
                version = None  # the version's own error is the service's to give
            try:
                self.settings = service.settings_from_flags(engine, version, data["flags"])
            except EngineArgError as exc:
                self.add_error("flags", str(exc))
        return data

    def deployment_data(self) -> dict:
        """What the service takes."""
        data = self.cleaned_data
        keys = ("name", "engine", "engine_version", "model", "gpus", "port", "launch_style")
        return {**{k: data.get(k) for k in keys}, "settings": self.settings}

    def fit(self) -> service.Fit | None:
        """The fit of what the form holds now (None until engine, model and GPUs are read)."""
        data = getattr(self, "cleaned_data", {})
        if not data.get("engine") or not data.get("model"):
            return None
        chosen = set(data.get("gpus") or [])
        gpus = [g for g in self.host.gpus.order_by("index") if g.index in chosen]
        return service.fit_check(data["engine"], data["model"], gpus, self.settings)

    def add_refusal(self, refused: service.DeploymentRefused) -> None:
        """The service's reasons, each on the field it names."""
        for name, messages in refused.errors.items():
            field = FORM_FIELD.get(name, name)
            for message in messages:
                self.add_error(field if field in self.fields else None, message)
