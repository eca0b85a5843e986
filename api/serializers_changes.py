"""Shapes of the changes API: what a change looks like in the list and on its own, and the
bodies of a proposal and of each action.

Thresholds are in the page's units both ways (percentage points for the error rate, percent
for the latencies), so what a script sends is what it reads back."""

from __future__ import annotations

from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.base import StrictSerializerMixin
from benchmarks.services import probes
from changes.choices import Decision
from changes.models import ChangeRequest
from changes.verdict import verdict_text
from hosts.engines.redaction import masked
from hosts.models import Deployment, EngineConfig

# The page's form keeps thresholds in percent; the row keeps fractions.
THRESHOLDS = (
    "max_error_rate_increase",
    "max_ttft_p95_regression",
    "max_itl_p95_regression",
    "max_quality_loss",
)


# --- what is read --------------------------------------------------------------------------
class ChangeDeploymentRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    host_name = serializers.CharField(source="host.name")


class ChangeConfigRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    version = serializers.IntegerField()


class ChangeProfileRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    version = serializers.IntegerField()


class ChangeItemSerializer(serializers.ModelSerializer):
    """A change in the list: what it is, where, who proposed it, where it stands."""

    state_label = serializers.CharField(source="get_state_display")
    deployment = ChangeDeploymentRefSerializer()
    proposed_by = serializers.SerializerMethodField()
    approved_by = serializers.SerializerMethodField()
    approvals_count = serializers.SerializerMethodField()

    class Meta:
        model = ChangeRequest
        fields = [
            "id",
            "title",
            "state",
            "state_label",
            "kind",
            "deployment",
            "proposed_by",
            "created_at",
            "submitted_at",
            "decided_at",
            "approved_by",
            "approvals_count",
            "required_approvals",
            "stage",
            "finished_at",
        ]

    def _current(self, change: ChangeRequest) -> list:
        # Decisions of this round only (those made against the current base), as the page
        # counts them; ``approvals`` is prefetched by the views.
        return [a for a in change.approvals.all() if a.base_config_id == change.base_config_id]

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_proposed_by(self, change: ChangeRequest) -> str | None:
        return change.proposed_by.get_username() if change.proposed_by else None

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_approved_by(self, change: ChangeRequest) -> list[str]:
        return [a.reviewer_name for a in self._current(change) if a.decision == Decision.APPROVE]

    @extend_schema_field(serializers.IntegerField())
    def get_approvals_count(self, change: ChangeRequest) -> int:
        return len(self.get_approved_by(change))


class ChangeDiffRowSerializer(serializers.Serializer):
    flag = serializers.CharField(help_text="A settings flag (dest), env.NAME or placement.KEY.")
    running = serializers.JSONField(allow_null=True, help_text="null: not set. Secrets masked.")
    proposed = serializers.JSONField(allow_null=True, help_text="null: not set. Secrets masked.")


class ChangeWarningSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class ChangeReviewSerializer(serializers.Serializer):
    reviewer = serializers.CharField(source="reviewer_name")
    decision = serializers.CharField()
    comment = serializers.CharField()
    created_at = serializers.DateTimeField()
    counts = serializers.BooleanField(
        help_text="Made against the change's current base (false: an earlier round, before "
        "a rebase)."
    )


class ChangeCommentSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    at = serializers.DateTimeField()
    who = serializers.CharField()
    text = serializers.CharField()


class ChangeTimelineItemSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    at = serializers.DateTimeField()
    who = serializers.CharField()
    action = serializers.CharField(
        help_text="propose, transition, approve, reject, comment, rebase, apply, stage, …"
    )
    title = serializers.CharField()
    message = serializers.CharField(allow_blank=True)
    stage = serializers.CharField(allow_null=True, help_text="Stage entries: the stage.")
    status = serializers.CharField(
        allow_null=True, help_text="Stage entries: started, succeeded, failed, skipped, …"
    )
    state = serializers.CharField(allow_null=True, help_text="Transitions: the new state.")
    detail = serializers.CharField(allow_null=True)
    link = serializers.CharField(allow_null=True)


