"""Forms of the load profile pages: the profile editor (fields an ops engineer fills in, or a
JSON document), the traffic-sample upload and the import of an exported profile.

The form only checks types; what makes a load runnable is the load generator's own
validator (``benchmarks.loadgen.profile.validate``), whose messages are put back on the field
they name.
"""

from __future__ import annotations

import json
import re

from django import forms

from benchmarks.loadgen import traffic
from benchmarks.loadgen.profile import normalize, validate
from benchmarks.loadgen.spec import SpecError
from benchmarks.models import LoadProfile
from benchmarks.services.profiles import MAX_IMPORT_BYTES, unsign_sample
from controlpanel import userjson

ENDPOINTS = [
    ("/v1/completions", "Completions (/v1/completions, token-id prompts)"),
    ("/v1/chat/completions", "Chat (/v1/chat/completions, text prompts)"),
]
KINDS = [
    ("fixed", "fixed"),
    ("uniform", "uniform (low–high)"),
    ("normal", "normal (mean, stddev)"),
    ("lognormal", "lognormal (mean, sigma)"),
    ("empirical", "from a traffic sample"),
]
MODES = [("closed", "closed loop (concurrency)"), ("open", "open loop (request rate)")]
SLOS = [("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E latency")]
STAGE_NUMBERS = (
    "concurrency",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "num_requests",
    "duration_s",
)


