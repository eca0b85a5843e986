"""Propose and review: every verb takes the acting user first, checks ``changes.rules`` under
the change's row lock, and writes the timeline entry (the audit log) of what it did."""

from __future__ import annotations

from django.db import transaction

from benchmarks.models import BenchmarkRun, LoadProfile, ProbeSet
from changes import rules
from changes.choices import ChangeKind, ChangeState, Decision
from changes.models import Approval, ChangeRequest
from changes.rules import ChangeRefused
from changes.services import config_history
from changes.services.facts import (
    required_approvals,
    review_facts,
    shown_diff,
    validate_proposal,
)
from changes.services.timeline import locked, record, transition
from controlpanel.choices import OperationStatus
from controlpanel.models import AuditEntry
from hosts.models import Deployment, EngineConfig

S = ChangeState


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
    finding=None,
    probe_set=None,
    model: str = "",
) -> ChangeRequest:
    """Record a proposed change against the deployment's running config (draft, or pending
    review when ``submit``). Settings are validated against the engine's flag spec first.
    ``finding``: the advisor finding it answers (of this deployment), shown to reviewers."""
    if finding is not None and finding.deployment_id != deployment.pk:
        raise ChangeRefused("That advisor finding is about another deployment.")
    proposal = validate_proposal(deployment, settings, env or {}, placement or {}, model)
    base = deployment.active_config
    facts = review_facts(deployment, base, proposal, verify_profile)
    _check_proposal(deployment, facts, baseline_run, window)
    rules.require_code_loading(actor, deployment.engine, facts["diff"])
    if probe_set is None and facts["quality"].get("set"):
        # It touches what the model answers: the quality probe verifies it (stages_quality).
        probe_set = ProbeSet.objects.get(pk=facts["quality"]["set"])
    start, end = window or (None, None)
    with transaction.atomic():
        change = ChangeRequest.objects.create(
            deployment=deployment,
            finding=finding,
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
            probe_set=probe_set,
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
                "diff": _diff_lists(facts["diff"]),
                "warnings": [w["code"] for w in facts["warnings"]],
                "text": rationale,
            },
        )
        if submit:
            transition(actor, change, S.PENDING)
    return change


def _check_proposal(deployment, facts: dict, baseline_run, window) -> None:
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


def _diff_lists(diff: dict) -> dict:
    """The diff as the timeline keeps it: secret values masked (it is read by every Viewer)."""
    return {k: list(v) for k, v in shown_diff(diff).items()}


def propose_rollback(
    actor, target: EngineConfig, *, rationale: str, verify_profile=None
) -> ChangeRequest:
    """Propose going back to an earlier version of a deployment's config, as a change that is
    reviewed like any other."""
    deployment = target.deployment
    problem = config_history.rollback_problem(target)
    if problem:
        raise ChangeRefused(problem)
    return propose_change(
        actor,
        deployment,
        title=f"Roll back to v{target.version}",
        rationale=rationale,
        settings=target.settings,
        env=target.env,
        placement=target.placement,
        model=target.model,
        verify_profile=verify_profile,
        kind=ChangeKind.ROLLBACK,
        target_config=target,
    )


def submit_change(actor, change: ChangeRequest) -> ChangeRequest:
    with transaction.atomic():
        change = locked(change)
        rules.require("submit", actor, change)
        transition(actor, change, S.PENDING)
    return change


def approve_change(actor, change: ChangeRequest, comment: str = "") -> ChangeRequest:
    """Approve; refused (``rules.start_problem``) when the simulator predicts the change would
    not start: that needs ``override_start_and_approve``."""
    return _decide(actor, change, Decision.APPROVE, comment)


def override_start_and_approve(actor, change: ChangeRequest, reason: str) -> ChangeRequest:
    """An Admin approves a change the simulator predicts would not start, saying why (the
    prediction may be wrong for this engine build); the override and its reason are audited
    on the change's timeline before the approval."""
    reason = reason.strip()
    if not reason:
        raise ChangeRefused("Say why you approve a change predicted not to start.")
    return _decide(actor, change, Decision.APPROVE, reason, override=True)


def reject_change(actor, change: ChangeRequest, comment: str) -> ChangeRequest:
    if not comment.strip():
        raise ChangeRefused("Say why the change is rejected.")
    return _decide(actor, change, Decision.REJECT, comment)


def _decide(
    actor, change: ChangeRequest, decision: Decision, comment: str, *, override: bool = False
) -> ChangeRequest:
    with transaction.atomic():
        change = locked(change)
        rules.require("approve_override" if override else decision.value, actor, change)
        if change.current_approvals().filter(reviewer=actor).exists():
            raise ChangeRefused("You already reviewed this version of the change.")
        if override:
            record(
                actor,
                change,
                "start_override",
                after={"text": comment, "problem": rules.start_problem(change)},
            )
        Approval.objects.create(
            change=change,
            reviewer=actor,
            reviewer_name=actor.get_username(),
            decision=decision,
            comment=comment,
            base_config=change.base_config,
        )
        recount_approvals(actor, change)
        count = change.approvals_count()
        after = {"comment": comment, "approvals": count, "required": change.required_approvals}
        record(actor, change, decision.value, after=after)
        if decision == Decision.REJECT:
            transition(actor, change, S.REJECTED, comment)
        elif count >= change.required_approvals:
            transition(actor, change, S.APPROVED)
    return change


def recount_approvals(actor, change: ChangeRequest) -> str | None:
    """Required approvals follow the host's labels as they are now, not as they were when
    the change was proposed: an Admin may label the host production in between (issue 38).
    Raises the change's count when the rule now asks for more, recorded; an approved change
    short of it goes back to review. Returns why, when it did. Call inside the change's lock."""
    needed = required_approvals(change.deployment)
    if needed <= change.required_approvals:
        return None
    before = change.required_approvals
    change.required_approvals = needed
    change.save(update_fields=["required_approvals", "updated_at"])
    why = (
        f"{change.deployment.host.name} is labelled production now: the change needs {needed} "
        f"approvals (it needed {before} when proposed)"
    )
    record(
        actor,
        change,
        "approvals_required",
        before={"required": before},
        after={"required": needed, "reason": why},
    )
    if change.state == S.APPROVED and change.approvals_count() < needed:
        transition(actor, change, S.PENDING, why)
    return why


def withdraw_change(actor, change: ChangeRequest, reason: str = "") -> ChangeRequest:
    with transaction.atomic():
        change = locked(change)
        rules.require("withdraw", actor, change)
        transition(actor, change, S.WITHDRAWN, reason)
    return change


def comment_on_change(actor, change: ChangeRequest, text: str) -> AuditEntry:
    text = text.strip()
    if not text:
        raise ChangeRefused("The comment is empty.")
    rules.require("comment", actor, change)
    with transaction.atomic():
        return record(actor, change, "comment", after={"text": text[:5000]})


def rebase_change(actor, change: ChangeRequest) -> ChangeRequest:
    """Re-base a stale change on the running config: the diff, warnings and prediction are
    computed again, and approvals given against the old base no longer count."""
    with transaction.atomic():
        change = locked(change)
        rules.require("rebase", actor, change)
        deployment = Deployment.objects.select_related("active_config").get(pk=change.deployment_id)
        old, new = change.base_config, deployment.active_config
        proposal = {
            "settings": change.settings,
            "env": change.env,
            "placement": change.placement,
            "model": change.model,
        }
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
                "diff": _diff_lists(facts["diff"]),
            },
        )
        if change.state == S.APPROVED:
            transition(actor, change, S.PENDING, "rebased: the approvals were for another base")
    return change
