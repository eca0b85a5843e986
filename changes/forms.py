"""Forms of the changes pages: the list's filters, the proposal (generated from the engine's
flag spec for the deployment's version), the review comment and the rollback rationale."""

from __future__ import annotations

from django import forms
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

from benchmarks.models import BenchmarkRun, LoadProfile
from changes import forms_launch
from changes.choices import ChangeState
from changes.models import Finding
from changes.services import facts
from controlpanel.choices import OperationStatus
from hosts.engines import get_spec
from hosts.engines.flags import EngineArgError, Flag
from hosts.engines.launch import RESERVED_SETTINGS, LaunchError
from hosts.models import Deployment, Host

ANY = [("", "any")]
# The fields beside the flags that decide how the engine starts (a preview needs them right).
LAUNCH_FIELDS = ("verify_profile", "env", "numa_node", "cpus")
FLAG_PREFIX = "flag_"
REMOVE_PREFIX = "remove_"  # the box that unsets a secret flag (its field shows no value)
DATETIME_LOCAL = forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")


class DeploymentChoice(forms.ModelChoiceField):
    def label_from_instance(self, obj: Deployment) -> str:
        return f"{obj.host.name}/{obj.name}"


class RunChoice(forms.ModelChoiceField):
    def label_from_instance(self, obj: BenchmarkRun) -> str:
        profile = f" · {obj.load_profile}" if obj.load_profile_id else ""
        return f"#{obj.pk} {obj.label or ''}{profile} · {obj.created_at:%Y-%m-%d %H:%M}"


