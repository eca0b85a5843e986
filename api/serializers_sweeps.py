"""Shapes of the tuning sweeps API: a sweep in the list and on its own (its prediction summed
up, its lanes and trials with their evidence), and the bodies of a new sweep and of each action.

The stored JSON (``space``, ``slo``, ``target``, a trial's ``predicted`` and ``probes``) is
``benchmarks.sweep``'s own dicts; these serializers pick the parts a script acts on and name
them, so that the schema documents them and a script does not depend on the worker's layout."""

from __future__ import annotations

from django.urls import NoReverseMatch, reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.base import StrictSerializerMixin
from api.serializers_changes import (
    ChangeConfigRefSerializer,
    ChangeDeploymentRefSerializer,
    ChangeProfileRefSerializer,
)
from benchmarks.models import LoadProfile
from changes.choices import SweepState
from changes.models_sweeps import LoadMode, Objective, Sweep, SweepTrial
from changes.services import sweep_prediction
from hosts.engines.redaction import masked
from hosts.models import Deployment

# The detail shows this many of the prediction's ranked points (the page's table does too);
# the whole prediction can hold hundreds.
TOP_POINTS = 20
STATES = ", ".join(SweepState.values)


def page_url(obj) -> str | None:
    """The object's page, or None while the panel has no page for it (the sweep page is
    served by the changes app; the API must not break when its route is absent)."""
    try:
        return obj.get_absolute_url()
    except NoReverseMatch:
        return None


# --- what is read --------------------------------------------------------------------------
class SweepItemSerializer(serializers.ModelSerializer):
    """A sweep in the list: what it tunes, where, who made it, where it stands."""

    # Text, not an enum: "state" names the change requests' enum in the schema already.
    state = serializers.CharField(help_text=f"One of {STATES}.")
    state_label = serializers.CharField(source="get_state_display")
    deployment = ChangeDeploymentRefSerializer()
    objective = serializers.CharField(help_text="tps_per_gpu or cost_per_million.")
    load_mode = serializers.CharField(help_text="rate (req/s) or concurrency (users).")
    created_by = serializers.SerializerMethodField()
    approvals_count = serializers.SerializerMethodField()
    winner_id = serializers.IntegerField(allow_null=True, help_text="The winning trial's id.")
    page = serializers.SerializerMethodField()

    class Meta:
        model = Sweep
        fields = [
            "id",
            "title",
            "state",
            "state_label",
            "deployment",
            "objective",
            "load_mode",
            "created_by",
            "created_at",
            "decided_at",
            "started_at",
            "finished_at",
            "required_approvals",
            "approvals_count",
            "cancel_requested",
            "winner_id",
            "outcome",
            "page",
        ]

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_created_by(self, sweep: Sweep) -> str | None:
        return sweep.created_by.get_username() if sweep.created_by else None

    @extend_schema_field(serializers.IntegerField())
    def get_approvals_count(self, sweep: Sweep) -> int:
        # ``approvals`` is prefetched by the views: count in Python, not per row in SQL.
        return sum(1 for a in sweep.approvals.all() if a.decision == "approve")

    @extend_schema_field(
        serializers.CharField(allow_null=True, help_text="The sweep's page in the panel.")
    )
    def get_page(self, sweep: Sweep) -> str | None:
        return page_url(sweep)


class SweepProgressSerializer(serializers.Serializer):
    total = serializers.IntegerField(help_text="Trials, the control included.")
    done = serializers.IntegerField(help_text="Trials finished (measured, failed, skipped…).")
    current = serializers.IntegerField(allow_null=True, help_text="The running trial's index.")
    eta_s = serializers.FloatField(allow_null=True, help_text="Seconds left, while running.")


class SweepBudgetSerializer(serializers.Serializer):
    max_trials = serializers.IntegerField(help_text="Real trials, the control included.")
    max_minutes = serializers.IntegerField(help_text="Wall-time budget of the trials.")
    max_steps = serializers.IntegerField(help_text="Benchmarks per trial.")
    deadline = serializers.DateTimeField(
        allow_null=True, help_text="When trials stop being started (once running)."
    )


