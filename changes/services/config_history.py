"""Config history as it happened: how each version ended (running now, was good, rolled
back, failed to start, never applied), read from the engine operations and the changes that
applied it, and what each version changed from the version it was made from (its parent),
not from whichever version happens to carry the number before it.

The ending decides whether a version may be the target of a rollback proposal
(``VersionOutcome.rollback_target``): the history page's button and ``review.propose_rollback``
both ask ``ending``/``rollback_problem`` here, so the two can never disagree."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q

from changes.choices import ChangeKind, ChangeState, VersionOutcome
from changes.models import ChangeRequest
from changes.models_sweeps import SweepTrial
from hosts.choices import OperationKind, OperationOutcome
from hosts.engines.redaction import masked
from hosts.models import ACTIVE_STATUSES, Deployment, EngineConfig, EngineOperation

# A change that ended in these after its version came up healthy judged that version bad
# (a failed verification, health check or quality probe): the version was rolled back.
_CONDEMNED = (ChangeState.ROLLED_BACK, ChangeState.FAILED)


@dataclass(frozen=True)
class Ending:
    """How one version ended, with the change and the words that say why."""

    outcome: VersionOutcome
    reason: str = ""
    change: int | None = None  # the change whose apply decided the ending, if any


def endings(configs: list[EngineConfig]) -> dict[int, Ending]:
    """Each config's ending, in a fixed number of queries for the whole list. The latest
    apply of a version decides; a version with no apply of its own that was running when a
    later one was applied (the first version of a deployment) ran, and is good."""
    ids = [c.pk for c in configs]
    running = set(
        Deployment.objects.filter(pk__in={c.deployment_id for c in configs}).values_list(
            "active_config_id", flat=True
        )
    )
    latest: dict[int, dict] = {}
    for op in (
        # An operation closed without an outcome (cancelled) never reached the engine.
        EngineOperation.objects.filter(kind=OperationKind.APPLY, config_id__in=ids)
        .filter(Q(status__in=ACTIVE_STATUSES) | ~Q(outcome=""))
        .order_by("pk")
        .values("pk", "config_id", "outcome", "status", "error")
    ):
        latest[op["config_id"]] = op
    owners = {
        row["operation_id"]: row
        for row in ChangeRequest.objects.filter(
            operation_id__in=[op["pk"] for op in latest.values()]
        ).values("pk", "operation_id", "state", "outcome")
    }
    ran_before = set(
        EngineOperation.objects.filter(previous_config_id__in=ids).values_list(
            "previous_config_id", flat=True
        )
    )
    makers = {
        row["applied_config_id"]: row
        for row in ChangeRequest.objects.filter(
            applied_config_id__in=ids, kind=ChangeKind.SETTINGS
        ).values("pk", "applied_config_id", "state", "outcome")
    }
    result = {}
    for config in configs:
        op = latest.get(config.pk)
        if config.pk in running:
            owner = owners.get(op["pk"]) if op else None
            result[config.pk] = Ending(VersionOutcome.RUNNING, change=owner and owner["pk"])
        elif op is not None:
            result[config.pk] = _from_operation(op, owners.get(op["pk"]))
        elif config.pk in ran_before:
            result[config.pk] = Ending(VersionOutcome.GOOD, "ran until a later version replaced it")
        else:
            result[config.pk] = _never(makers.get(config.pk))
    return result


def _never(maker: dict | None) -> Ending:
    # Made by a change that stopped before the engine was restarted on it (or not made by
    # a change at all): nothing ever ran it.
    if maker is None:
        return Ending(VersionOutcome.NEVER)
    reason = f"change #{maker['pk']}: {maker['outcome']}" if maker["outcome"] else ""
    return Ending(VersionOutcome.NEVER, reason, maker["pk"])


def _from_operation(op: dict, owner: dict | None) -> Ending:
    if op["status"] in ACTIVE_STATUSES:
        return Ending(VersionOutcome.APPLYING, change=owner and owner["pk"])
    if op["outcome"] != OperationOutcome.READY:
        return Ending(VersionOutcome.FAILED, op["error"], change=owner and owner["pk"])
    if owner is not None and owner["state"] in _CONDEMNED:
        return Ending(
            VersionOutcome.ROLLED_BACK, f"change #{owner['pk']}: {owner['outcome']}", owner["pk"]
        )
    return Ending(VersionOutcome.GOOD, change=owner and owner["pk"])


def ending(config: EngineConfig) -> Ending:
    return endings([config])[config.pk]


def rollback_problem(target: EngineConfig) -> str | None:
    """Why ``target`` cannot be the target of a rollback proposal, or None when it can: it
    must have run healthy and been kept (``VersionOutcome.rollback_target``)."""
    if target.deployment.active_config_id == target.pk:
        return f"{target.deployment} already runs v{target.version}."
    end = ending(target)
    if end.outcome.rollback_target:
        return None
    why = f" ({end.reason})" if end.reason else ""
    return (
        f"v{target.version} {end.outcome.label.lower()}{why}: only a version that ran healthy "
        "can be rolled back to."
    )


# --- what each version changed -----------------------------------------------------------------
def parents(configs: list[EngineConfig]) -> dict[int, tuple[EngineConfig | None, bool]]:
    """``{config pk: (parent, recorded)}``. The parent is the config the version was made
    from: the base of the change that created it, the config a sweep trial started from, or
    what ran when it was first applied; ``recorded`` is False when none of those is known
    and the version numbered before it stands in."""
    ids = [c.pk for c in configs]
    parent_ids: dict[int, int] = {}
    for config_id, base_id, snapshot_id in ChangeRequest.objects.filter(
        applied_config_id__in=ids, kind=ChangeKind.SETTINGS
    ).values_list("applied_config_id", "base_config_id", "snapshot_config_id"):
        if base_id or snapshot_id:
            parent_ids[config_id] = base_id or snapshot_id
    for config_id, original_id in SweepTrial.objects.filter(
        config_id__in=ids, lane__original_config__isnull=False
    ).values_list("config_id", "lane__original_config_id"):
        parent_ids.setdefault(config_id, original_id)
    for config_id, previous_id in (
        EngineOperation.objects.filter(
            kind=OperationKind.APPLY, config_id__in=ids, previous_config__isnull=False
        )
        .order_by("-pk")
        .values_list("config_id", "previous_config_id")
    ):
        if previous_id != config_id:
            parent_ids.setdefault(config_id, previous_id)  # the first apply wins: newest first
    # A parent must be older than its child; anything else is not where it was made from.
    have = {c.pk: c for c in configs}
    have.update(EngineConfig.objects.in_bulk(set(parent_ids.values()) - set(have)))
    by_number = {(c.deployment_id, c.version): c for c in have.values()}
    wanted = {
        (c.deployment_id, c.version - 1)
        for c in configs
        if c.version > 1 and not _sound(c, have.get(parent_ids.get(c.pk)))
    } - set(by_number)
    if wanted:
        for c in EngineConfig.objects.filter(
            deployment_id__in={d for d, _ in wanted}, version__in={v for _, v in wanted}
        ):
            by_number[(c.deployment_id, c.version)] = c
    result = {}
    for c in configs:
        parent = have.get(parent_ids.get(c.pk))
        if _sound(c, parent):
            result[c.pk] = (parent, True)
        elif c.version > 1:
            result[c.pk] = (by_number.get((c.deployment_id, c.version - 1)), False)
        else:
            result[c.pk] = (None, True)  # the first version: made from nothing
    return result


def _sound(config: EngineConfig, parent: EngineConfig | None) -> bool:
    return (
        parent is not None
        and parent.deployment_id == config.deployment_id
        and parent.version < config.version
    )


def rows(configs: list[EngineConfig], *, with_endings: bool = True) -> list[dict]:
    """Each config with its parent, the diff against it (secrets masked) and its ending."""
    found = parents(configs)
    ends = endings(configs) if with_endings else {}
    result = []
    for c in configs:
        parent, recorded = found[c.pk]
        result.append(
            {
                "config": c,
                "parent": parent,
                "parent_recorded": recorded,
                "diff": masked(c.diff(parent)),
                "ending": ends.get(c.pk),
            }
        )
    return result
