"""Change workflows: propose, review, apply, verify, roll back.

Every verb takes the acting user first, checks the rules that no form may skip (the
four-eyes rule, the state machine, staleness, the deployment's lock) under a row lock, writes
the audit entry that is also the change's timeline, and publishes it to the change's page.
The apply pipeline runs on a worker (``tasks.apply_change``, pk only) and records each stage.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import timedelta

import httpx
from django.conf import settings as conf
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, close_old_connections, transaction
from django.urls import reverse
from django.utils import timezone

from benchmarks import records as request_records
from benchmarks.models import BenchmarkRun, LoadProfile, RunRequestLog
from benchmarks.services import runs as benchmark_runs
from changes import advice
from changes.choices import LOCK_STATES, ChangeKind, ChangeState, Decision, Stage, StageStatus
from changes.models import Approval, ChangeRequest
from controlpanel.choices import OperationStatus
from controlpanel.models import AuditEntry, InvalidTransition
from controlpanel.realtime import group_name, publish
from controlpanel.services import audit
from hosts import services as host_services
from hosts.choices import OperationOutcome
from hosts.engines import get_spec
from hosts.engines.launch import LaunchConfig, LaunchError, Placement
from hosts.engines.metrics import endpoints
from hosts.models import ACTIVE_STATUSES, Deployment, EngineConfig, EngineOperation

log = logging.getLogger(__name__)
S = ChangeState


class ChangeRefused(Exception):
    """A change action the rules do not allow now; the message says why and what to do."""


# --- facts for reviewers -----------------------------------------------------------------------
def validate_proposal(deployment: Deployment, settings: dict, env: dict, placement: dict) -> dict:
    """The settings as the engine's flag spec for the deployment's version accepts them, or
    ChangeRefused naming every refused field (nothing malicious reaches a command line)."""
    try:
        launch = LaunchConfig(
            engine=deployment.engine,
            model=deployment.model,
            settings=dict(settings),
            engine_version=deployment.engine_version or None,
            env=dict(env or {}),
            placement=Placement(placement.get("numa_node"), placement.get("cpus"))
            if placement
            else None,
            port=deployment.port,
            runner=deployment.runner,
            simulator=dict(deployment.simulator or {}),
        ).validated(gpu_count=_gpu_count(deployment))
    except LaunchError as exc:
        raise ChangeRefused(str(exc)) from None
    return {
        "settings": launch.settings,
        "env": launch.env,
        "placement": launch.placement.to_dict() if launch.placement else {},
    }


def _gpu_count(deployment: Deployment) -> int | None:
    if deployment.runner == "simulator":
        return int((deployment.simulator or {}).get("num_gpus") or 1)
    count = deployment.host.gpus.count()
    return count or None


def _gpu_facts(deployment: Deployment) -> tuple[str | None, int, int | None]:
    """``(simulator GPU key, GPU count, one GPU's memory)`` for predictions and warnings."""
    if deployment.runner == "simulator":
        from hosts.simulator.catalog import GPUS

        key = (deployment.simulator or {}).get("gpu") or "h100-sxm"
        spec = GPUS.get(key)
        return key, _gpu_count(deployment) or 1, spec.memory_bytes if spec else None
    gpu = deployment.gpus.first() or deployment.host.gpus.first()
    if gpu is None:
        return None, 1, None
    return advice.gpu_key(gpu.name), _gpu_count(deployment) or 1, gpu.memory_bytes


def observed_p99_tokens(deployment: Deployment) -> int | None:
    """p99 of prompt + output tokens over the requests of the deployment's latest successful
    benchmark: what the real (or profiled) traffic needs from ``max_model_len``."""
    run = (
        BenchmarkRun.objects.filter(deployment=deployment, status=OperationStatus.SUCCEEDED)
        .order_by("-created_at")
        .only("pk")
        .first()
    )
    if run is None:
        return None
    blob = RunRequestLog.objects.filter(run=run).values_list("data", flat=True).first()
    if not blob:
        return None
    sizes = sorted(
        (row["prompt_tokens"] or row["input_len"] or 0) + (row["output_tokens"] or 0)
        for row in request_records.iter_rows(bytes(blob))
        if row["error_class"] is None
    )
    if not sizes:
        return None
    return sizes[max(0, -(-99 * len(sizes) // 100) - 1)]


def review_facts(
    deployment: Deployment,
    base: EngineConfig | None,
    proposal: dict,
    profile: LoadProfile | None = None,
) -> dict:
    """Diff, warnings and (when the simulator models it) the predicted impact of a proposal."""
    change = ChangeRequest(deployment=deployment, base_config=base, **proposal)
    diff = change.diff()
    gpu, num_gpus, gpu_memory = _gpu_facts(deployment)
    warnings = advice.warnings_for(
        deployment.engine,
        diff,
        proposal["settings"],
        engine_version=deployment.engine_version or None,
        model=deployment.model,
        gpu_memory_bytes=gpu_memory,
        observed_p99_tokens=observed_p99_tokens(deployment),
    )
    prediction: dict = {}
    if profile is not None:
        if gpu is None:
            prediction = {"available": False, "reason": "The host's GPUs are not known yet."}
        else:
            prediction = advice.predicted_impact(
                deployment.engine,
                deployment.model,
                base.settings if base else {},
                proposal["settings"],
                gpu,
                num_gpus,
                profile.spec,
            )
        prediction["profile"] = str(profile)
    return {
        "diff": diff,
        "warnings": [w.to_dict() for w in warnings],
        "prediction": prediction,
    }


def required_approvals(deployment: Deployment) -> int:
    """Two approvals for production-labelled hosts (CHANGE_PRODUCTION_LABEL), else one."""
    key, _, value = conf.CHANGE_PRODUCTION_LABEL.partition("=")
    labels = deployment.host.labels or {}
    if key and labels.get(key) == value:
        return conf.CHANGE_PRODUCTION_APPROVALS
    return 1


# --- the timeline ------------------------------------------------------------------------------
def record(
    actor,
    change: ChangeRequest,
    action: str,
    *,
    before: dict | None = None,
    after: dict | None = None,
) -> AuditEntry:
    """Append an audit entry on the change (its timeline) and push it to the change's page."""
    entry = audit(actor, f"change.{action}", change, before=before, after=after)
    event = timeline_item(entry)

    def push():
        publish(group_name("change", change.pk), "change.event", event)

    transaction.on_commit(push)
    return entry


def timeline(change: ChangeRequest) -> list[dict]:
    from django.contrib.contenttypes.models import ContentType

    entries = AuditEntry.objects.filter(
        content_type=ContentType.objects.get_for_model(ChangeRequest), object_id=str(change.pk)
    ).order_by("created_at", "pk")
    return [timeline_item(e) for e in entries]


def timeline_item(entry: AuditEntry) -> dict:
    after = entry.after or {}
    before = entry.before or {}
    action = entry.action.removeprefix("change.")
    item = {
        "id": entry.pk,
        "at": entry.created_at.isoformat(),
        "who": entry.actor_name or "system",
        "action": action,
        "before": before,
        "after": after,
    }
    if action == "stage":
        stage, status = Stage(after["stage"]), StageStatus(after["status"])
        item.update(
            title=f"{stage.label}: {status.label.lower()}",
            colour=status.colour,
            message=after.get("message", ""),
            detail=after.get("detail", ""),
            link=after.get("link"),
        )
    elif action == "transition":
        state = ChangeState(after["state"])
        item.update(
            title=f"{ChangeState(before['state']).label} → {state.label}",
            colour=state.colour,
            message=after.get("reason", ""),
        )
    else:
        titles = {
            "propose": "Proposed",
            "approve": "Approved",
            "reject": "Rejected",
            "comment": "Comment",
            "rebase": "Rebased onto the running config",
            "apply": "Apply requested",
            "resume": "Pipeline resumed",
            "rollback_request": "Rollback requested",
            "notify": "Notification",
        }
        item.update(
            title=titles.get(action, action),
            colour={"approve": "green", "reject": "red"}.get(action, "grey"),
            message=after.get("comment") or after.get("text") or after.get("message") or "",
        )
    return item


def _transition(actor, change: ChangeRequest, state: ChangeState, reason: str = "") -> None:
    before = change.transition_to(state)
    after = {"state": state.value}
    if reason:
        after["reason"] = reason
    record(actor, change, "transition", before={"state": before.value}, after=after)
    data = {"id": change.pk, "state": state.value, "label": state.label, "colour": state.colour}
    transaction.on_commit(lambda: publish(group_name("change", change.pk), "change.state", data))
    if state in NOTIFY_ON:
        from changes import tasks

        transaction.on_commit(lambda: tasks.notify_change.delay(change.pk, state.value))


NOTIFY_ON = {S.PENDING, S.APPROVED, S.REJECTED, S.APPLIED, S.ROLLED_BACK, S.FAILED}


def _locked(change: ChangeRequest) -> ChangeRequest:
    return (
        ChangeRequest.objects.select_for_update(of=("self",))
        .select_related("deployment__host", "base_config", "proposed_by")
        .get(pk=change.pk)
    )


def _stale_message(change: ChangeRequest) -> str:
    running = change.deployment.active_config
    was = f"v{change.base_config.version}" if change.base_config else "no config"
    now = f"v{running.version}" if running else "no config"
    return (
        f"The deployment's running config changed since this change was proposed ({was} → "
        f"{now}): rebase it onto the running config and have it reviewed again."
    )


# --- propose -----------------------------------------------------------------------------------
def propose_change(
    actor,
    deployment: Deployment,
    *,
    title: str,
    rationale: str,
    settings: dict,
    env: dict | None = None,
    placement: dict | None = None,
    verify_profile: LoadProfile | None = None,
    baseline_run: BenchmarkRun | None = None,
    thresholds: dict | None = None,
    window: tuple | None = None,
    submit: bool = True,
    kind: str = ChangeKind.SETTINGS,
    target_config: EngineConfig | None = None,
) -> ChangeRequest:
    """Record a proposed change against the deployment's running config (draft, or pending
    review when ``submit``). Settings are validated against the engine's flag spec first."""
    proposal = validate_proposal(deployment, settings, env or {}, placement or {})
    base = deployment.active_config
    facts = review_facts(deployment, base, proposal, verify_profile)
    if not facts["diff"]:
        raise ChangeRefused("Nothing differs from the running config: there is nothing to review.")
    if baseline_run is not None and (
        baseline_run.deployment_id != deployment.pk
        or baseline_run.status != OperationStatus.SUCCEEDED
    ):
        raise ChangeRefused("The baseline must be a successful run of this deployment.")
    start, end = window or (None, None)
    if start and end and end <= start:
        raise ChangeRefused("The maintenance window must end after it starts.")
    with transaction.atomic():
        change = ChangeRequest.objects.create(
            deployment=deployment,
            kind=kind,
            title=title,
            rationale=rationale,
            proposed_by=actor,
            base_config=base,
            target_config=target_config,
            warnings=facts["warnings"],
            prediction=facts["prediction"],
            required_approvals=required_approvals(deployment),
            verify_profile=verify_profile,
            baseline_run=baseline_run,
            window_start=start,
            window_end=end,
            **proposal,
            **(thresholds or {}),
        )
        record(
            actor,
            change,
            "propose",
            before={"config_version": base.version if base else None},
            after={
                "kind": kind,
                "diff": {k: list(v) for k, v in facts["diff"].items()},
                "warnings": [w["code"] for w in facts["warnings"]],
                "text": rationale,
            },
        )
        if submit:
            _transition(actor, change, S.PENDING)
    return change


def propose_rollback(
    actor, target: EngineConfig, *, rationale: str, verify_profile=None
) -> ChangeRequest:
    """Propose going back to an earlier version of a deployment's config, as a change that is
    reviewed like any other."""
    deployment = target.deployment
    if deployment.active_config_id == target.pk:
        raise ChangeRefused(f"{deployment} already runs v{target.version}.")
    return propose_change(
        actor,
        deployment,
        title=f"Roll back to v{target.version}",
        rationale=rationale,
        settings=target.settings,
        env=target.env,
        placement=target.placement,
        verify_profile=verify_profile,
        kind=ChangeKind.ROLLBACK,
        target_config=target,
    )


def submit_change(actor, change: ChangeRequest) -> ChangeRequest:
    with transaction.atomic():
        change = _locked(change)
        _only_proposer(actor, change, "submit")
        if change.is_stale():
            raise ChangeRefused(_stale_message(change))
        _guard(lambda: _transition(actor, change, S.PENDING))
    return change


def _guard(action):
    try:
        action()
    except InvalidTransition as exc:
        raise ChangeRefused(str(exc)) from None


def _only_proposer(actor, change: ChangeRequest, verb: str) -> None:
    if actor.pk != change.proposed_by_id and not actor.has_perm("changes.delete_changerequest"):
        raise PermissionDenied(f"Only the proposer (or an Admin) may {verb} change #{change.pk}.")


# --- review ------------------------------------------------------------------------------------
def _reviewer(actor, change: ChangeRequest) -> None:
    """The four-eyes rule, enforced here whatever the page showed."""
    if not actor.has_perm("changes.approve_changerequest"):
        raise PermissionDenied("Only Approvers and Admins review changes.")
    if actor.pk == change.proposed_by_id:
        raise PermissionDenied(
            f"You proposed change #{change.pk}: someone else must review it (four-eyes rule)."
        )


def approve_change(actor, change: ChangeRequest, comment: str = "") -> ChangeRequest:
    return _decide(actor, change, Decision.APPROVE, comment)


def reject_change(actor, change: ChangeRequest, comment: str) -> ChangeRequest:
    if not comment.strip():
        raise ChangeRefused("Say why the change is rejected.")
    return _decide(actor, change, Decision.REJECT, comment)


def _decide(actor, change: ChangeRequest, decision: Decision, comment: str) -> ChangeRequest:
    with transaction.atomic():
        change = _locked(change)
        _reviewer(actor, change)
        if change.state != S.PENDING:
            raise ChangeRefused(
                f"Change #{change.pk} is {change.state_choice.label.lower()}: only changes "
                "pending review can be approved or rejected."
            )
        if change.is_stale():
            raise ChangeRefused(_stale_message(change))
        if change.current_approvals().filter(reviewer=actor).exists():
            raise ChangeRefused("You already reviewed this version of the change.")
        Approval.objects.create(
            change=change,
            reviewer=actor,
            reviewer_name=actor.get_username(),
            decision=decision,
            comment=comment,
            base_config=change.base_config,
        )
        count = change.approvals_count()
        record(
            actor,
            change,
            decision.value,
            after={
                "comment": comment,
                "approvals": count,
                "required": change.required_approvals,
            },
        )
        if decision == Decision.REJECT:
            _transition(actor, change, S.REJECTED, comment)
        elif count >= change.required_approvals:
            _transition(actor, change, S.APPROVED)
    return change


def withdraw_change(actor, change: ChangeRequest, reason: str = "") -> ChangeRequest:
    with transaction.atomic():
        change = _locked(change)
        _only_proposer(actor, change, "withdraw")
        _guard(lambda: _transition(actor, change, S.WITHDRAWN, reason))
    return change


def comment_on_change(actor, change: ChangeRequest, text: str) -> AuditEntry:
    text = text.strip()
    if not text:
        raise ChangeRefused("The comment is empty.")
    with transaction.atomic():
        return record(actor, change, "comment", after={"text": text[:5000]})


def rebase_change(actor, change: ChangeRequest) -> ChangeRequest:
    """Re-base a stale change on the running config: the diff, warnings and prediction are
    computed again, and approvals given against the old base no longer count."""
    with transaction.atomic():
        change = _locked(change)
        if not (
            actor.pk == change.proposed_by_id or actor.has_perm("changes.change_changerequest")
        ):
            raise PermissionDenied("Operators and the proposer rebase changes.")
        if not change.is_stale():
            raise ChangeRefused(f"Change #{change.pk} is not stale: nothing to rebase.")
        deployment = Deployment.objects.select_related("active_config").get(pk=change.deployment_id)
        old, new = change.base_config, deployment.active_config
        proposal = {"settings": change.settings, "env": change.env, "placement": change.placement}
        facts = review_facts(deployment, new, proposal, change.verify_profile)
        if not facts["diff"]:
            raise ChangeRefused(
                f"The running config v{new.version} already has every proposed setting: "
                "withdraw this change instead."
            )
        change.base_config = new
        change.warnings = facts["warnings"]
        change.prediction = facts["prediction"]
        if change.baseline_run and change.baseline_run.engine_config_id != new.pk:
            change.baseline_run = None  # measured on a config that no longer runs
        change.save(
            update_fields=["base_config", "warnings", "prediction", "baseline_run", "updated_at"]
        )
        record(
            actor,
            change,
            "rebase",
            before={"config_version": old.version if old else None},
            after={
                "config_version": new.version if new else None,
                "diff": {k: list(v) for k, v in facts["diff"].items()},
            },
        )
        if change.state == S.APPROVED:
            _transition(actor, change, S.PENDING, "rebased: the approvals were for another base")
    return change


# --- apply -------------------------------------------------------------------------------------
def lock_holder(deployment: Deployment) -> ChangeRequest | None:
    """The change holding the deployment's lock (applying or verifying), if any."""
    return ChangeRequest.objects.filter(deployment=deployment, state__in=LOCK_STATES).first()


def apply_change(actor, change: ChangeRequest) -> ChangeRequest:
    """Start the apply pipeline of an approved change: one change per deployment at a time
    (row lock + partial unique index), only in its maintenance window, never on a stale base,
    never while an operation or benchmark runs on the engine."""
    from changes import tasks

    try:
        with transaction.atomic():
            Deployment.objects.select_for_update(of=("self",)).get(pk=change.deployment_id)
            change = _locked(change)
            if change.state != S.APPROVED:
                raise ChangeRefused(
                    f"Change #{change.pk} is {change.state_choice.label.lower()}: only approved "
                    "changes are applied."
                )
            if change.is_stale():
                raise ChangeRefused(_stale_message(change))
            holder = lock_holder(change.deployment)
            if holder is not None:
                raise ChangeRefused(_lock_message(holder))
            if not change.in_window():
                raise ChangeRefused(_window_message(change))
            busy = change.deployment.operations.filter(status__in=ACTIVE_STATUSES).first()
            if busy is not None:
                raise ChangeRefused(f"{busy} is under way: apply once the engine has settled.")
            run = change.deployment.benchmark_runs.filter(status__in=benchmark_runs.ACTIVE).first()
            if run is not None:
                raise ChangeRefused(f"{run} is measuring the engine: apply once it has finished.")
            change.applied_by = actor
            change.rollback_requested = False
            change.save(update_fields=["applied_by", "rollback_requested", "updated_at"])
            record(actor, change, "apply", after={"message": "apply pipeline queued"})
            _transition(actor, change, S.APPLYING)
            limit = pipeline_time_limit(change)
            transaction.on_commit(
                lambda: tasks.apply_change.apply_async(
                    (change.pk,), soft_time_limit=limit, time_limit=limit + 60
                )
            )
    except IntegrityError:
        holder = lock_holder(change.deployment)
        raise ChangeRefused(
            _lock_message(holder) if holder else "Another change just started applying."
        ) from None
    return change


def _lock_message(holder: ChangeRequest) -> str:
    return (
        f"{holder.deployment} is locked by change #{holder.pk} ({holder.title}), "
        f"{holder.state_choice.label.lower()}: one change at a time per deployment."
    )


def _window_message(change: ChangeRequest) -> str:
    fmt = "%Y-%m-%d %H:%M %Z"
    start = timezone.localtime(change.window_start).strftime(fmt) if change.window_start else "—"
    end = timezone.localtime(change.window_end).strftime(fmt) if change.window_end else "—"
    return f"Outside the change's maintenance window ({start} to {end})."


def pipeline_time_limit(change: ChangeRequest) -> int:
    """Seconds the pipeline may take: two benchmarks, the apply and a rollback, with margin."""
    operation = host_services_operation_limit()
    bench = benchmark_runs.time_limit_for(change.verify_profile) if change.verify_profile else 0
    return int(2 * bench + 2 * operation + conf.CHANGE_HEALTH_TIMEOUT + 300)


def host_services_operation_limit() -> int:
    from hosts.tasks import OPERATION_SOFT_LIMIT

    return OPERATION_SOFT_LIMIT


def request_rollback(actor, change: ChangeRequest, reason: str) -> ChangeRequest:
    """Ask for a roll back of a change that is applying or verifying, e.g. after its worker
    was lost: the pipeline (resumed now when none is alive) restores the snapshot config. A
    benchmark of the change that is running is cancelled, so the answer comes within seconds."""
    with transaction.atomic():
        change = _locked(change)
        if not change.holds_lock:
            raise ChangeRefused(
                f"Change #{change.pk} is {change.state_choice.label.lower()}: only a change "
                "being applied can be rolled back this way (propose a rollback change instead)."
            )
        change.rollback_requested = True
        change.save(update_fields=["rollback_requested", "updated_at"])
        record(actor, change, "rollback_request", after={"message": reason or "by hand"})
    for run in (change.baseline_run, change.verification_run):
        if run is not None and run.cancellable:
            try:
                benchmark_runs.cancel_benchmark(actor, run)
            except benchmark_runs.RunRefused:
                pass  # it just finished: the pipeline sees the flag next
    if not change.pipeline_alive():
        resume_change(actor, change, quiet=True)
    return change


def resume_change(actor, change: ChangeRequest, *, quiet: bool = False) -> ChangeRequest:
    """Start the pipeline again for a change whose worker was lost (no heartbeat): it picks up
    after the last stage it finished, so the host ends on a known config with a record."""
    from changes import tasks

    with transaction.atomic():
        change = _locked(change)
        if not change.holds_lock:
            raise ChangeRefused(
                f"Change #{change.pk} is {change.state_choice.label.lower()}: nothing to resume."
            )
        if change.pipeline_alive():
            raise ChangeRefused(
                f"The pipeline of change #{change.pk} is alive (last heartbeat "
                f"{timezone.localtime(change.pipeline_heartbeat_at):%H:%M:%S}): it goes on."
            )
        if not quiet:
            record(actor, change, "resume", after={"message": f"after stage {change.stage}"})
        limit = pipeline_time_limit(change)
        transaction.on_commit(
            lambda: tasks.apply_change.apply_async(
                (change.pk,), soft_time_limit=limit, time_limit=limit + 60
            )
        )
    return change


def resume_lost_pipelines() -> list[ChangeRequest]:
    """Beat's sweep: a change being applied whose pipeline stopped stamping it (its worker
    machine died and the broker has not redelivered yet) is resumed, so it reaches a known
    end without waiting for someone to notice. Pipelines that never started are left alone:
    their task may only be waiting for a free worker."""
    cutoff = timezone.now() - ChangeRequest.stale_after() - timedelta(seconds=60)
    lost = ChangeRequest.objects.filter(
        state__in=LOCK_STATES, pipeline_heartbeat_at__lt=cutoff
    ).select_related("deployment")
    resumed = []
    for change in lost:
        try:
            resumed.append(resume_change(None, change))
        except ChangeRefused:
            continue  # it finished or came back to life meanwhile
    return resumed


# --- the pipeline (on a worker) ----------------------------------------------------------------
class PipelineLost(Exception):
    """Another worker holds the change's pipeline."""


def _stage(change: ChangeRequest, stage: Stage, status: StageStatus, message: str = "", **extra):
    change.stage = stage.value
    change.pipeline_heartbeat_at = timezone.now()
    change.save(update_fields=["stage", "pipeline_heartbeat_at", "updated_at"])
    after = {"stage": stage.value, "status": status.value, "message": message[:2000]}
    after.update({k: v for k, v in extra.items() if v not in (None, "")})
    actor = change.applied_by if stage == Stage.SNAPSHOT else None
    with transaction.atomic():
        record(actor, change, "stage", after=after)


class Heartbeat:
    """Stamps the change every few seconds from a thread while its pipeline runs, so a resume
    can tell a live pipeline (busy in a long benchmark) from a lost one."""

    def __init__(self, change_pk: int, owner: str):
        self.change_pk, self.owner = change_pk, owner
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"change-{change_pk}", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self):
        try:
            while not self._stop.wait(conf.CHANGE_HEARTBEAT_SECONDS):
                ChangeRequest.objects.filter(pk=self.change_pk, pipeline_owner=self.owner).update(
                    pipeline_heartbeat_at=timezone.now()
                )
        except Exception:  # noqa: BLE001 - a missed beat only makes a resume possible sooner
            log.warning("heartbeat of change %s stopped", self.change_pk, exc_info=True)
        finally:
            close_old_connections()


def claim(change_pk: int, owner: str, wait_s: float | None = None) -> ChangeRequest | None:
    """Take the change's pipeline for ``owner``. A claim whose heartbeat is fresh belongs to a
    live worker: wait (a redelivery right after a crash) up to ``wait_s``, then give up."""
    if wait_s is None:
        wait_s = ChangeRequest.stale_after().total_seconds() + conf.CHANGE_HEARTBEAT_SECONDS
    deadline = time.monotonic() + wait_s
    while True:
        with transaction.atomic():
            change = ChangeRequest.objects.select_for_update().filter(pk=change_pk).first()
            if change is None or not change.holds_lock:
                return None
            if change.pipeline_owner in ("", owner) or not change.pipeline_alive():
                change.pipeline_owner = owner
                change.pipeline_heartbeat_at = timezone.now()
                change.save(update_fields=["pipeline_owner", "pipeline_heartbeat_at"])
                return change
        if time.monotonic() >= deadline:
            return None
        time.sleep(1)


def run_pipeline(change_pk: int, owner: str | None = None) -> ChangeRequest | None:
    """The worker's part: claim the change, then run (or resume) its stages."""
    owner = owner or uuid.uuid4().hex
    change = claim(change_pk, owner)
    if change is None:
        return None
    with Heartbeat(change.pk, owner):
        _pipeline(
            ChangeRequest.objects.select_related(
                "deployment__host", "base_config", "snapshot_config", "applied_config"
            ).get(pk=change.pk)
        )
    change.refresh_from_db()
    return change


def _pipeline(change: ChangeRequest) -> None:
    deployment = change.deployment
    if change.rollback_requested:
        return _rollback(change, "a rollback was requested while the change was being applied")

    # 1. Snapshot: the last good config, where any rollback goes.
    if change.snapshot_config_id is None:
        _stage(change, Stage.SNAPSHOT, StageStatus.STARTED)
        deployment.refresh_from_db()
        running = deployment.active_config
        if running is None and change.base_config_id is not None:
            return _finish(change, S.FAILED, "The deployment has no running config to return to.")
        if deployment.active_config_id != change.base_config_id:
            message = _stale_message(change) + " Nothing was changed."
            _stage(change, Stage.SNAPSHOT, StageStatus.FAILED, message)
            return _finish(change, S.FAILED, message)
        change.snapshot_config = running
        change.save(update_fields=["snapshot_config"])
        _stage(
            change,
            Stage.SNAPSHOT,
            StageStatus.SUCCEEDED,
            f"v{running.version} is the last good config" if running else "no config yet",
            detail=_settings_text(running.flat() if running else {}),
        )

    # 2. Baseline: the same load on the running config, unless a baseline run was chosen.
    if change.verify_profile_id and change.applied_config_id is None:
        baseline = change.baseline_run
        if baseline is None or baseline.status != OperationStatus.SUCCEEDED:
            _stage(change, Stage.BASELINE, StageStatus.STARTED, str(change.verify_profile))
            baseline, refused = _benchmark(change, "baseline")
            if baseline is None or baseline.status != OperationStatus.SUCCEEDED:
                message = refused or f"the baseline benchmark {baseline.status}: {baseline.error}"
                _stage(change, Stage.BASELINE, StageStatus.FAILED, message, link=_link(baseline))
                return _finish(change, S.FAILED, message + " Nothing was changed.")
            _stage(
                change,
                Stage.BASELINE,
                StageStatus.SUCCEEDED,
                _run_numbers(baseline),
                link=_link(baseline),
            )
        else:
            _stage(
                change,
                Stage.BASELINE,
                StageStatus.SKIPPED,
                f"using {baseline} as the baseline",
                link=_link(baseline),
            )

    if _rollback_asked(change):
        return _rollback(change, "a rollback was requested before the apply")

    # 3. Apply: the proposed settings become the deployment's next config version.
    if change.applied_config_id is None:
        _stage(change, Stage.APPLY, StageStatus.STARTED)
        if change.kind == ChangeKind.ROLLBACK and change.target_config_id:
            config = change.target_config
            message = f"going back to v{config.version}"
        else:
            config = EngineConfig.objects.create_next(
                deployment,
                change.settings,
                env=change.env,
                placement=change.placement,
                created_by=change.proposed_by,
                note=f"change #{change.pk}: {change.title}"[:200],
            )
            message = f"created v{config.version}"
        change.applied_config = config
        change.save(update_fields=["applied_config"])
        _stage(change, Stage.APPLY, StageStatus.SUCCEEDED, message)
    config = change.applied_config

    # 4. Restart the engine with it (on the host: stop, start, wait for ready; the agent or
    #    the SSH transport restarts the previous config itself when the new one fails).
    if change.state == S.APPLYING:
        operation = change.operation
        if operation is None:
            _stage(change, Stage.RESTART, StageStatus.STARTED, f"v{config.version}")
            try:
                operation = host_services.request_operation(
                    change.applied_by, deployment, "apply", config, enqueue=False
                )
            except host_services.OperationRefused as exc:
                message = f"{exc} Nothing was changed."
                _stage(change, Stage.RESTART, StageStatus.FAILED, message)
                return _finish(change, S.FAILED, message)
            change.operation = operation
            change.save(update_fields=["operation"])
        operation = _run_inline(operation)
        if operation.outcome != OperationOutcome.READY:
            message = operation.error or operation.get_outcome_display()
            _stage(
                change,
                Stage.RESTART,
                StageStatus.FAILED,
                f"v{config.version} did not start: {message}",
                detail=operation.engine_log[-4000:],
                link=reverse("hosts:operation", args=[operation.pk]),
            )
            if operation.outcome == OperationOutcome.ROLLED_BACK:
                # The host already restarted the previous config: say so, don't do it twice.
                snapshot = change.snapshot_config
                _stage(
                    change,
                    Stage.ROLLBACK,
                    StageStatus.SUCCEEDED,
                    f"the host restarted the last good config v{snapshot.version}"
                    if snapshot
                    else "the host restarted the previous engine",
                )
                return _finish(
                    change, S.ROLLED_BACK, f"v{config.version} failed to start: {message}"
                )
            return _rollback(change, f"v{config.version} failed to start: {message}")
        _stage(
            change,
            Stage.RESTART,
            StageStatus.SUCCEEDED,
            f"the engine runs v{config.version}",
            detail="\n".join(operation.engine_log.splitlines()[-10:]),
        )

        # 5. Health: the panel's own look at the engine, from where benchmarks reach it.
        _stage(change, Stage.HEALTH, StageStatus.STARTED, deployment.engine_url)
        problem = health_problem(deployment)
        if problem:
            _stage(change, Stage.HEALTH, StageStatus.FAILED, problem)
            return _rollback(change, f"the engine is not healthy on v{config.version}: {problem}")
        _stage(change, Stage.HEALTH, StageStatus.SUCCEEDED, "/health and /v1/models answer")
        if change.verify_profile_id:
            with transaction.atomic():
                _transition(None, change, S.VERIFYING)

    if _rollback_asked(change):
        return _rollback(change, "a rollback was requested while the change was being applied")

    # 6. Verify under the same load, 7. compare with the baseline.
    if change.verify_profile_id:
        run = change.verification_run
        if run is None or run.status != OperationStatus.SUCCEEDED:
            _stage(change, Stage.VERIFY, StageStatus.STARTED, str(change.verify_profile))
            run, refused = _benchmark(change, "verification")
            if _rollback_asked(change):
                return _rollback(change, "a rollback was requested during the verification")
            if run is None or run.status != OperationStatus.SUCCEEDED:
                message = refused or f"the verification benchmark {run.status}: {run.error}"
                _stage(change, Stage.VERIFY, StageStatus.FAILED, message, link=_link(run))
                return _rollback(change, message)
            _stage(change, Stage.VERIFY, StageStatus.SUCCEEDED, _run_numbers(run), link=_link(run))
        _stage(change, Stage.COMPARE, StageStatus.STARTED)
        result = advice.verdict(
            _numbers(change.baseline_run),
            _numbers(run),
            advice.Thresholds(
                change.max_error_rate_increase,
                change.max_ttft_p95_regression,
                change.max_itl_p95_regression,
            ),
        )
        change.comparison = result
        change.save(update_fields=["comparison"])
        link = _compare_link(change.baseline_run, run)
        if result["regressed"]:
            message = "regression: " + result["reason"]
            _stage(change, Stage.COMPARE, StageStatus.FAILED, message, link=link)
            return _rollback(change, message)
        _stage(change, Stage.COMPARE, StageStatus.SUCCEEDED, _verdict_text(result), link=link)
    else:
        _stage(change, Stage.VERIFY, StageStatus.SKIPPED, "no verification profile chosen")
    _stage(change, Stage.DONE, StageStatus.SUCCEEDED, f"{deployment} runs v{config.version}")
    return _finish(change, S.APPLIED, f"{deployment} runs v{config.version}")


def _rollback_asked(change: ChangeRequest) -> bool:
    change.refresh_from_db(fields=["rollback_requested"])
    return change.rollback_requested


def _run_inline(operation: EngineOperation) -> EngineOperation:
    """Run (or, after a lost worker, close) an apply here on the pipeline's worker."""
    if not operation.is_finished:
        host_services.run_operation(
            EngineOperation.objects.select_related(
                "deployment__host", "config", "previous_config", "requested_by"
            ).get(pk=operation.pk)
        )
    operation.refresh_from_db()
    return operation


def _rollback(change: ChangeRequest, reason: str) -> None:
    """Put the snapshot (last good) config back and record how that went."""
    snapshot = change.snapshot_config
    if snapshot is None:
        _stage(change, Stage.ROLLBACK, StageStatus.SKIPPED, "nothing was applied yet")
        return _finish(change, S.FAILED, reason + " Nothing had been changed.")
    deployment = change.deployment
    deployment.refresh_from_db()
    operation = change.rollback_operation
    if operation is None:
        if deployment.active_config_id == snapshot.pk and change.operation_id is None:
            _stage(change, Stage.ROLLBACK, StageStatus.SKIPPED, "the engine was never restarted")
            return _finish(change, S.ROLLED_BACK, reason)
        _stage(
            change, Stage.ROLLBACK, StageStatus.STARTED, f"back to v{snapshot.version}: {reason}"
        )
        try:
            operation = host_services.request_operation(
                None, deployment, "apply", snapshot, enqueue=False
            )
        except host_services.OperationRefused as exc:
            message = f"{reason}; the rollback could not start: {exc}"
            _stage(change, Stage.ROLLBACK, StageStatus.FAILED, message)
            return _finish(change, S.FAILED, message)
        change.rollback_operation = operation
        change.save(update_fields=["rollback_operation"])
    operation = _run_inline(operation)
    if operation.outcome == OperationOutcome.READY:
        _stage(
            change, Stage.ROLLBACK, StageStatus.SUCCEEDED, f"the engine runs v{snapshot.version}"
        )
        return _finish(change, S.ROLLED_BACK, reason)
    message = (
        f"{reason}; the rollback to v{snapshot.version} failed too: "
        f"{operation.error or operation.get_outcome_display()}"
    )
    _stage(
        change,
        Stage.ROLLBACK,
        StageStatus.FAILED,
        message,
        detail=operation.engine_log[-4000:],
    )
    return _finish(change, S.FAILED, message)


def _finish(change: ChangeRequest, state: ChangeState, outcome: str) -> None:
    with transaction.atomic():
        locked = _locked(change)
        locked.outcome = outcome[:1000]
        locked.pipeline_owner = ""
        locked.save(update_fields=["outcome", "pipeline_owner", "updated_at"])
        _transition(None, locked, state, outcome[:1000])
    change.refresh_from_db()


def abandon(change_pk: int, error: str) -> None:
    """The pipeline itself broke (a bug, a time limit): record it, with what the host runs,
    so the change is never left applying without a word."""
    change = ChangeRequest.objects.select_related("deployment__host").get(pk=change_pk)
    if not change.holds_lock:
        return
    # What this pipeline ran inline has no task of its own to close it: close it here, or the
    # deployment would stay locked by a "running" operation or benchmark.
    for operation in (change.operation, change.rollback_operation):
        if operation is not None and not operation.is_finished:
            host_services.fail_operation(operation, f"the change's pipeline stopped: {error}")
    for run in (change.baseline_run, change.verification_run):
        if run is not None and not run.is_finished:
            benchmark_runs.fail_run(run, f"the change's pipeline stopped: {error}")
    state = "unknown"
    try:
        with host_services.transport_for(change.deployment.host, change.deployment) as transport:
            state = transport.engine_status(change.deployment.name).get("state", "unknown")
    except Exception:  # noqa: BLE001 - the record is what matters here
        log.warning("could not read the engine state for change %s", change_pk, exc_info=True)
    _stage(
        change,
        Stage(change.stage) if change.stage else Stage.APPLY,
        StageStatus.FAILED,
        f"{error}; the engine was found {state}",
    )
    _finish(
        change,
        S.FAILED,
        f"the pipeline stopped during {change.stage or 'the apply'}: {error}; the engine was "
        f"found {state} — resume is not possible, propose a rollback if needed",
    )


def health_problem(deployment: Deployment) -> str | None:
    """None when the engine answers /health and lists a model on /v1/models (within
    CHANGE_HEALTH_TIMEOUT), else what is wrong."""
    urls = endpoints(deployment.engine)
    key = deployment.api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    deadline = time.monotonic() + conf.CHANGE_HEALTH_TIMEOUT
    problem = "no answer"
    with httpx.Client(base_url=deployment.engine_url, headers=headers, timeout=5) as client:
        while True:
            try:
                health = client.get(urls.health)
                if health.status_code != 200:
                    problem = f"{urls.health} answered {health.status_code}"
                else:
                    models = client.get(urls.models)
                    if models.status_code != 200:
                        problem = f"{urls.models} answered {models.status_code}"
                    elif not models.json().get("data"):
                        problem = f"{urls.models} lists no model"
                    else:
                        return None
            except (httpx.HTTPError, ValueError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                return problem
            time.sleep(1)


BENCHMARK_FIELDS = {"baseline": "baseline_run", "verification": "verification_run"}


def _benchmark(change: ChangeRequest, purpose: str) -> tuple[BenchmarkRun | None, str]:
    """Run the change's verification profile on the engine now, inline on this worker (the
    run is an ordinary run: its page streams live and it joins the history). The run is on
    the change before it starts, so a rollback request can cancel it. ``(run, "")``, or
    ``(None, why it could not start)``."""
    field = BENCHMARK_FIELDS[purpose]
    earlier = getattr(change, field)
    if earlier is not None and not earlier.is_finished:
        # The pipeline's previous worker died during this run: it measured for nobody.
        benchmark_runs.fail_run(earlier, "the change's pipeline stopped during the run")
    try:
        run = benchmark_runs.start_benchmark(
            change.applied_by,
            change.deployment,
            change.verify_profile,
            label=f"change #{change.pk} {purpose}",
            enqueue=False,
        )
    except benchmark_runs.RunRefused as exc:
        return None, f"the {purpose} benchmark could not start: {exc}"
    setattr(change, field, run)
    change.save(update_fields=[field])
    try:
        benchmark_runs.execute_run(
            BenchmarkRun.objects.select_related(
                "deployment__host", "deployment__active_config", "engine_config", "load_profile"
            ).get(pk=run.pk)
        )
    except Exception as exc:  # noqa: BLE001 - recorded on the run, judged by the pipeline
        benchmark_runs.fail_run(run, f"{type(exc).__name__}: {exc}")
    run.refresh_from_db()
    return run, ""


NUMBERS = ("error_rate", "ttft_p95_ms", "itl_p95_ms", "output_tokens_per_s")


def _numbers(run: BenchmarkRun | None) -> dict:
    return {key: getattr(run, key) for key in NUMBERS} if run is not None else {}


def _run_numbers(run: BenchmarkRun) -> str:
    def ms(value):
        return "—" if value is None else f"{value:.0f} ms"

    rate = "—" if run.error_rate is None else f"{run.error_rate:.1%}"
    tput = "—" if run.output_tokens_per_s is None else f"{run.output_tokens_per_s:.0f} tok/s"
    return f"TTFT p95 {ms(run.ttft_p95_ms)}, ITL p95 {ms(run.itl_p95_ms)}, {tput}, errors {rate}"


def _verdict_text(result: dict) -> str:
    parts = []
    for check in result["checks"]:
        if check.get("change") is not None and check["metric"] != "error_rate":
            parts.append(f"{check['label']} {check['change']:+.0%}")
    if result.get("throughput_change") is not None:
        parts.append(f"output tok/s {result['throughput_change']:+.0%}")
    return "within limits: " + ", ".join(parts) if parts else "within limits"


def _link(run: BenchmarkRun | None) -> str:
    return run.get_absolute_url() if run is not None else ""


def _compare_link(a: BenchmarkRun | None, b: BenchmarkRun) -> str:
    if a is None or not a.pk or not b.pk:
        return ""
    return f"{reverse('benchmarks:compare')}?runs={a.pk}&runs={b.pk}"


def _settings_text(flat: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(flat.items()))


def spec_flags(deployment: Deployment):
    """The flags of the deployment's engine version, performance flags first."""
    spec = get_spec(deployment.engine)
    flags = spec.flags_for(deployment.engine_version or None)
    return sorted(flags, key=lambda f: (not f.performance, spec.flags.index(f)))