class SweepPointSerializer(serializers.Serializer):
    """One predicted point of the space (the simulator's ``PointScore``, without its curve)."""

    rank = serializers.IntegerField(help_text="1 = the best predicted.")
    point = serializers.DictField(help_text="The searched flags' values.")
    meets_slo = serializers.BooleanField()
    max_load = serializers.FloatField(
        allow_null=True, help_text="Highest load (req/s or users) predicted to meet the SLO."
    )
    objective = serializers.FloatField(allow_null=True)
    cost_per_million = serializers.FloatField(allow_null=True)
    margin = serializers.FloatField(allow_null=True, help_text="How far inside the SLO.")
    gpus_used = serializers.IntegerField()
    numbers = serializers.DictField(help_text="Predicted numbers at max_load.")
    note = serializers.CharField(allow_blank=True)


class SweepInfeasibleSerializer(serializers.Serializer):
    error = serializers.CharField(help_text="Why these points cannot run (the first example).")
    count = serializers.IntegerField()
    points = serializers.ListField(child=serializers.DictField())


class SweepPredictionSerializer(serializers.Serializer):
    """The prediction summed up; ``null`` while predicting or when there was none."""

    counts = serializers.DictField(
        child=serializers.IntegerField(), help_text="total, feasible and meeting points."
    )
    elapsed_s = serializers.FloatField()
    no_point_meets = serializers.BooleanField()
    top = SweepPointSerializer(many=True, help_text=f"The {TOP_POINTS} best feasible points.")
    infeasible = SweepInfeasibleSerializer(many=True)
    closest = SweepPointSerializer(
        allow_null=True, help_text="When no point meets the SLO: the one that misses it least."
    )


class SweepLaneSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    deployment = ChangeDeploymentRefSerializer()
    state = serializers.CharField(help_text="planned, queued, running, restored or failed.")
    state_label = serializers.CharField(source="get_state_display")
    original_config = ChangeConfigRefSerializer(allow_null=True)
    heartbeat_at = serializers.DateTimeField(allow_null=True)
    note = serializers.CharField(allow_blank=True)


class SweepProbeSerializer(serializers.Serializer):
    """One benchmark of a trial at one load."""

    load = serializers.FloatField()
    run_id = serializers.IntegerField(allow_null=True)
    run_url = serializers.CharField(allow_null=True, help_text="The run in this API.")
    status = serializers.CharField(allow_null=True)
    ok = serializers.BooleanField(allow_null=True, help_text="Met the SLO at this load.")
    violations = serializers.ListField(child=serializers.CharField())
    margin = serializers.FloatField(allow_null=True)
    numbers = serializers.DictField()


class SweepPredictionErrorSerializer(serializers.Serializer):
    """How far the prediction was from the measurement for one quantity it predicts."""

    quantity = serializers.CharField(
        help_text="load_rate (req/s) or load_concurrency (users): the max load at the SLO; "
        "output_tps_per_gpu, output_tps_per_user, ttft_p95_ms, cost_per_million."
    )
    name = serializers.CharField()
    predicted = serializers.FloatField()
    measured = serializers.FloatField()
    predicted_text = serializers.CharField(help_text="With its unit: 503 req/s.")
    measured_text = serializers.CharField()
    error = serializers.FloatField(
        help_text="(measured − predicted) ÷ predicted, each at its own max load at the SLO."
    )


class SweepTrialSerializer(serializers.ModelSerializer):
    """One config measured for real, beside what the simulator predicted for it."""

    state = serializers.CharField(
        help_text="queued, running, succeeded, failed, cancelled or skipped."
    )
    state_label = serializers.CharField(source="get_state_display")
    label = serializers.CharField()
    lane_deployment_id = serializers.SerializerMethodField()
    config = ChangeConfigRefSerializer(allow_null=True)
    settings = serializers.SerializerMethodField()
    predicted_max_load = serializers.SerializerMethodField()
    predicted_objective = serializers.SerializerMethodField()
    probes = serializers.SerializerMethodField()
    run_ids = serializers.SerializerMethodField()
    prediction_errors = serializers.SerializerMethodField()

    class Meta:
        model = SweepTrial
        fields = [
            "id",
            "index",
            "is_control",
            "label",
            "point",
            "settings",
            "state",
            "state_label",
            "lane_deployment_id",
            "config",
            "predicted_rank",
            "predicted_max_load",
            "predicted_objective",
            "max_load",
            "met_slo",
            "prediction_error",
            "prediction_errors",
            "numbers",
            "objective_value",
            "cost_per_million",
            "probes",
            "run_ids",
            "note",
            "error",
            "started_at",
            "finished_at",
        ]

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_lane_deployment_id(self, trial: SweepTrial) -> int | None:
        return trial.lane.deployment_id if trial.lane else None

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_settings(self, trial: SweepTrial) -> dict:
        """The whole settings applied, secrets masked (as the changes API shows them)."""
        return masked(trial.settings)

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_predicted_max_load(self, trial: SweepTrial) -> float | None:
        return (trial.predicted or {}).get("max_load")

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_predicted_objective(self, trial: SweepTrial) -> float | None:
        return (trial.predicted or {}).get("objective")

    @extend_schema_field(SweepProbeSerializer(many=True))
    def get_probes(self, trial: SweepTrial) -> list:
        rows = []
        for probe in trial.probes or []:
            run = probe.get("run")
            rows.append(
                {
                    "load": probe.get("load"),
                    "run_id": run,
                    "run_url": reverse("api:run-detail", args=[run]) if run else None,
                    "status": probe.get("status"),
                    "ok": probe.get("ok"),
                    "violations": probe.get("violations") or [],
                    "margin": probe.get("margin"),
                    "numbers": probe.get("numbers") or {},
                }
            )
        return SweepProbeSerializer(rows, many=True).data

    @extend_schema_field(serializers.ListField(child=serializers.IntegerField()))
    def get_run_ids(self, trial: SweepTrial) -> list[int]:
        return sorted(run.pk for run in trial.runs.all())

    @extend_schema_field(SweepPredictionErrorSerializer(many=True))
    def get_prediction_errors(self, trial: SweepTrial) -> list:
        currency = (trial.sweep.target or {}).get("currency") or ""
        rows = sweep_prediction.prediction_errors(trial, trial.sweep.load_mode, currency)
        return SweepPredictionErrorSerializer(rows, many=True).data