class ChangeFilterForm(forms.Form):
    """The list's filters, all optional."""

    state = forms.ChoiceField(choices=ANY + list(ChangeState.choices), required=False)
    host = forms.ModelChoiceField(
        Host.objects.only("id", "name").order_by("name"), required=False, empty_label="any"
    )
    deployment = DeploymentChoice(
        Deployment.objects.select_related("host").only("id", "name", "host__name"),
        required=False,
        empty_label="any",
    )
    proposer = forms.ModelChoiceField(
        get_user_model().objects.none(), required=False, empty_label="anyone", label="Proposed by"
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["deployment"].queryset = self.fields["deployment"].queryset.order_by(
            "host__name", "name"
        )
        self.fields["proposer"].queryset = (
            get_user_model().objects.only("id", "username").order_by("username")
        )

    def filter(self, changes):
        data = self.cleaned_data
        if data.get("state"):
            changes = changes.filter(state=data["state"])
        if data.get("host"):
            changes = changes.filter(deployment__host=data["host"])
        if data.get("deployment"):
            changes = changes.filter(deployment=data["deployment"])
        if data.get("proposer"):
            changes = changes.filter(proposed_by=data["proposer"])
        return changes


def _shown(value) -> str:
    if value is None:
        return "chosen by the engine"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _exclusive_minimum(flag: Flag):
    def check(value):
        if value is not None and value <= flag.minimum:
            raise ValidationError(f"Must be greater than {flag.minimum:g}.")

    return check


def flag_field(flag: Flag) -> forms.Field:
    """The form field for one engine flag: its type, range and choices from the spec."""
    common = {
        "required": False,
        "label": flag.option,
        "help_text": f"{flag.help} Default: {_shown(flag.default)}.".strip(),
    }
    if flag.type == "bool":
        return forms.ChoiceField(
            choices=[("", "unset"), ("true", "true"), ("false", "false")], **common
        )
    if flag.choices is not None:
        coerce = {"int": int, "float": float}.get(flag.type, str)
        return forms.TypedChoiceField(
            choices=[("", "unset")] + [(str(c), str(c)) for c in flag.choices],
            coerce=coerce,
            empty_value=None,
            **common,
        )
    if flag.type in ("int", "float"):
        bounds = {}
        if flag.minimum is not None and not flag.exclusive_minimum:
            bounds["min_value"] = flag.minimum
        if flag.maximum is not None:
            bounds["max_value"] = flag.maximum
        if flag.type == "int":
            bounds = {k: int(v) for k, v in bounds.items()}
            field = forms.IntegerField(**bounds, **common)
        else:
            field = forms.FloatField(**bounds, **common)
            field.widget.attrs["step"] = "any"
        if flag.minimum is not None and flag.exclusive_minimum:
            field.validators.append(_exclusive_minimum(flag))
            field.widget.attrs["min"] = flag.minimum
        return field
    if flag.nargs:
        common["help_text"] += " Several values: separate them with spaces."
    if flag.secret:
        # A credential is never sent back to a browser: the field starts empty, and empty
        # keeps the running value (the "remove" box beside it unsets it).
        common["help_text"] = f"{flag.help} A secret: never shown. Empty keeps the running value."
        return forms.CharField(
            max_length=500,
            strip=True,
            widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
            **common,
        )
    return forms.CharField(max_length=500, strip=True, **common)


def _initial(flag: Flag, value):
    if value is None:
        return None
    if flag.type == "bool":
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return " ".join(map(str, value))
    return value


class ProposeForm(forms.Form):
    """A proposed change of one deployment: one field per flag of its engine version (the
    running config's values filled in; an empty field leaves the flag unset), the reason, the
    verification benchmark and its limits, and the maintenance window."""

    title = forms.CharField(max_length=120)
    model = forms.CharField(
        required=False,
        max_length=200,
        label="Model",
        help_text="Another model to serve, e.g. its AWQ or FP8 variant (a quality probe then "
        "verifies the answers); unchanged keeps the model.",
    )
    rationale = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Why: what was measured, what you expect to improve.",
    )
    verify_profile = forms.ModelChoiceField(
        LoadProfile.objects.none(),
        required=False,
        label="Verify with load profile",
        empty_label="none: no verification benchmark",
        help_text="Benchmarked before and after the apply; a regression rolls the change back.",
    )
    baseline_run = RunChoice(
        BenchmarkRun.objects.none(),
        required=False,
        label="Baseline run",
        empty_label="measure a fresh baseline when applying",
        help_text="A successful run of this deployment on its running config.",
    )
    max_error_rate_increase = forms.FloatField(
        min_value=0,
        max_value=100,
        initial=1,
        label="Max error-rate increase (percentage points)",
    )
    max_ttft_p95_regression = forms.FloatField(
        min_value=0, initial=20, label="Max TTFT p95 regression (%)"
    )
    max_itl_p95_regression = forms.FloatField(
        min_value=0, initial=20, label="Max ITL p95 regression (%)"
    )
    max_quality_loss = forms.FloatField(
        required=False,  # empty: the default, 1 point
        min_value=0,
        max_value=100,
        initial=1,
        label="Max accuracy loss (points)",
        help_text="When a quality probe runs: roll back on a significant loss beyond this.",
    )
    max_extra_runs = forms.IntegerField(
        required=False,  # empty: the default, 2
        min_value=0,
        max_value=5,
        initial=2,
        label="Noise budget (extra verification runs)",
        help_text="When the run-to-run noise is too wide to judge a latency against its limit, "
        "measure up to this many extra verification runs; still too wide, the change ends "
        "applied, not verified, for you to decide.",
    )
    # "Propose this change": the advisor finding the proposal answers (one of this deployment).
    finding = forms.ModelChoiceField(
        queryset=None, required=False, widget=forms.HiddenInput, label="Advisor finding"
    )
    window_start = forms.DateTimeField(
        required=False, label="Maintenance window from", widget=DATETIME_LOCAL
    )
    window_end = forms.DateTimeField(required=False, label="until", widget=DATETIME_LOCAL)

    def __init__(self, deployment: Deployment, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.deployment = deployment
        self.fields["finding"].queryset = Finding.objects.filter(deployment=deployment)
        running = deployment.active_config
        self.running = dict(running.settings) if running else {}
        self.running_env = dict(running.env) if running else {}
        self.running_placement = dict(running.placement or {}) if running else {}
        # Environment and placement, like the flags, start at the running values.
        self.fields["env"] = forms_launch.env_field(self.running_env)
        self.fields["env"].initial = forms_launch.env_text(self.running_env)
        self.fields.update(forms_launch.placement_fields(deployment.host, self.running_placement))
        self.env_problems: dict[str, str] = {}  # by variable name, for the API's error keys
        self.version_problem = ""
        try:
            flags = facts.spec_flags(deployment)
        except EngineArgError as exc:
            # An unreadable engine version: show the newest release's flags and say why (the
            # service refuses the proposal with the same words).
            self.version_problem = str(exc)
            flags = get_spec(deployment.engine).flags_for(None)
        self.flags = {flag.dest: flag for flag in flags if flag.dest not in RESERVED_SETTINGS}
        for dest, flag in self.flags.items():
            name = FLAG_PREFIX + dest
            self.fields[name] = flag_field(flag)
            self.fields[name].flag = flag
            if not flag.secret:
                self.fields[name].initial = _initial(flag, self.running.get(dest))
                continue
            if self.running.get(dest) is not None:
                self.fields[name].widget.attrs["placeholder"] = "••• (set: empty keeps it)"
            self.fields[REMOVE_PREFIX + dest] = forms.BooleanField(
                required=False, label=f"Remove {flag.option}"
            )
        self.fields["model"].initial = deployment.model
        self.fields["verify_profile"].queryset = LoadProfile.objects.latest().order_by("name")
        self.fields["baseline_run"].queryset = (
            BenchmarkRun.objects.filter(
                deployment=deployment,
                status=OperationStatus.SUCCEEDED,
                engine_config=running,
            )
            .select_related("load_profile")
            .order_by("-created_at")
            if running
            else BenchmarkRun.objects.none()
        )

    def prefill(self, *, title: str, rationale: str, settings: dict) -> list[str]:
        """Start from a suggested change (the advisor's "Propose this change"): its flag values
        over the running config's, its title and rationale. Returns the suggested flags this
        engine version has no field for: left out, for the page to say so."""
        self.initial.update(title=title[: self.fields["title"].max_length], rationale=rationale)
        missing = []
        for dest, value in settings.items():
            flag = self.flags.get(dest)
            if flag is None or flag.secret:
                missing.append(dest)
                continue
            self.initial[FLAG_PREFIX + dest] = _initial(flag, value)
        return missing

    # --- the flag fields, as the template shows them ---------------------------------------
    def performance_fields(self):
        return [self[FLAG_PREFIX + d] for d, f in self.flags.items() if f.performance]

    def other_fields(self):
        fields = []
        for dest, flag in self.flags.items():
            if flag.performance:
                continue
            fields.append(self[FLAG_PREFIX + dest])
            if flag.secret:
                fields.append(self[REMOVE_PREFIX + dest])
        return fields

    def flag_errors(self) -> list[str]:
        """Errors of the flag, environment and placement fields and the profile (what a
        preview needs), named by flag."""
        out = []
        for name, errors in self.errors.items():
            if name.startswith(FLAG_PREFIX) or name in LAUNCH_FIELDS:
                label = self.fields[name].label
                out += [f"{label}: {error}" for error in errors]
        return out

    def error_summary(self) -> list[str]:
        """Every field error, named by its label (the flag's option), for the page's top."""
        return [
            f"{self.fields[name].label}: {error}"
            for name, errors in self.errors.items()
            if name != "__all__"
            for error in errors
        ]

    # --- environment and placement --------------------------------------------------------------
    # A field left out of the post (a script, an older page) keeps the running value, as the
    # page's prefilled fields do; an empty one clears it.
    def _left_out(self, name: str) -> bool:
        return self.add_prefix(name) not in self.data

    def clean_numa_node(self):
        if self._left_out("numa_node"):
            return self.running_placement.get("numa_node")
        return self.cleaned_data.get("numa_node")

    def clean_cpus(self):
        if self._left_out("cpus"):
            return self.running_placement.get("cpus")
        return self.cleaned_data.get("cpus")

    def clean_env(self) -> dict:
        if self._left_out("env"):
            return dict(self.running_env)
        env, problems = forms_launch.parse_env(self.cleaned_data.get("env"), self.running_env)
        if problems:
            self.env_problems.update(problems)
            raise ValidationError([f"{name}: {problem}" for name, problem in problems.items()])
        return env

    def clean(self):
        data = super().clean()
        if "env" not in data or "numa_node" not in data or "cpus" not in data:
            return data
        env, placement = self.carried()
        # The launch rules the apply runs (Deployment.launch_config().validated()): the env
        # policy's and Placement.problems()'s own words, by field. Flag errors are the flag
        # fields' and the service's to report.
        try:
            self.deployment.launch_config(
                self.settings(), env, placement, self.model_choice() or None
            ).validated(gpu_count=facts.gpu_count(self.deployment))
        except LaunchError as exc:
            errors = {k: v for k, v in exc.errors.items() if k.startswith(("env", "placement"))}
        else:
            errors = {}
        for key, problem in forms_launch.host_placement_problems(
            self.deployment.host, placement, self.running_placement
        ).items():
            errors.setdefault(key, problem)  # the launch rules speak first on a bad CPU list
        self.env_problems.update(
            {k.removeprefix("env."): v for k, v in errors.items() if k.startswith("env.")}
        )
        for field, messages in forms_launch.field_errors(errors).items():
            for message in messages:
                self.add_error(field, message)
        return data

    # --- what the service gets ---------------------------------------------------------------
    def settings(self) -> dict:
        """The flags given a value; empty ones are left out (unset)."""
        out = {}
        for dest, flag in self.flags.items():
            value = self.cleaned_data.get(FLAG_PREFIX + dest)
            if flag.secret and value in (None, ""):
                # Not shown, so not retyped: empty keeps the running secret unless removed.
                if not self.cleaned_data.get(REMOVE_PREFIX + dest):
                    value = self.running.get(dest)
            if value in (None, ""):
                continue
            if flag.type == "bool":
                value = value == "true"
            elif flag.nargs:
                parts = value.split()
                running = self.running.get(dest)
                value = parts if len(parts) > 1 or isinstance(running, list) else parts[0]
            out[dest] = value
        return out

    def model_choice(self) -> str:
        """The model the form proposes: empty when it is the one served now."""
        model = (self.cleaned_data.get("model") or "").strip()
        return "" if model == self.deployment.model else model

    def carried(self) -> tuple[dict, dict]:
        """The environment and CPU placement the form proposes (the running ones where the
        form holds none yet): stored secrets kept, an empty placement as ``{}``."""
        data = getattr(self, "cleaned_data", {})
        env = data.get("env")
        env = dict(self.running_env) if env is None else env
        if "numa_node" not in data and "cpus" not in data:
            return env, dict(self.running_placement)
        node, cpus = data.get("numa_node"), data.get("cpus") or None
        placement = {"numa_node": node, "cpus": cpus} if node is not None or cpus else {}
        return env, placement

    def proposal(self) -> dict:
        data = self.cleaned_data
        env, placement = self.carried()
        return {
            "title": data["title"],
            "rationale": data["rationale"],
            "settings": self.settings(),
            "env": env,
            "placement": placement,
            "model": self.model_choice(),
            "verify_profile": data.get("verify_profile"),
            "baseline_run": data.get("baseline_run"),
            "thresholds": {
                "max_error_rate_increase": data["max_error_rate_increase"] / 100,
                "max_ttft_p95_regression": data["max_ttft_p95_regression"] / 100,
                "max_itl_p95_regression": data["max_itl_p95_regression"] / 100,
                "max_quality_loss": (
                    1.0 if data.get("max_quality_loss") is None else data["max_quality_loss"]
                )
                / 100,
                "max_extra_runs": (
                    self.fields["max_extra_runs"].initial
                    if data.get("max_extra_runs") is None
                    else data["max_extra_runs"]
                ),
            },
            "window": (data.get("window_start"), data.get("window_end")),
            "finding": data.get("finding"),
        }


class CommentForm(forms.Form):
    """The text of a comment, an approval, a rejection or a rollback request."""

    comment = forms.CharField(required=False, max_length=5000, strip=True)


class RollbackForm(forms.Form):
    rationale = forms.CharField(
        max_length=5000,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Why go back to this version.",
    )