class ChangeCheckSerializer(serializers.Serializer):
    metric = serializers.CharField()
    label = serializers.CharField()
    baseline = serializers.FloatField(allow_null=True)
    after = serializers.FloatField(allow_null=True)
    change = serializers.FloatField(allow_null=True, required=False)
    limit = serializers.CharField()
    limit_value = serializers.FloatField(
        allow_null=True,
        required=False,
        help_text="The limit on the baseline run the verdict compares against (ms, or a "
        "share for the error rate).",
    )
    limit_applied = serializers.CharField(
        required=False,
        help_text="The limit as it applies, in the page's words: "
        '"+20 % of run #12\'s 412.0 ms = 494.4 ms".',
    )
    noise = serializers.ListField(
        child=serializers.FloatField(),
        required=False,
        help_text="The change's range within the runs' noise bands (low, high).",
    )
    noisy = serializers.BooleanField(
        required=False, help_text="true: not judged, the noise band spans the limit."
    )
    ok = serializers.BooleanField(allow_null=True, help_text="null: not judged (see note).")
    note = serializers.CharField(required=False)


class ChangeExtraRunsSerializer(serializers.Serializer):
    budget = serializers.IntegerField(help_text="Extra verification runs the change allows.")
    measured = serializers.IntegerField(help_text="Extra verification runs measured.")
    pooled = serializers.IntegerField(
        help_text="Of those, measured under the baseline's conditions and pooled."
    )


class ChangeVerdictSerializer(serializers.Serializer):
    outcome = serializers.CharField(help_text="verified, regressed or inconclusive")
    regressed = serializers.BooleanField()
    reason = serializers.CharField(
        allow_blank=True,
        help_text="Why, in the page's words (\"cannot judge TTFT p95: run-to-run noise ±48 % "
        '… spans the limit +20 %", "hard guard: …").',
    )
    text = serializers.CharField(help_text="The verdict in one line, as the timeline says it.")
    checks = ChangeCheckSerializer(many=True)
    throughput_change = serializers.FloatField(allow_null=True)
    conditions = serializers.ListField(child=serializers.DictField())
    notes = serializers.ListField(child=serializers.CharField())
    guards = serializers.ListField(
        child=serializers.CharField(),
        help_text="Hard guards that fired (preemptions or a saturated KV cache new under the "
        "change, an engine restart): each rolls the change back whatever the noise.",
    )
    measure_more = serializers.BooleanField(
        help_text="Only the run-to-run noise kept a latency from being judged."
    )
    baseline_run = serializers.IntegerField(
        allow_null=True, help_text="The run the verdict compares against."
    )
    verification_runs = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="The runs of the new config whose requests were judged (pooled).",
    )
    extra_runs = ChangeExtraRunsSerializer(allow_null=True)


class ChangeQualitySerializer(serializers.Serializer):
    """The quality probe's verdict, in the words the change's page and timeline say."""

    verdict = serializers.CharField(
        help_text='"loss", "no loss", "no significant loss" or "cannot tell".'
    )
    reason = serializers.CharField()
    text = serializers.CharField(help_text='"<verdict>: <reason>".')
    baseline_probe = serializers.IntegerField(allow_null=True)
    candidate_probe = serializers.IntegerField(allow_null=True)


class ChangeLockSerializer(serializers.Serializer):
    change_id = serializers.IntegerField(help_text="The change holding the deployment's lock.")
    state = serializers.CharField()


class ChangeFindingRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    rule = serializers.CharField()
    title = serializers.CharField()
    severity = serializers.CharField()