class SweepReviewSerializer(serializers.Serializer):
    reviewer = serializers.CharField(source="reviewer_name")
    decision = serializers.CharField(help_text="approve or reject.")
    comment = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()


def point_row(rank: int, score: dict) -> dict:
    return {
        "rank": rank,
        "point": score.get("point") or {},
        "meets_slo": bool(score.get("meets_slo")),
        "max_load": score.get("max_load"),
        "objective": score.get("objective"),
        "cost_per_million": score.get("cost_per_million"),
        "margin": score.get("margin"),
        "gpus_used": score.get("gpus_used") or 1,
        "numbers": score.get("numbers") or {},
        "note": score.get("note") or "",
    }


def prediction_summary(prediction: dict) -> dict | None:
    """``Prediction.to_dict()`` summed up: its points are stored ranked, so the top ones are
    the first feasible ones (their rank is the trials' ``predicted_rank``)."""
    if not prediction or "points" not in prediction:
        return None
    feasible = [p for p in prediction["points"] if p.get("feasible")]
    closest = prediction.get("closest")
    return {
        "counts": prediction.get("counts") or {},
        "elapsed_s": prediction.get("elapsed_s") or 0.0,
        "no_point_meets": bool(prediction.get("no_point_meets")),
        "top": [point_row(n, p) for n, p in enumerate(feasible[:TOP_POINTS], start=1)],
        "infeasible": prediction.get("infeasible") or [],
        "closest": (
            None
            if not closest
            else point_row(next((n for n, p in enumerate(feasible, 1) if p == closest), 0), closest)
        ),
    }


class SweepDetailSerializer(SweepItemSerializer):
    """Everything the sweep's page shows. Built by ``api.views.sweeps`` with the caller's
    actions and the progress in the context."""

    load_profile = ChangeProfileRefSerializer()
    base_config = ChangeConfigRefSerializer(allow_null=True)
    space = serializers.DictField(help_text="{flag: [values]} as validated.")
    slo = serializers.DictField(help_text="The SLO's limits (null: not set).")
    budget = serializers.SerializerMethodField()
    target = serializers.DictField(
        help_text="What was predicted for: gpu, num_gpus, time_scale, price_per_gpu_hour, "
        "currency, price_source."
    )
    prediction = serializers.SerializerMethodField()
    progress = serializers.SerializerMethodField()
    lanes = SweepLaneSerializer(many=True)
    trials = SweepTrialSerializer(many=True)
    reviews = SweepReviewSerializer(many=True, source="approvals")
    actions = serializers.SerializerMethodField()
    reach_warning = serializers.SerializerMethodField(
        help_text="Why the profile cannot measure the highest loads the trials may search at "
        "a steady state (empty when it can)."
    )

    class Meta(SweepItemSerializer.Meta):
        fields = SweepItemSerializer.Meta.fields + [
            "load_profile",
            "base_config",
            "space",
            "slo",
            "budget",
            "target",
            "prediction",
            "prediction_problem",
            "progress",
            "lanes",
            "trials",
            "reviews",
            "actions",
            "reach_warning",
        ]

    def get_reach_warning(self, sweep: Sweep) -> str:
        return sweep_prediction.reach_warning(sweep, list(sweep.trials.all()))

    @extend_schema_field(SweepBudgetSerializer)
    def get_budget(self, sweep: Sweep) -> dict:
        return SweepBudgetSerializer(
            {
                "max_trials": sweep.max_trials,
                "max_minutes": sweep.max_minutes,
                "max_steps": sweep.max_steps,
                "deadline": sweep.deadline,
            }
        ).data

    @extend_schema_field(SweepPredictionSerializer(allow_null=True))
    def get_prediction(self, sweep: Sweep) -> dict | None:
        summary = prediction_summary(sweep.prediction)
        return None if summary is None else SweepPredictionSerializer(summary).data

    @extend_schema_field(SweepProgressSerializer)
    def get_progress(self, sweep: Sweep) -> dict:
        return SweepProgressSerializer(self.context["progress"]).data

    @extend_schema_field(
        serializers.ListField(
            child=serializers.CharField(),
            help_text="What the caller may do now (the page's buttons): approve, reject, "
            "start, cancel, propose (the winner as a change).",
        )
    )
    def get_actions(self, sweep: Sweep) -> list[str]:
        return sorted(self.context["actions"])


