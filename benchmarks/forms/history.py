"""The history's filters and sort, and the form that imports a result file."""

from __future__ import annotations

from django import forms
from django.contrib.auth import get_user_model

from benchmarks.choices import RunSource
from benchmarks.models import LoadProfile
from benchmarks.services.history import DEFAULT_SORT, PAGE_SIZES, SORTS
from controlpanel.choices import OperationStatus
from controlpanel.widgets import ColumnChoiceField, QuickSelect
from hosts.choices import EngineKind
from hosts.models import Deployment, EngineConfig, Gpu, Host

ANY = [("", "any")]
# A detailed 100k-request vllm bench file with texts. The file is saved to disk and read as a
# stream by a background task, so this bounds disk use and time, not memory.
MAX_UPLOAD_BYTES = 256 * 2**20


def sort_choices() -> list[tuple[str, str]]:
    # The default (newest first) leads, so an unfiltered page shows what it is sorted by.
    out = [("-date", "Date ↓ (newest first)"), ("date", "Date ↑")]
    for key, (_, label) in SORTS.items():
        if key != "date":
            out += [(key, f"{label} ↑"), (f"-{key}", f"{label} ↓")]
    return out


class HistoryForm(forms.Form):
    """Filters of the history list (all optional), its sort and page size. Choices come
    from what the runs hold, so every option finds something."""

    q = forms.CharField(required=False, max_length=100, label="Label contains")
    host = ColumnChoiceField(
        Host.objects.order_by("name"),
        label_column="name",
        required=False,
        empty_label="any",
        widget=QuickSelect,  # one option per host: a 500-host fleet
    )
    # Free text with suggestions from the fleet (small tables), not a DISTINCT over every
    # run: that scan was a third of the page's database time at 10,000 runs.
    gpu = forms.CharField(
        required=False,
        max_length=100,
        label="GPU model",
        widget=forms.TextInput(attrs={"list": "gpu-models", "autocomplete": "off"}),
    )
    engine = forms.ChoiceField(
        choices=ANY + list(EngineKind.choices), required=False, widget=QuickSelect
    )
    model = forms.CharField(
        required=False,
        max_length=200,
        widget=forms.TextInput(attrs={"list": "model-names", "autocomplete": "off"}),
    )
    config = forms.IntegerField(required=False, min_value=1, label="Config version")
    profile = forms.ChoiceField(required=False, label="Load profile", widget=QuickSelect)
    status = forms.ChoiceField(
        choices=ANY + list(OperationStatus.choices), required=False, widget=QuickSelect
    )
    requested_by = ColumnChoiceField(
        get_user_model().objects.none(),
        label_column=get_user_model().USERNAME_FIELD,
        required=False,
        empty_label="anyone",
        label="Run by",
        widget=QuickSelect,
    )
    source = forms.ChoiceField(
        choices=ANY + list(RunSource.choices), required=False, widget=QuickSelect
    )
    date_from = forms.DateField(
        required=False, label="From", widget=forms.DateInput(attrs={"type": "date"})
    )
    date_to = forms.DateField(
        required=False, label="To", widget=forms.DateInput(attrs={"type": "date"})
    )
    sort = forms.ChoiceField(required=False, choices=sort_choices, widget=QuickSelect)
    per_page = forms.TypedChoiceField(
        required=False,
        coerce=int,
        empty_value=PAGE_SIZES[0],
        choices=[(n, n) for n in PAGE_SIZES],
        label="Per page",
        widget=QuickSelect,
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        names = LoadProfile.objects.order_by("name").values_list("name", flat=True).distinct()
        self.fields["profile"].choices = ANY + [(n, n) for n in names]
        users = get_user_model()
        self.fields["requested_by"].queryset = users.objects.order_by(users.USERNAME_FIELD)

    def suggestions(self) -> dict[str, list[str]]:
        """What the GPU model and model boxes offer: what the fleet has now."""
        return {
            "gpu-models": list(
                Gpu.objects.order_by("name").values_list("name", flat=True).distinct()
            ),
            "model-names": list(
                Deployment.objects.order_by("model").values_list("model", flat=True).distinct()
            ),
        }

    def clean_sort(self) -> str:
        return self.cleaned_data.get("sort") or DEFAULT_SORT

    def clean_date_to(self):
        start, end = self.cleaned_data.get("date_from"), self.cleaned_data.get("date_to")
        if start and end and end < start:
            raise forms.ValidationError("The end date is before the start date.")
        return end


class ConfigChoice(forms.ModelChoiceField):
    def label_from_instance(self, obj: EngineConfig) -> str:
        return f"{obj.deployment} v{obj.version}" + (f" — {obj.note}" if obj.note else "")


class RunImportForm(forms.Form):
    """A result file and the deployment (and, if known, the config version) it measured."""

    file = forms.FileField(
        help_text="JSON from python -m benchmarks.loadgen --save-result (or a run exported "
        "from a panel), from vllm bench serve --save-result (add --save-detailed for "
        "latency distributions and the request log), GuideLLM's benchmarks.json "
        "(guidellm run --output kind=json), or AIPerf's profile_export_aiperf.json (the "
        "summary) or profile_export.jsonl (every request: distributions and the request log)."
    )
    deployment = forms.ModelChoiceField(
        Deployment.objects.select_related("host").order_by("host__name", "name"),
        help_text="The engine the file measured.",
    )
    engine_config = ConfigChoice(
        EngineConfig.objects.select_related("deployment__host").order_by(
            "deployment__host__name", "deployment__name", "-version"
        ),
        required=False,
        label="Config version",
        help_text="The settings it ran with, if you know them (empty: not recorded).",
    )
    label = forms.CharField(max_length=100, required=False)
    benchmark = forms.IntegerField(
        min_value=1,
        max_value=1000,
        required=False,
        label="GuideLLM benchmark",
        help_text="A GuideLLM file holds one benchmark per rate of a sweep: which one to "
        "import (1 = the first, the default). The run's notes list the others.",
    )

    def clean_file(self):
        """The upload itself: it is read later, as a stream, by a background task. Only
        what can be told from its size and first bytes is checked here."""
        upload = self.cleaned_data["file"]
        if upload.size > MAX_UPLOAD_BYTES:
            raise forms.ValidationError(
                f"The file is {upload.size / 2**20:.0f} MiB; at most "
                f"{MAX_UPLOAD_BYTES // 2**20} MiB is read."
            )
        upload.seek(0)
        start = upload.read(1024).removeprefix(b"\xef\xbb\xbf").lstrip()
        upload.seek(0)
        if start.startswith(b"["):
            raise forms.ValidationError(
                "The file holds a list, not one result: import one run at a time "
                "(vllm bench serve --append-result files hold several)."
            )
        if not start.startswith(b"{"):
            raise forms.ValidationError("The file is not a JSON result: it should start with “{”.")
        return upload

    def clean(self):
        data = super().clean()
        deployment, config = data.get("deployment"), data.get("engine_config")
        if deployment and config and config.deployment_id != deployment.pk:
            self.add_error(
                "engine_config", f"v{config.version} is a config of {config.deployment}."
            )
        return data