class ChangeDetailSerializer(ChangeItemSerializer):
    """Everything the change's page shows. Built by ``api.views.changes`` with the parts that
    take queries of their own (timeline, lock, the caller's actions) in the context."""

    verify_profile = ChangeProfileRefSerializer(allow_null=True)
    finding = ChangeFindingRefSerializer(
        allow_null=True, help_text="The advisor finding this change answers, if any."
    )
    baseline_run_id = serializers.IntegerField(allow_null=True)
    verification_run_id = serializers.IntegerField(allow_null=True)
    extra_run_ids = serializers.SerializerMethodField()
    max_extra_runs = serializers.IntegerField(
        help_text="The noise budget: up to this many extra verification runs when the "
        "run-to-run noise is too wide to judge a latency against its limit."
    )
    base_config = ChangeConfigRefSerializer(allow_null=True)
    target_config = ChangeConfigRefSerializer(allow_null=True)
    snapshot_config = ChangeConfigRefSerializer(allow_null=True)
    applied_config = ChangeConfigRefSerializer(allow_null=True)
    applied_by = serializers.SerializerMethodField()
    settings = serializers.SerializerMethodField()
    env = serializers.SerializerMethodField()
    placement = serializers.SerializerMethodField()
    diff = serializers.SerializerMethodField()
    stale = serializers.SerializerMethodField()
    warnings = ChangeWarningSerializer(many=True)
    prediction = serializers.JSONField(
        help_text="The simulator's before → after under the verify profile ({} without one; "
        '{"available": false, "reason"} when it cannot model it).'
    )
    reviews = serializers.SerializerMethodField()
    comments = serializers.SerializerMethodField()
    timeline = serializers.SerializerMethodField()
    verdict = serializers.SerializerMethodField()
    quality = serializers.SerializerMethodField()
    lock = serializers.SerializerMethodField()
    pipeline_alive = serializers.SerializerMethodField()
    actions = serializers.SerializerMethodField()
    max_error_rate_increase = serializers.SerializerMethodField()
    max_ttft_p95_regression = serializers.SerializerMethodField()
    max_itl_p95_regression = serializers.SerializerMethodField()
    max_quality_loss = serializers.SerializerMethodField()

    class Meta(ChangeItemSerializer.Meta):
        fields = ChangeItemSerializer.Meta.fields + [
            "rationale",
            "outcome",
            "apply_started_at",
            "applied_by",
            "rollback_requested",
            "window_start",
            "window_end",
            "verify_profile",
            "finding",
            "baseline_run_id",
            "verification_run_id",
            "extra_run_ids",
            "max_extra_runs",
            *THRESHOLDS,
            "base_config",
            "target_config",
            "snapshot_config",
            "applied_config",
            "settings",
            "env",
            "placement",
            "model",
            "diff",
            "stale",
            "warnings",
            "prediction",
            "reviews",
            "comments",
            "timeline",
            "verdict",
            "quality",
            "lock",
            "pipeline_alive",
            "actions",
        ]

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_applied_by(self, change: ChangeRequest) -> str | None:
        return change.applied_by.get_username() if change.applied_by else None

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_settings(self, change: ChangeRequest) -> dict:
        """The proposed engine settings, secrets masked."""
        return masked(change.settings)

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_env(self, change: ChangeRequest) -> dict:
        """The proposed environment, secret values masked."""
        return masked(change.env)

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_placement(self, change: ChangeRequest) -> dict:
        """The proposed CPU placement: {numa_node, cpus}, null where not set."""
        placement = change.placement or {}
        return {"numa_node": placement.get("numa_node"), "cpus": placement.get("cpus")}

    @extend_schema_field(ChangeDiffRowSerializer(many=True))
    def get_diff(self, change: ChangeRequest) -> list[dict]:
        shown = self.context["diff"]
        return [{"flag": k, "running": old, "proposed": new} for k, (old, new) in shown.items()]

    @extend_schema_field(
        serializers.BooleanField(
            help_text="The deployment runs another config than the one this change was "
            "proposed against: rebase it."
        )
    )
    def get_stale(self, change: ChangeRequest) -> bool:
        return change.is_stale()

    @extend_schema_field(ChangeReviewSerializer(many=True))
    def get_reviews(self, change: ChangeRequest) -> list:
        rows = [
            {
                "reviewer_name": a.reviewer_name,
                "decision": a.decision,
                "comment": a.comment,
                "created_at": a.created_at,
                "counts": a.base_config_id == change.base_config_id,
            }
            for a in change.approvals.all()
        ]
        return ChangeReviewSerializer(rows, many=True).data

    @extend_schema_field(ChangeCommentSerializer(many=True))
    def get_comments(self, change: ChangeRequest) -> list:
        rows = [
            {"id": i["id"], "at": parse_datetime(i["at"]), "who": i["who"], "text": i["message"]}
            for i in self.context["timeline"]
            if i["action"] == "comment"
        ]
        return ChangeCommentSerializer(rows, many=True).data

    @extend_schema_field(ChangeTimelineItemSerializer(many=True))
    def get_timeline(self, change: ChangeRequest) -> list:
        rows = []
        for item in self.context["timeline"]:
            after = item.get("after") or {}
            rows.append(
                {
                    **item,
                    "at": parse_datetime(item["at"]),  # written as text in the entry's shape
                    "message": item.get("message") or "",
                    "stage": after.get("stage") if item["action"] == "stage" else None,
                    "status": after.get("status") if item["action"] == "stage" else None,
                    "state": after.get("state") if item["action"] == "transition" else None,
                    "detail": item.get("detail") or None,
                    "link": item.get("link") or None,
                }
            )
        return ChangeTimelineItemSerializer(rows, many=True).data

    @extend_schema_field(ChangeQualitySerializer(allow_null=True))
    def get_quality(self, change: ChangeRequest) -> dict | None:
        if not change.quality_comparison:
            return None
        return {
            **probes.quality_verdict(change.quality_comparison),
            "baseline_probe": change.quality_baseline_id,
            "candidate_probe": change.quality_run_id,
        }

    @extend_schema_field(ChangeVerdictSerializer(allow_null=True))
    def get_verdict(self, change: ChangeRequest) -> dict | None:
        result = change.comparison
        if not result:
            return None
        regressed = bool(result.get("regressed"))
        return {
            # Verdicts recorded before "outcome" existed said only regressed or not.
            "outcome": result.get("outcome") or ("regressed" if regressed else "verified"),
            "regressed": regressed,
            "reason": result.get("reason") or "",
            "text": verdict_text(result),
            "checks": result.get("checks") or [],
            "throughput_change": result.get("throughput_change"),
            "conditions": result.get("conditions") or [],
            "notes": result.get("notes") or [],
            "guards": result.get("guards") or [],
            "measure_more": bool(result.get("measure_more")),
            "baseline_run": result.get("baseline_run"),
            "verification_runs": result.get("verification_runs") or [],
            "extra_runs": result.get("extra_runs"),
        }

    @extend_schema_field(ChangeLockSerializer(allow_null=True))
    def get_lock(self, change: ChangeRequest) -> dict | None:
        holder = self.context["lock"]
        return {"change_id": holder.pk, "state": holder.state} if holder else None

    @extend_schema_field(serializers.BooleanField())
    def get_pipeline_alive(self, change: ChangeRequest) -> bool:
        return change.pipeline_alive()

    @extend_schema_field(
        serializers.ListField(
            child=serializers.CharField(),
            help_text="What the caller may do now (the page's buttons): submit, approve, "
            "reject, withdraw, comment, rebase, apply, rollback, resume.",
        )
    )
    def get_actions(self, change: ChangeRequest) -> list[str]:
        return sorted(self.context["actions"])

    @extend_schema_field(serializers.FloatField(help_text="Percentage points."))
    def get_max_error_rate_increase(self, change: ChangeRequest) -> float:
        return round(change.max_error_rate_increase * 100, 6)

    @extend_schema_field(serializers.FloatField(help_text="Percent."))
    def get_max_ttft_p95_regression(self, change: ChangeRequest) -> float:
        return round(change.max_ttft_p95_regression * 100, 6)

    @extend_schema_field(serializers.FloatField(help_text="Percent."))
    def get_max_itl_p95_regression(self, change: ChangeRequest) -> float:
        return round(change.max_itl_p95_regression * 100, 6)

    @extend_schema_field(
        serializers.ListField(
            child=serializers.IntegerField(),
            help_text="The extra verification runs measured to narrow the noise band.",
        )
    )
    def get_extra_run_ids(self, change: ChangeRequest) -> list[int]:
        return sorted(run.pk for run in change.extra_runs.all())

    @extend_schema_field(serializers.FloatField(help_text="Accuracy points."))
    def get_max_quality_loss(self, change: ChangeRequest) -> float:
        return round(change.max_quality_loss * 100, 6)