# --- what is sent ----------------------------------------------------------------------------
class SweepCreateSerializer(StrictSerializerMixin, serializers.Serializer):
    """A new sweep, as the page's "new sweep" form takes it. The space, SLO, load and price
    are checked by ``changes.services.sweeps.create_sweep``, whose errors name these fields."""

    deployment = serializers.PrimaryKeyRelatedField(
        queryset=Deployment.objects.select_related("host", "active_config")
    )
    title = serializers.CharField(max_length=120, required=False, allow_blank=True, default="")
    load_profile = serializers.PrimaryKeyRelatedField(
        queryset=LoadProfile.objects.all(),
        help_text="A load profile version's id: lengths, prefixes and request count of every "
        "trial's benchmarks.",
    )
    load_mode = serializers.ChoiceField(choices=LoadMode.choices, default=LoadMode.RATE)
    space = serializers.DictField(
        child=serializers.JSONField(),
        allow_empty=True,
        help_text='{flag (dest): values}: a list ([16, 32, 64]), a range ({"min": 16, '
        '"max": 64, "step": 16}) or text ("16,32,64").',
    )
    slo = serializers.DictField(
        child=serializers.JSONField(allow_null=True),
        allow_empty=True,
        help_text="ttft_p95_ms, ttft_p99_ms, itl_p95_ms, tpot_p95_ms, max_error_rate (a "
        "fraction, default 0.01), min_output_tps_per_user: at least one latency limit or "
        "the speed floor.",
    )
    objective = serializers.ChoiceField(choices=Objective.choices, default=Objective.TPS_PER_GPU)
    max_trials = serializers.IntegerField(
        min_value=1, max_value=30, default=4, help_text="Real trials, the control included."
    )
    max_minutes = serializers.IntegerField(
        min_value=2, max_value=24 * 60, default=60, help_text="Wall-time budget of the trials."
    )
    max_steps = serializers.IntegerField(
        min_value=2, max_value=12, default=5, help_text="Benchmarks per trial."
    )
    twins = serializers.PrimaryKeyRelatedField(
        queryset=Deployment.objects.select_related("host", "active_config"),
        many=True,
        required=False,
        default=list,
        help_text="Other deployments (same engine, version, model and GPUs) running trials "
        "in parallel.",
    )


class SweepCommentBodySerializer(StrictSerializerMixin, serializers.Serializer):
    comment = serializers.CharField(
        required=False, allow_blank=True, max_length=5000, trim_whitespace=True
    )


class SweepRequiredCommentSerializer(StrictSerializerMixin, serializers.Serializer):
    comment = serializers.CharField(max_length=5000, trim_whitespace=True)


class SweepEmptyBodySerializer(StrictSerializerMixin, serializers.Serializer):
    """No fields: anything sent is refused as unknown."""


class SweepProposedChangeSerializer(serializers.Serializer):
    """The change proposed from the winner: read it at ``url``, act on it there."""

    change_id = serializers.IntegerField()
    url = serializers.CharField(help_text="The change in this API.")
    page = serializers.CharField(allow_null=True, help_text="The change's page.")
    state = serializers.CharField()
