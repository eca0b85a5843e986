"""Tuning sweeps: the best engine config under an SLO, predicted by the simulator for every
point of a search space and proven by real benchmarks on the deployment.

A ``Sweep`` is created with its SLO, load, space and budget; its predict phase
(``benchmarks.sweep``) runs at once because it touches nothing. A sweep that takes a
production-labelled host needs the approvals a change there needs, given to the sweep as a
whole (``SweepApproval``). Its trials (``SweepTrial``: the top predicted configs plus the
running config as the control) then run on one or more deployments of the same model and GPU
(``SweepLane``: one per deployment, holding it like a change holds its lock), each trial an
ordinary config version and ordinary benchmark runs; every lane puts its deployment's
original config back when it is done, cancelled or broken.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings as conf
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.urls import reverse
from django.utils import timezone

from changes.choices import (
    LANE_LOCK_STATES,
    Decision,
    LaneState,
    SweepState,
    TrialState,
)
from controlpanel.workflow import Claim, ReviewDecision, StateMachine

S = SweepState

SWEEP_TRANSITIONS: dict[SweepState, frozenset[SweepState]] = {
    S.PREDICTING: frozenset({S.PENDING, S.READY, S.FAILED, S.CANCELLED}),
    S.PENDING: frozenset({S.READY, S.REJECTED, S.CANCELLED}),
    # Back to review when a host it restarts was labelled production after it was approved.
    S.READY: frozenset({S.RUNNING, S.PENDING, S.CANCELLED}),
    S.RUNNING: frozenset({S.DONE, S.FAILED, S.CANCELLED}),
    S.DONE: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.REJECTED: frozenset(),
}
SWEEP_STAMPS = {
    S.READY: "decided_at",
    S.REJECTED: "decided_at",
    S.RUNNING: "started_at",
    S.DONE: "finished_at",
    S.FAILED: "finished_at",
    S.CANCELLED: "finished_at",
}


class Objective(models.TextChoices):
    TPS_PER_GPU = "tps_per_gpu", "Most output tokens/s per GPU at the SLO"
    COST_PER_MILLION = "cost_per_million", "Lowest cost per 1M output tokens at the SLO"


class LoadMode(models.TextChoices):
    RATE = "rate", "Request rate (open loop, req/s)"
    CONCURRENCY = "concurrency", "Concurrent users (closed loop)"


class Sweep(StateMachine, models.Model):
    """A search for the config that serves the most (or the cheapest) under an SLO on one
    deployment (and, in parallel, on its twins: same engine, model and GPUs).

    ``base_config`` is what the deployment ran when the sweep was made: the control trial,
    and where every lane goes back to. ``prediction`` is ``benchmarks.sweep.Prediction``'s
    dict; ``target`` what it was predicted for (simulator GPU key, GPU count, time scale of
    a simulated engine, the price per GPU-hour and where it came from)."""

    deployment = models.ForeignKey(
        "hosts.Deployment", on_delete=models.CASCADE, related_name="sweeps"
    )
    title = models.CharField(max_length=120)
    state = models.CharField(
        max_length=16, choices=SweepState.choices, default=SweepState.PREDICTING, db_index=True
    )
    created_by = models.ForeignKey(
        conf.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    objective = models.CharField(
        max_length=24, choices=Objective.choices, default=Objective.TPS_PER_GPU
    )
    load_profile = models.ForeignKey(
        "benchmarks.LoadProfile",
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Lengths, prefixes and request count of every trial's benchmarks.",
    )
    load_mode = models.CharField(max_length=16, choices=LoadMode.choices, default=LoadMode.RATE)
    space = models.JSONField(default=dict, help_text="{flag: [values]} as validated.")
    slo = models.JSONField(default=dict, help_text="benchmarks.sweep.Slo as a dict.")
    base_config = models.ForeignKey(
        "hosts.EngineConfig",
        null=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The running config when the sweep was made: the control trial.",
    )
    max_trials = models.PositiveSmallIntegerField(
        default=4,
        validators=[MinValueValidator(1), MaxValueValidator(30)],
        help_text="Real trials, the control included.",
    )
    max_minutes = models.PositiveIntegerField(
        default=60,
        validators=[MinValueValidator(2), MaxValueValidator(24 * 60)],
        help_text="Wall-time budget of the trials; trials not started by then are skipped.",
    )
    max_steps = models.PositiveSmallIntegerField(
        default=5,
        validators=[MinValueValidator(2), MaxValueValidator(12)],
        help_text="Benchmarks per trial in its search for the highest load meeting the SLO.",
    )
    required_approvals = models.PositiveSmallIntegerField(default=0)
    target = models.JSONField(default=dict, blank=True)
    prediction = models.JSONField(default=dict, blank=True)
    prediction_problem = models.CharField(max_length=500, blank=True)
    cancel_requested = models.BooleanField(default=False)
    winner = models.ForeignKey(
        "changes.SweepTrial", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    outcome = models.CharField(max_length=1000, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"sweep #{self.pk}: {self.title}"

    def get_absolute_url(self) -> str:
        return reverse("changes:sweep", args=[self.pk])

    # --- the state machine (controlpanel.workflow.StateMachine) -----------------------------
    STATES = SweepState
    TRANSITIONS = SWEEP_TRANSITIONS
    STAMPS = SWEEP_STAMPS
    NOUN = "Sweep"

    @property
    def is_finished(self) -> bool:
        return self.state_choice.finished

    @property
    def deadline(self):
        """When trials stop being started (the wall-time budget), once running."""
        if self.started_at is None:
            return None
        return self.started_at + timedelta(minutes=self.max_minutes)

    def approvals_count(self) -> int:
        return self.approvals.filter(decision=Decision.APPROVE).count()


class SweepLane(models.Model):
    """One deployment running a sweep's trials, and its way back: the config it ran before
    (``original_config``) is applied again when its trials end, whatever ended them. While
    queued or running it holds the deployment (``hosts.services.occupancy``; the partial
    unique index is the database's backstop)."""

    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="lanes")
    deployment = models.ForeignKey(
        "hosts.Deployment", on_delete=models.CASCADE, related_name="sweep_lanes"
    )
    original_config = models.ForeignKey(
        "hosts.EngineConfig", null=True, on_delete=models.PROTECT, related_name="+"
    )
    state = models.CharField(
        max_length=16, choices=LaneState.choices, default=LaneState.QUEUED, db_index=True
    )
    restore_operation = models.ForeignKey(
        "hosts.EngineOperation", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    owner = models.CharField(max_length=64, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    note = models.CharField(max_length=500, blank=True)
    restore_attempts = models.PositiveIntegerField(
        default=0, help_text="Restores tried while the host did not answer."
    )
    restore_next_at = models.DateTimeField(
        null=True, blank=True, help_text="When a pending restore is tried again."
    )

    class Meta:
        ordering = ["sweep", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["deployment"],
                condition=models.Q(state__in=[s.value for s in LANE_LOCK_STATES]),
                name="sweeplane_one_active_per_deployment",
            ),
            models.UniqueConstraint(fields=["sweep", "deployment"], name="sweeplane_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.sweep} on {self.deployment}"

    @property
    def holds_lock(self) -> bool:
        return self.state in LANE_LOCK_STATES

    def alive(self) -> bool:
        return LANE.alive(self)


# How a worker claims a sweep's lane (controlpanel.workflow.Claim): while it holds its
# deployment, except a restore pending, which is the lost-work sweep's to retry.
LANE = Claim(
    "owner",
    "heartbeat_at",
    lambda lane: lane.holds_lock and lane.state != LaneState.RESTORE_PENDING,
)


def lane_stale_after() -> timedelta:
    return LANE.stale_after()


class SweepTrial(models.Model):
    """One config of the sweep measured for real: applied as a config version of its lane's
    deployment, then benchmarked at a few loads (``runs``, ordinary runs in the history) to
    find the highest load that meets the SLO. ``predicted`` is the simulator's
    ``PointScore`` dict for the same settings; ``prediction_error`` the measured max load
    against the predicted one ((measured − predicted) / predicted)."""

    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="trials")
    index = models.PositiveSmallIntegerField(help_text="Order of the trial in the sweep (1, 2…).")
    is_control = models.BooleanField(default=False, help_text="The config running before.")
    point = models.JSONField(default=dict, help_text="The searched flags' values.")
    settings = models.JSONField(default=dict, help_text="The whole settings applied.")
    predicted = models.JSONField(default=dict, blank=True)
    predicted_rank = models.PositiveIntegerField(null=True, blank=True)
    state = models.CharField(
        max_length=16, choices=TrialState.choices, default=TrialState.QUEUED, db_index=True
    )
    lane = models.ForeignKey(
        SweepLane, null=True, blank=True, on_delete=models.SET_NULL, related_name="trials"
    )
    config = models.ForeignKey(
        "hosts.EngineConfig", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    operation = models.ForeignKey(
        "hosts.EngineOperation", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    runs = models.ManyToManyField("benchmarks.BenchmarkRun", blank=True, related_name="+")
    probes = models.JSONField(
        default=list, blank=True, help_text="[{load, run, ok, violations, margin, numbers}]"
    )
    max_load = models.FloatField(null=True, blank=True)
    met_slo = models.BooleanField(null=True, blank=True)
    numbers = models.JSONField(default=dict, blank=True, help_text="Measured at max_load.")
    objective_value = models.FloatField(null=True, blank=True)
    cost_per_million = models.FloatField(null=True, blank=True)
    prediction_error = models.FloatField(null=True, blank=True)
    note = models.CharField(max_length=500, blank=True)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["sweep", "index"]
        constraints = [
            models.UniqueConstraint(fields=["sweep", "index"], name="sweeptrial_unique_index")
        ]

    def __str__(self) -> str:
        return f"{self.sweep} trial {self.index}" + (" (control)" if self.is_control else "")

    @property
    def state_choice(self) -> TrialState:
        return TrialState(self.state)

    @property
    def is_finished(self) -> bool:
        return self.state_choice.finished

    @property
    def label(self) -> str:
        if self.is_control:
            return "control (running config)"
        return ", ".join(f"{k}={v}" for k, v in sorted(self.point.items())) or "—"


class SweepApproval(ReviewDecision):
    """A reviewer's decision on a sweep as a whole: its space, budget, load and the hosts it
    restarts. One per reviewer; the proposer never reviews their own sweep."""

    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="approvals")

    class Meta(ReviewDecision.Meta):
        constraints = [
            models.UniqueConstraint(fields=["sweep", "reviewer"], name="sweepapproval_once")
        ]

    def __str__(self) -> str:
        return f"{self.reviewer_name} {self.get_decision_display().lower()} sweep #{self.sweep_id}"
