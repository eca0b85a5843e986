"""Change requests: a reviewed, approved, applied, verified (or rolled back) engine-config change.

The timeline of a change (every transition, approval, comment and pipeline stage) is the audit
log itself: ``controlpanel.AuditEntry`` rows pointing at the change, append-only, so the record a
reviewer reads and the record an auditor exports are the same rows.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings as conf
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.urls import reverse
from django.utils import timezone

from changes import rules
from changes.choices import (
    LOCK_STATES,
    REVIEW_STATES,
    ChangeKind,
    ChangeState,
    Decision,
)
from controlpanel.workflow import Claim, ReviewDecision, StateMachine
from hosts.models import flat_config, flat_diff

S = ChangeState

# The state machine: what each state may become. Anything else is refused.
TRANSITIONS: dict[ChangeState, frozenset[ChangeState]] = {
    S.DRAFT: frozenset({S.PENDING, S.WITHDRAWN}),
    S.PENDING: frozenset({S.APPROVED, S.REJECTED, S.WITHDRAWN}),
    # Back to pending: a rebase onto a newer running config voids the approvals.
    S.APPROVED: frozenset({S.APPLYING, S.PENDING, S.WITHDRAWN}),
    S.APPLYING: frozenset({S.VERIFYING, S.APPLIED, S.ROLLED_BACK, S.FAILED}),
    S.VERIFYING: frozenset({S.APPLIED, S.UNVERIFIED, S.ROLLED_BACK, S.FAILED}),
    S.REJECTED: frozenset(),
    S.WITHDRAWN: frozenset(),
    S.APPLIED: frozenset(),
    S.UNVERIFIED: frozenset(),
    S.ROLLED_BACK: frozenset(),
    S.FAILED: frozenset(),
}
# Which timestamp each state stamps when entered.
STAMPS = {
    S.PENDING: "submitted_at",
    S.APPROVED: "decided_at",
    S.REJECTED: "decided_at",
    S.APPLYING: "apply_started_at",
    S.APPLIED: "finished_at",
    S.UNVERIFIED: "finished_at",
    S.ROLLED_BACK: "finished_at",
    S.FAILED: "finished_at",
    S.WITHDRAWN: "finished_at",
}


class ChangeRequestQuerySet(models.QuerySet):
    def with_approvals(self):
        """Each change with ``approvals_now``: its approvals in the current round (made
        against its base config; see ``current_approvals``), counted in the same query."""
        return self.annotate(
            approvals_now=models.Count(
                "approvals",
                filter=models.Q(approvals__decision=Decision.APPROVE)
                & (
                    models.Q(approvals__base_config_id=models.F("base_config_id"))
                    | models.Q(approvals__base_config__isnull=True, base_config__isnull=True)
                ),
            )
        )


class ChangeRequest(StateMachine, models.Model):
    """A proposed change of one deployment's engine settings and its whole life: review,
    apply, verification and, when it went wrong, the rollback.

    ``base_config`` is the running config the proposal was made against; when the deployment
    runs another config by the time of review or apply, the change is stale and must be
    rebased. The proposed settings live here until apply, when they become the deployment's
    next ``EngineConfig`` version (``applied_config``); a rollback change applies an existing
    version (``target_config``) instead.
    """

    deployment = models.ForeignKey(
        "hosts.Deployment", on_delete=models.CASCADE, related_name="changes"
    )
    kind = models.CharField(max_length=16, choices=ChangeKind.choices, default=ChangeKind.SETTINGS)
    state = models.CharField(
        max_length=16, choices=ChangeState.choices, default=ChangeState.DRAFT, db_index=True
    )
    title = models.CharField(max_length=120)
    rationale = models.TextField(help_text="Why: what was measured, what you expect to improve.")
    proposed_by = models.ForeignKey(
        conf.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    base_config = models.ForeignKey(
        "hosts.EngineConfig",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The running config this change was proposed (or last rebased) against.",
    )
    target_config = models.ForeignKey(
        "hosts.EngineConfig",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Rollback changes: the earlier version to go back to.",
    )
    finding = models.ForeignKey(
        "changes.Finding",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="proposals",
        help_text='The advisor finding this change answers (its "Propose this change").',
    )
    sweep = models.ForeignKey(
        "changes.Sweep",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="proposals",
        help_text="The tuning sweep whose winner this change proposes (its evidence).",
    )
    settings = models.JSONField(default=dict, blank=True, help_text="Proposed engine settings.")
    model = models.CharField(
        max_length=200,
        blank=True,
        help_text="Another model to serve (e.g. an AWQ or FP8 variant); empty: keep the model.",
    )
    env = models.JSONField(default=dict, blank=True)
    placement = models.JSONField(default=dict, blank=True)
    warnings = models.JSONField(default=list, blank=True)
    prediction = models.JSONField(
        default=dict, blank=True, help_text="The simulator's before → after, when it can model it."
    )
    required_approvals = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(5)]
    )
    # --- verification ---------------------------------------------------------------------
    verify_profile = models.ForeignKey(
        "benchmarks.LoadProfile",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Benchmark the engine with this profile after the apply (and before, for "
        "the baseline) and roll back on a regression.",
    )
    baseline_run = models.ForeignKey(
        "benchmarks.BenchmarkRun",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    verification_run = models.ForeignKey(
        "benchmarks.BenchmarkRun",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    max_error_rate_increase = models.FloatField(
        default=0.01,
        validators=[MinValueValidator(0), MaxValueValidator(1)],
        help_text="Roll back when the error rate rises by more than this (0.01 = 1 point).",
    )
    max_ttft_p95_regression = models.FloatField(
        default=0.2,
        validators=[MinValueValidator(0)],
        help_text="Roll back when p95 TTFT grows by more than this fraction (0.2 = 20 %).",
    )
    max_itl_p95_regression = models.FloatField(
        default=0.2,
        validators=[MinValueValidator(0)],
        help_text="Roll back when p95 ITL grows by more than this fraction.",
    )
    max_extra_runs = models.PositiveSmallIntegerField(
        default=2,
        validators=[MaxValueValidator(5)],
        help_text="When the run-to-run noise is too wide to judge a latency against its "
        "limit, measure up to this many extra verification runs before saying it cannot "
        "judge.",
    )
    extra_runs = models.ManyToManyField(
        "benchmarks.BenchmarkRun",
        blank=True,
        related_name="+",
        help_text="The extra verification runs measured to narrow the noise band.",
    )
    comparison = models.JSONField(default=dict, blank=True)
    # --- the quality probe (a change touching the model, its precision or quantisation) ----
    probe_set = models.ForeignKey(
        "benchmarks.ProbeSet",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Ask this probe set before and after the apply; roll back on a quality loss.",
    )
    quality_baseline = models.ForeignKey(
        "benchmarks.ProbeRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    quality_run = models.ForeignKey(
        "benchmarks.ProbeRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    quality_comparison = models.JSONField(default=dict, blank=True)
    max_quality_loss = models.FloatField(
        default=0.01,
        validators=[MinValueValidator(0), MaxValueValidator(1)],
        help_text="Roll back when accuracy drops by more than this at 95 % confidence "
        "(0.01 = 1 point).",
    )
    # --- apply ----------------------------------------------------------------------------
    window_start = models.DateTimeField(null=True, blank=True)
    window_end = models.DateTimeField(null=True, blank=True)
    snapshot_config = models.ForeignKey(
        "hosts.EngineConfig",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The last good config at the start of the apply: where a rollback goes.",
    )
    applied_config = models.ForeignKey(
        "hosts.EngineConfig",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    operation = models.ForeignKey(
        "hosts.EngineOperation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    baseline_operation = models.ForeignKey(
        "hosts.EngineOperation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The restart before a fresh baseline: it starts from the cold cache the "
        "verification will start from.",
    )
    rollback_operation = models.ForeignKey(
        "hosts.EngineOperation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    applied_by = models.ForeignKey(
        conf.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    outcome = models.CharField(max_length=1000, blank=True, help_text="How it ended, in words.")
    stage = models.CharField(max_length=16, blank=True, help_text="The pipeline stage now.")
    rollback_requested = models.BooleanField(
        default=False, help_text="Someone asked the pipeline to roll back (e.g. after a crash)."
    )
    # The pipeline's claim on the change: a second worker (a redelivery, a resume) does not
    # run it while the first one's heartbeat is fresh.
    pipeline_owner = models.CharField(max_length=64, blank=True)
    pipeline_heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    submitted_at = models.DateTimeField(null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    apply_started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ChangeRequestQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-pk"]
        permissions = [
            ("approve_changerequest", "Can approve or reject others' changes"),
            ("apply_changerequest", "Can apply, rebase, roll back and resume changes"),
            ("override_changerequest", "Can submit or withdraw others' changes"),
            ("load_code_changerequest", "Can propose or approve flags that load code"),
        ]
        constraints = [
            # The deployment's lock: one change applying or verifying at a time.
            models.UniqueConstraint(
                fields=["deployment"],
                condition=models.Q(state__in=[s.value for s in LOCK_STATES]),
                name="changerequest_one_active_per_deployment",
            ),
        ]
        indexes = [models.Index(fields=["deployment", "state"])]

    def __str__(self) -> str:
        return f"change #{self.pk}: {self.title}"

    def get_absolute_url(self) -> str:
        return reverse("changes:detail", args=[self.pk])

    # --- the state machine (controlpanel.workflow.StateMachine) -----------------------------
    STATES = ChangeState
    TRANSITIONS = TRANSITIONS
    STAMPS = STAMPS
    NOUN = "Change"

    @property
    def is_finished(self) -> bool:
        return self.state_choice.finished

    @property
    def in_review(self) -> bool:
        return self.state in REVIEW_STATES

    @property
    def holds_lock(self) -> bool:
        return self.state in LOCK_STATES

    def is_stale(self, running_config_id: int | None = None) -> bool:
        """True when the deployment no longer runs the config this change was proposed
        against (someone applied another change meanwhile): review it again after a rebase."""
        if not self.in_review:
            return False
        if running_config_id is None:
            running_config_id = self.deployment.active_config_id
        return running_config_id != self.base_config_id

    def proposed_flat(self) -> dict:
        """The proposed config flattened like ``EngineConfig.flat`` (env.X, placement.X,
        model: the proposed one, else the base version's, so an unchanged model is no diff)."""
        base_model = self.base_config.model if self.base_config else ""
        return flat_config(self.settings, self.env, self.placement, self.model or base_model)

    def diff(self) -> dict[str, tuple]:
        """``{flag: (running value, proposed value)}`` for every flag that differs from the
        base config."""
        return flat_diff(self.base_config.flat() if self.base_config else {}, self.proposed_flat())

    @staticmethod
    def stale_after() -> timedelta:
        """How long a pipeline may stay silent before it counts as lost (``PIPELINE``)."""
        return PIPELINE.stale_after()

    def pipeline_alive(self) -> bool:
        """A worker stamped this change recently: its pipeline runs, so nobody else may
        resume it."""
        return PIPELINE.alive(self)

    def allowed_actions(self, user) -> set[str]:
        """What ``user`` may do with this change now, for the page's buttons (``rules``; the
        services check the same rules again under a row lock when the action comes)."""
        return rules.allowed_actions(user, self)

    def in_window(self, now=None) -> bool:
        now = now or timezone.now()
        if self.window_start and now < self.window_start:
            return False
        return not (self.window_end and now > self.window_end)

    def current_approvals(self):
        """The decisions of this round of review: those made against the current base."""
        return self.approvals.filter(base_config_id=self.base_config_id)

    def approvals_count(self) -> int:
        return self.current_approvals().filter(decision=Decision.APPROVE).count()


class Approval(ReviewDecision):
    """One reviewer's decision on a change, with their comment. One per reviewer per round of
    review: a round is the base config the change was reviewed against, so a rebase deletes
    nothing, and decisions made against an older base simply stop counting."""

    change = models.ForeignKey(ChangeRequest, on_delete=models.CASCADE, related_name="approvals")
    base_config = models.ForeignKey(
        "hosts.EngineConfig",
        null=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The running config the reviewer saw the change against.",
    )

    class Meta(ReviewDecision.Meta):
        constraints = [
            models.UniqueConstraint(
                fields=["change", "reviewer", "base_config"], name="approval_once_per_round"
            )
        ]

    def __str__(self) -> str:
        return f"{self.reviewer_name} {self.get_decision_display().lower()} #{self.change_id}"

    @property
    def decision_choice(self) -> Decision:
        return Decision(self.decision)


# The advisor's findings live in their own module; imported here so Django registers them.
from changes.models_findings import Finding  # noqa: E402, F401
from changes.models_sweeps import Sweep, SweepApproval, SweepLane, SweepTrial  # noqa: E402, F401

# How a worker claims a change's pipeline (controlpanel.workflow.Claim): while the change holds
# its deployment's lock.
PIPELINE = Claim("pipeline_owner", "pipeline_heartbeat_at", lambda change: change.holds_lock)