# --- what is sent ----------------------------------------------------------------------------
class ChangePlacementSerializer(StrictSerializerMixin, serializers.Serializer):
    """CPU placement: a key left out keeps the running value, null clears it."""

    numa_node = serializers.IntegerField(
        required=False,
        allow_null=True,
        help_text="A NUMA node of the host (its inventory's numa_nodes), or null: none.",
    )
    cpus = serializers.CharField(
        required=False,
        allow_null=True,
        allow_blank=True,
        max_length=200,
        help_text="A CPU list of the host like 0-15,32-47, or null: no pinning.",
    )


class ChangeProposeSerializer(StrictSerializerMixin, serializers.Serializer):
    """A new change, as the page's "new change" form takes it. The values are checked again by
    that very form (``changes.forms.ProposeForm``) and by the service, so the rules are the
    page's."""

    deployment = serializers.PrimaryKeyRelatedField(
        queryset=Deployment.objects.select_related("host", "active_config")
    )
    title = serializers.CharField(max_length=120)
    rationale = serializers.CharField()
    settings = serializers.DictField(
        child=serializers.JSONField(allow_null=True),
        allow_empty=True,
        help_text="Flags (by dest, e.g. max_num_seqs) to set on top of the running config, "
        "as the page's form starts from the running values: a flag left out keeps its "
        "running value (a secret too), null unsets it. Several values: a list.",
    )
    env = serializers.DictField(
        child=serializers.CharField(allow_null=True, allow_blank=True, trim_whitespace=True),
        required=False,
        help_text="Environment variables (by name) to set on top of the running config's, as "
        "settings are: a variable left out keeps its running value, null removes it. A "
        "secret (HF_TOKEN, VLLM_API_KEY, …) given as the mask •••, as responses show it, "
        "keeps the stored value. Only variables the launch rules know to be safe are allowed.",
    )
    placement = ChangePlacementSerializer(
        required=False,
        allow_null=True,
        help_text="CPU placement on the host: {numa_node, cpus}; left out keeps the running "
        "one, null: no placement.",
    )
    model = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=200,
        help_text="Another model to serve (e.g. its AWQ or FP8 variant); left out or the "
        "served one: keep the model. A change of model is verified by a quality probe.",
    )
    verify_profile = serializers.IntegerField(
        required=False, allow_null=True, help_text="A load profile's id, or null: none."
    )
    baseline_run = serializers.IntegerField(
        required=False,
        allow_null=True,
        help_text="A successful run of this deployment on its running config, or null: "
        "measure a fresh baseline when applying.",
    )
    max_error_rate_increase = serializers.FloatField(
        required=False, help_text="Percentage points (default 1)."
    )
    max_ttft_p95_regression = serializers.FloatField(
        required=False, help_text="Percent (default 20)."
    )
    max_itl_p95_regression = serializers.FloatField(
        required=False, help_text="Percent (default 20)."
    )
    max_quality_loss = serializers.FloatField(
        required=False,
        help_text="Accuracy points (default 1): when a quality probe runs, a significant loss "
        "beyond this rolls the change back.",
    )
    max_extra_runs = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=5,
        help_text="The noise budget (default 2): extra verification runs when the run-to-run "
        "noise is too wide to judge a latency against its limit.",
    )
    window_start = serializers.DateTimeField(required=False, allow_null=True)
    window_end = serializers.DateTimeField(required=False, allow_null=True)
    finding = serializers.IntegerField(
        required=False,
        allow_null=True,
        help_text="The advisor finding this change answers (one of the deployment's): "
        "reviewers see it beside the rationale.",
    )
    submit = serializers.BooleanField(
        default=True, help_text="true: pending review (the page's Submit); false: a draft."
    )