def _num(value):
    """A float that is a whole number as an int, so documents read 600 rather than 600.0."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class StageForm(forms.Form):
    """One row of the stages table; a row left blank is ignored."""

    name = forms.CharField(max_length=40, required=False)
    mode = forms.ChoiceField(choices=MODES, initial="closed", required=False)
    concurrency = forms.IntegerField(required=False)
    request_rate = forms.FloatField(required=False, label="Rate (req/s)")
    burstiness = forms.FloatField(required=False, help_text="1 = Poisson, < 1 burstier")
    max_concurrency = forms.IntegerField(required=False, label="Max in flight")
    num_requests = forms.IntegerField(required=False, label="Requests")
    duration_s = forms.FloatField(required=False, label="Duration (s)")

    def is_blank(self) -> bool:
        data = getattr(self, "cleaned_data", {})
        return not data.get("name") and all(data.get(k) is None for k in STAGE_NUMBERS)

    def stage(self) -> dict:
        data = self.cleaned_data
        stage = {"name": data["name"]} if data.get("name") else {}
        if data["mode"] == "open":
            keys = ("request_rate", "burstiness", "max_concurrency")
        else:
            keys = ("concurrency",)
        for key in (*keys, "num_requests", "duration_s"):
            if data.get(key) is not None:
                stage[key] = _num(data[key])
        return stage

    def clean(self):
        data = super().clean()
        if data.get("mode") == "open" and data.get("request_rate") is None and not self.is_blank():
            self.add_error("request_rate", "An open-loop stage needs a request rate.")
        return data


class BaseStageFormSet(forms.BaseFormSet):
    """Every row is read as posted: Django would skip an extra row left equal to its
    initial values, and a stage shown unchanged must not vanish."""

    def _construct_form(self, i, **kwargs):
        kwargs["empty_permitted"] = False
        return super()._construct_form(i, **kwargs)


StageFormSet = forms.formset_factory(
    StageForm, formset=BaseStageFormSet, extra=3, max_num=20, absolute_max=20
)


class ProfileForm(forms.Form):
    """A load profile's document, field by field, or pasted as JSON (``document``)."""

    name = forms.CharField(max_length=100)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    note = forms.CharField(max_length=200, required=False, label="What changed")
    endpoint = forms.ChoiceField(choices=ENDPOINTS)
    input_kind = forms.ChoiceField(choices=KINDS, label="Input length")
    input_mean = forms.FloatField(required=False, label="Mean (tokens)")
    input_stddev = forms.FloatField(
        required=False, label="Stddev", help_text="normal: tokens; lognormal: sigma"
    )
    input_low = forms.IntegerField(required=False, label="Low")
    input_high = forms.IntegerField(required=False, label="High")
    output_kind = forms.ChoiceField(choices=KINDS, label="Output length")
    output_mean = forms.FloatField(required=False, label="Mean (tokens)")
    output_stddev = forms.FloatField(
        required=False, label="Stddev", help_text="normal: tokens; lognormal: sigma"
    )
    output_low = forms.IntegerField(required=False, label="Low")
    output_high = forms.IntegerField(required=False, label="High")
    prefix_len = forms.IntegerField(
        required=False,
        label="Shared prefix (tokens)",
        help_text="Added on top of the input length, as vLLM's --random-prefix-len.",
    )
    prefix_groups = forms.IntegerField(required=False, label="Distinct prefixes")
    prefix_share_pct = forms.FloatField(required=False, label="Requests sharing one (%)")
    prefix_within_input = forms.BooleanField(
        required=False,
        label="Input length includes the prefix",
        help_text="Ticked: the input length is the whole prompt and the prefix its first "
        "tokens, as a traffic sample counts a request (and as this panel did before).",
    )
    warmup_requests = forms.IntegerField(required=False, label="Warm-up requests")
    slo_ttft = forms.FloatField(required=False, label="TTFT SLO (ms)")
    slo_tpot = forms.FloatField(required=False, label="TPOT SLO (ms)")
    slo_itl = forms.FloatField(required=False, label="ITL SLO (ms)")
    slo_e2el = forms.FloatField(required=False, label="E2E latency SLO (ms)")
    seed = forms.IntegerField(required=False)
    max_error_rate_pct = forms.FloatField(
        required=False,
        label="Stop above error rate (%)",
        help_text="Blank: the panel's default. Above it the run stops early and fails.",
    )
    ignore_eos = forms.BooleanField(
        required=False, label="Ignore EOS (always generate the full output length)"
    )
    request_timeout_s = forms.FloatField(required=False, label="Request timeout (s)")
    time_scale = forms.FloatField(
        required=False, label="Replay time scale", help_text="0.5 replays twice as fast."
    )
    document_text = forms.CharField(
        required=False,
        label="JSON document",
        widget=forms.Textarea(attrs={"rows": 10, "spellcheck": "false"}),
        help_text="When filled in, this document is saved instead of the fields above.",
    )

    def __init__(self, data=None, *, base: LoadProfile | None = None, **kwargs):
        self.base = base
        self.base_spec = normalize(base.spec) if base is not None else None
        if base is not None and "initial" not in kwargs:
            kwargs["initial"] = {
                "name": base.name,
                "description": base.description,
                **initial_from_document(base.spec),
            }
        kwargs.setdefault("initial", initial_from_document({}))
        super().__init__(data, **kwargs)
        stages = kwargs["initial"].get("stages", [])
        self.stages = StageFormSet(data, prefix="stage", initial=stages)
        if base is not None:
            self.fields["name"].disabled = True
        if not (self.base_spec and self.base_spec["replay"]):
            del self.fields["time_scale"]
        self.document_json = None

    @property
    def is_replay(self) -> bool:
        return "time_scale" in self.fields

    def is_valid(self) -> bool:
        self.stages.is_valid()
        valid = super().is_valid()
        return valid and self.stages.is_valid()

    def clean_name(self):
        name = self.cleaned_data["name"].strip()
        if self.base is None and LoadProfile.objects.filter(name=name).exists():
            raise forms.ValidationError(
                "A profile of this name exists: edit it to make its next version."
            )
        return name

    def clean(self):
        data = super().clean()
        text = (data.get("document_text") or "").strip()
        if text:
            try:
                # NUL characters and deep nesting are refused here: PostgreSQL cannot store
                # the one, json.loads dies of the other (both were a 500).
                document = userjson.parse(text, what="The document")
            except userjson.UserJSONError as exc:
                self.add_error("document_text", str(exc))
                return data
            replay = document.get("replay") if isinstance(document, dict) else None
            kept = (self.base_spec or {}).get("replay")
            if isinstance(replay, dict) and isinstance(replay.get("rows"), str) and kept:
                # The editor shows a replay's rows elided; pasted back, they mean "keep them".
                document["replay"] = {**replay, "rows": kept["rows"]}
            try:
                self.document_json = validate(document)
            except SpecError as exc:
                self.add_error("document_text", str(exc))
            return data
        if self.errors or not self.stages.is_valid():
            return data
        try:
            document = self._document()
        except forms.ValidationError:
            return data
        try:
            self.document_json = validate(document)
        except SpecError as exc:
            self._place(str(exc))
        return data

    @property
    def document(self) -> dict:
        """The validated document (after ``is_valid``)."""
        return self.document_json

    # -- fields → document -------------------------------------------------------------------

    def _dist(self, prefix: str, key: str) -> dict:
        data = self.cleaned_data
        kind = data[f"{prefix}_kind"]
        dist = {"kind": kind}
        if kind == "empirical":
            values = (self.base_spec or {}).get(key, {}).get("values")
            if not values:
                self.add_error(
                    f"{prefix}_kind", "Only a profile made from a traffic sample has these."
                )
                raise forms.ValidationError("empirical")
            dist["values"] = values
        elif kind != "uniform":
            if data.get(f"{prefix}_mean") is None:
                self.add_error(f"{prefix}_mean", f"Give the mean of a {kind} length.")
                raise forms.ValidationError("mean")
            dist["mean"] = _num(data[f"{prefix}_mean"])
            if kind != "fixed" and data.get(f"{prefix}_stddev") is not None:
                dist["stddev"] = _num(data[f"{prefix}_stddev"])
        for bound in ("low", "high"):
            if data.get(f"{prefix}_{bound}") is not None:
                dist[bound] = data[f"{prefix}_{bound}"]
        return dist

    def _document(self) -> dict:
        data = self.cleaned_data
        inherited = self.base_spec or {}
        document = {
            "endpoint": data["endpoint"],
            "stages": [f.stage() for f in self.stages.forms if not f.is_blank()],
        }
        failed = False
        for prefix, key in (("input", "input_len"), ("output", "output_len")):
            try:
                document[key] = self._dist(prefix, key)
            except forms.ValidationError:
                failed = True
        if failed:
            raise forms.ValidationError("lengths")
        if not document["stages"] and not inherited.get("replay"):
            self.add_error(None, "Give at least one stage.")
            raise forms.ValidationError("stages")
        for key in ("prefix_len", "prefix_groups", "warmup_requests", "seed"):
            if data.get(key) is not None:
                document[key] = data[key]
        if data.get("prefix_share_pct") is not None:
            document["prefix_share"] = _num(round(data["prefix_share_pct"] / 100, 6))
        if data.get("prefix_within_input"):
            document["prefix_within_input"] = True
        document["slo"] = {
            k: _num(data[f"slo_{k}"]) for k, _ in SLOS if data.get(f"slo_{k}") is not None
        }
        rate = data.get("max_error_rate_pct")
        document["max_error_rate"] = None if rate is None else _num(round(rate / 100, 6))
        document["ignore_eos"] = bool(data.get("ignore_eos"))
        if data.get("request_timeout_s") is not None:
            document["request_timeout_s"] = _num(data["request_timeout_s"])
        if "workers" in inherited:
            document["workers"] = inherited["workers"]
        if inherited.get("replay"):
            scale = data.get("time_scale")
            replay = dict(inherited["replay"])
            if scale is not None:
                replay["time_scale"] = _num(scale)
            document["replay"] = replay
            document["stages"] = document["stages"] or inherited["stages"]
        return document

    # -- validator messages → fields ---------------------------------------------------------

    def _place(self, message: str) -> None:
        """Put the validator's message on the field (or stage row) it names."""
        stage_forms = [f for f in self.stages.forms if not f.is_blank()]
        match = re.match(r"stages\[(\d+)\]|stage '([^']*)'", message)
        if match:
            target = None
            if match.group(1) and int(match.group(1)) <= len(stage_forms):
                target = stage_forms[int(match.group(1)) - 1]
            elif match.group(2) is not None:
                named = [f for f in stage_forms if f.stage().get("name") == match.group(2)]
                numbered = re.fullmatch(r"stage-(\d+)", match.group(2))
                if named:
                    target = named[0]
                elif numbered and int(numbered.group(1)) <= len(stage_forms):
                    target = stage_forms[int(numbered.group(1)) - 1]
            if target is not None:
                problem = message.split(": ", 1)[-1]
                field = next((k for k in _STAGE_ORDER if k in problem), None)
                target.add_error(field, message)
                self.add_error(None, f"Check the stages: {message}")
                return
        field = None
        head = message.split(":", 1)[0]
        if head in ("input_len", "output_len"):
            prefix = head.split("_")[0]
            if "uniform" in message or "low" in message:
                field = f"{prefix}_low"
            elif "stddev" in message:
                field = f"{prefix}_stddev"
            elif "mean" in message:
                field = f"{prefix}_mean"
            else:
                field = f"{prefix}_kind"
        elif head == "prefix":
            field = "prefix_len"
        elif head == "goodput":
            slo = next((k for k, _ in SLOS if f" {k} " in f" {message} "), None)
            field = f"slo_{slo}" if slo else None
        elif head in ("warmup_requests", "seed", "endpoint", "request_timeout_s"):
            field = head
        elif head == "max_error_rate":
            field = "max_error_rate_pct"
        elif head.startswith(("trace", "replay")) and self.is_replay:
            field = "time_scale"
        self.add_error(field if field in self.fields else None, message)


