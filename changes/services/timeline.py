"""A change's timeline is its audit entries: every verb appends one and pushes it to the
change's page (group ``change-<pk>``). State transitions go through here too, so each one is
recorded, published and (for the states people care about) notified."""

from __future__ import annotations

from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.utils import timezone

from changes.choices import ChangeState, Decision, Stage, StageStatus
from changes.models import ChangeRequest
from controlpanel.jobs import enqueue_on_commit
from controlpanel.models import AuditEntry
from controlpanel.realtime import group_name, publish
from controlpanel.services import audit

S = ChangeState

NOTIFY_ON = {
    S.PENDING,
    S.APPROVED,
    S.REJECTED,
    S.APPLIED,
    S.UNVERIFIED,
    S.ROLLED_BACK,
    S.FAILED,
}

TITLES = {
    "propose": "Proposed",
    "approve": "Approved",
    "start_override": "Predicted start failure overridden",
    "reject": "Rejected",
    "comment": "Comment",
    "rebase": "Rebased onto the running config",
    "approvals_required": "More approvals required (the host is labelled production)",
    "apply": "Apply requested",
    "resume": "Pipeline resumed",
    "rollback_request": "Rollback requested",
    "notify": "Notification",
}


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
    transaction.on_commit(lambda: publish(group_name("change", change.pk), "change.event", event))
    return entry


def timeline(change: ChangeRequest) -> list[dict]:
    entries = AuditEntry.objects.filter(
        content_type=ContentType.objects.get_for_model(ChangeRequest), object_id=str(change.pk)
    ).order_by("created_at", "pk")
    return [timeline_item(e) for e in entries]


def timeline_item(entry: AuditEntry) -> dict:
    """One entry as the page draws it: title, colour, message, and the entry's data."""
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
        item.update(
            title=TITLES.get(action, action),
            colour=Decision(action).colour if action in Decision.values else "grey",
            message=after.get("comment") or after.get("text") or after.get("message") or "",
        )
    return item


def transition(actor, change: ChangeRequest, state: ChangeState, reason: str = "") -> None:
    """Move the change to ``state`` (the model refuses what the state machine forbids),
    record it, push the new badge to its page and notify people of the states they follow."""
    before = change.transition_to(state)
    after = {"state": state.value}
    if reason:
        after["reason"] = reason
    record(actor, change, "transition", before={"state": before.value}, after=after)
    data = {"id": change.pk, "state": state.value, "label": state.label, "colour": state.colour}
    transaction.on_commit(lambda: publish(group_name("change", change.pk), "change.state", data))
    if state in NOTIFY_ON:
        enqueue_on_commit("changes.tasks.notify_change", change.pk, state.value)


def locked(change: ChangeRequest) -> ChangeRequest:
    """The change again, under a row lock (inside a transaction)."""
    return (
        ChangeRequest.objects.select_for_update(of=("self",))
        .select_related("deployment__host", "base_config", "proposed_by")
        .get(pk=change.pk)
    )


def record_stage(
    change: ChangeRequest, stage: Stage, status: StageStatus, message: str = "", **extra
) -> None:
    """A pipeline step's progress on the timeline; it also stamps the change's heartbeat."""
    change.stage = stage.value
    change.pipeline_heartbeat_at = timezone.now()
    change.save(update_fields=["stage", "pipeline_heartbeat_at", "updated_at"])
    after = {"stage": stage.value, "status": status.value, "message": message[:2000]}
    after.update({k: v for k, v in extra.items() if v not in (None, "")})
    actor = change.applied_by if stage == Stage.SNAPSHOT else None
    with transaction.atomic():
        record(actor, change, "stage", after=after)


def finish(change: ChangeRequest, state: ChangeState, outcome: str) -> None:
    """End the pipeline in ``state`` with ``outcome`` said on the change."""
    with transaction.atomic():
        row = locked(change)
        row.outcome = outcome[:1000]
        row.pipeline_owner = ""
        row.save(update_fields=["outcome", "pipeline_owner", "updated_at"])
        transition(None, row, state, outcome[:1000])
    change.refresh_from_db()
