"""Telling people about a change: email through Django's mail backend, and a Slack-compatible
webhook (``{"text": ...}``), both configured by environment (see the manual, docs/configuration.md).

Runs on a worker (``tasks.notify_change``), never inside the request or the pipeline: a slow
mail server must not hold up a review or an apply. What was sent, or why not, goes on the
change's timeline.
"""

from __future__ import annotations

import logging

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Q

from changes.choices import ChangeState
from changes.models import ChangeRequest
from changes.services.facts import shown_diff
from changes.services.timeline import record

log = logging.getLogger(__name__)
S = ChangeState

HEADLINES = {
    S.PENDING: "needs review",
    S.APPROVED: "was approved",
    S.REJECTED: "was rejected",
    S.APPLIED: "was applied",
    S.UNVERIFIED: "was applied but NOT verified",
    S.ROLLED_BACK: "was rolled back",
    S.FAILED: "failed",
}


def recipients(change: ChangeRequest, state: ChangeState) -> list[str]:
    """Who hears of ``state``: reviewers of a new proposal, the proposer (and who applied it)
    of decisions and results; always CHANGE_NOTIFY_EMAILS."""
    people = []
    if state == S.PENDING:
        User = get_user_model()
        reviewers = User.objects.filter(is_active=True).filter(
            Q(is_superuser=True)
            | Q(groups__permissions__codename="approve_changerequest")
            | Q(user_permissions__codename="approve_changerequest")
        )
        people = [u.email for u in reviewers.distinct() if u.pk != change.proposed_by_id]
    else:
        people = [u.email for u in (change.proposed_by, change.applied_by) if u is not None]
    addresses = [a for a in people if a] + list(settings.CHANGE_NOTIFY_EMAILS)
    return sorted(set(addresses))


def message(change: ChangeRequest, state: ChangeState) -> tuple[str, str]:
    """``(subject, text)`` of the notification."""
    url = settings.PANEL_URL + change.get_absolute_url()
    subject = f"[LLM panel] Change #{change.pk} {HEADLINES[state]}: {change.title}"
    lines = [
        f"Change #{change.pk} on {change.deployment} {HEADLINES[state]}.",
        f"Title: {change.title}",
        f"Proposed by: {change.proposed_by or 'unknown'}",
    ]
    # Mail and chat leave the panel: secret values (api_key, HF_TOKEN) are masked.
    diff = shown_diff(change.diff()) if change.base_config_id or change.settings else {}
    if diff:
        lines.append("Settings:")
        lines += [f"  {flag}: {old} → {new}" for flag, (old, new) in diff.items()]
    if change.outcome:
        lines.append(f"Outcome: {change.outcome}")
    decisions = change.current_approvals()
    if state in (S.APPROVED, S.REJECTED) and decisions:
        for d in decisions:
            lines.append(
                f"{d.reviewer_name} {d.get_decision_display().lower()}"
                + (f": {d.comment}" if d.comment else "")
            )
    lines.append(url)
    return subject, "\n".join(lines)


def send(change_pk: int, state: str) -> dict:
    """Send both kinds for ``state`` and record the result on the change's timeline."""
    change = (
        ChangeRequest.objects.select_related(
            "deployment__host", "proposed_by", "applied_by", "base_config"
        )
        .filter(pk=change_pk)
        .first()
    )
    if change is None:
        return {}
    state = ChangeState(state)
    subject, text = message(change, state)
    result: dict = {"event": state.value}
    to = recipients(change, state)
    if to:
        try:
            send_mail(subject, text, settings.DEFAULT_FROM_EMAIL, to, fail_silently=False)
            result["email"] = f"sent to {len(to)}"
        except Exception as exc:  # noqa: BLE001 - any mail failure is reported, not raised
            log.warning("mail for change %s failed", change_pk, exc_info=True)
            result["email"] = f"failed: {type(exc).__name__}: {exc}"
    if settings.CHANGE_WEBHOOK_URL:
        try:
            response = httpx.post(
                settings.CHANGE_WEBHOOK_URL,
                json={"text": f"{subject}\n{text}"},
                timeout=10,
            )
            response.raise_for_status()
            result["webhook"] = f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            log.warning("webhook for change %s failed", change_pk, exc_info=True)
            result["webhook"] = f"failed: {type(exc).__name__}"
    if len(result) > 1:
        parts = [f"{k} {v}" for k, v in result.items() if k != "event"]
        with transaction.atomic():
            record(None, change, "notify", after={**result, "message": "; ".join(parts)})
    return result