# Longest first: "max_concurrency" must win over "concurrency".
_STAGE_ORDER = (
    "max_concurrency",
    "concurrency",
    "request_rate",
    "burstiness",
    "num_requests",
    "duration_s",
)


def initial_from_document(spec: dict) -> dict:
    """The editor's initial values for a document (defaults filled in)."""
    p = normalize(spec)
    initial = {
        "endpoint": p["endpoint"],
        "stages": [
            {
                "name": s.get("name"),
                "mode": "open" if s.get("request_rate") else "closed",
                **{k: s.get(k) for k in STAGE_NUMBERS},
            }
            for s in p["stages"]
        ],
        "prefix_len": p["prefix_len"],
        "prefix_groups": p["prefix_groups"],
        "prefix_share_pct": _num(round(float(p["prefix_share"]) * 100, 4)),
        "prefix_within_input": p["prefix_within_input"],
        "warmup_requests": p["warmup_requests"],
        "seed": p["seed"],
        "max_error_rate_pct": None
        if p["max_error_rate"] is None
        else _num(round(float(p["max_error_rate"]) * 100, 4)),
        "ignore_eos": p["ignore_eos"],
        "request_timeout_s": p["request_timeout_s"],
    }
    for prefix, key in (("input", "input_len"), ("output", "output_len")):
        dist = p[key]
        initial[f"{prefix}_kind"] = dist.get("kind", "fixed")
        for field in ("mean", "stddev", "low", "high"):
            initial[f"{prefix}_{field}"] = dist.get(field)
    for key, _ in SLOS:
        initial[f"slo_{key}"] = p["slo"].get(key)
    if p["replay"]:
        initial["time_scale"] = p["replay"].get("time_scale", 1.0)
    return initial