class ChangeRollbackProposalSerializer(StrictSerializerMixin, serializers.Serializer):
    """Going back to an earlier version of a deployment's config, as the config history page
    proposes it: a change reviewed like any other."""

    config = serializers.PrimaryKeyRelatedField(
        queryset=EngineConfig.objects.select_related(
            "deployment__host", "deployment__active_config"
        ),
        help_text="The engine config version to go back to.",
    )
    rationale = serializers.CharField(max_length=5000, trim_whitespace=True)


class ChangeCommentBodySerializer(StrictSerializerMixin, serializers.Serializer):
    comment = serializers.CharField(
        required=False, allow_blank=True, max_length=5000, trim_whitespace=True
    )


class ChangeRequiredCommentSerializer(StrictSerializerMixin, serializers.Serializer):
    comment = serializers.CharField(max_length=5000, trim_whitespace=True)


class ChangeReasonBodySerializer(StrictSerializerMixin, serializers.Serializer):
    reason = serializers.CharField(
        required=False, allow_blank=True, max_length=5000, trim_whitespace=True
    )


class ChangeRequiredReasonSerializer(StrictSerializerMixin, serializers.Serializer):
    reason = serializers.CharField(max_length=5000, trim_whitespace=True)


class ChangeEmptyBodySerializer(StrictSerializerMixin, serializers.Serializer):
    """No fields: anything sent is refused as unknown."""