def document_json(spec: dict) -> str:
    """The document as the advanced editor shows it; a replay's rows are elided (they are
    kept when the fields are used)."""
    p = normalize(spec)
    if p["replay"]:
        p = {**p, "replay": {**p["replay"], "rows": f"<{len(p['replay']['rows'])} rows>"}}
    return json.dumps(p, indent=2, ensure_ascii=False)


# -- traffic samples and imports ------------------------------------------------------------


class TrafficForm(forms.Form):
    """Both steps of "profile from traffic": the upload (``file``) that shows a preview, and
    the save, which carries the parsed sample back signed (``sample``) or takes the file
    again."""

    file = forms.FileField(
        required=False,
        label="Traffic sample",
        help_text="JSONL or CSV: input_tokens, output_tokens, and optionally timestamp "
        "(seconds or ISO-8601) and prefix_id. At most 100,000 rows / 20 MB.",
    )
    sample = forms.CharField(required=False, widget=forms.HiddenInput)
    mode = forms.ChoiceField(
        choices=[
            ("fit", "Fit distributions (lengths, rate and burstiness)"),
            ("replay", "Replay the requests at their own times"),
        ],
        initial="fit",
        required=False,
        widget=forms.RadioSelect,
    )
    name = forms.CharField(
        max_length=100, required=False, help_text="An existing name gets its next version."
    )
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    note = forms.CharField(max_length=200, required=False, label="What changed")
    num_requests = forms.IntegerField(
        required=False, min_value=1, help_text="Fit: blank = as many as the sample."
    )
    duration_s = forms.FloatField(required=False, label="Duration (s)", help_text="Fit only.")
    concurrency = forms.IntegerField(
        required=False, min_value=1, help_text="Fit of a sample without timestamps."
    )
    max_concurrency = forms.IntegerField(required=False, min_value=1, label="Max in flight")
    time_scale = forms.FloatField(
        required=False, initial=1.0, help_text="Replay: 0.5 replays twice as fast."
    )
    prefix_len = forms.IntegerField(
        required=False,
        min_value=0,
        label="Shared prefix (tokens)",
        help_text="Length of the prompt part that requests of one prefix_id share (counted "
        "within each request's input tokens, as the sample counts them).",
    )
    warmup_requests = forms.IntegerField(required=False, min_value=0)

    OPTIONS = (
        "num_requests",
        "duration_s",
        "concurrency",
        "max_concurrency",
        "time_scale",
        "prefix_len",
        "warmup_requests",
    )

    def __init__(self, *args, saving: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.saving = saving
        self.rows = None

    def clean(self):
        data = super().clean()
        upload = data.get("file")
        try:
            if upload:
                if upload.size > traffic.MAX_BYTES:
                    raise SpecError(f"sample: larger than {traffic.MAX_BYTES // 2**20} MB")
                self.rows = traffic.parse(upload.read(), filename=upload.name)
                # Prefix ids are kept as text in the profile (jsonb): no NUL characters.
                userjson.check_value(
                    [row.prefix_id for row in self.rows if row.prefix_id], what="The sample"
                )
            elif data.get("sample"):
                self.rows = unsign_sample(data["sample"])
            else:
                self.add_error("file", "Choose a JSONL or CSV file.")
        except (SpecError, userjson.UserJSONError) as exc:
            self.rows = None
            self.add_error("file", str(exc))
        except RecursionError:  # a JSONL line nested thousands deep
            self.rows = None
            self.add_error("file", "The sample is nested too deeply to be a traffic sample.")
        if self.saving and not (data.get("name") or "").strip():
            self.add_error("name", "Give the profile a name.")
        return data

    def clean_mode(self):
        return self.cleaned_data.get("mode") or "fit"

    @property
    def options(self) -> dict:
        return {k: self.cleaned_data.get(k) for k in self.OPTIONS}


class ImportForm(forms.Form):
    file = forms.FileField(
        label="Exported profile (JSON)",
        help_text='A file exported by a panel: {"format": "llm-control-panel/load-profile", …}',
    )
    note = forms.CharField(max_length=200, required=False, label="What changed")

    def clean_file(self):
        # Refused by its size before anything reads it into memory.
        upload = self.cleaned_data["file"]
        if upload.size > MAX_IMPORT_BYTES:
            raise forms.ValidationError(
                f"The file is {upload.size / 2**20:.0f} MB; an exported profile is at most "
                f"{MAX_IMPORT_BYTES // 2**20} MB."
            )
        return upload
