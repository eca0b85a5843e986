"""The advisor in the panel: gather a deployment's facts (``diagnosis_facts``), run the rules
(``changes.advisor.engine.evaluate``) and keep what they find as ``Finding`` rows — opened,
refreshed, cleared — telling the deployment's live pages when the list changed; dismiss a
finding with a reason (audited); sweep the fleet (the beat task).

The last evaluation of each deployment (when, and whether the engine could be scraped) is
kept in the cache, not the database: it is a status line, rewritten every minute, and is
simply "not evaluated yet" after a cache flush."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.utils import timezone

from changes.advisor import engine as advisor
from changes.advisor.facts import Snapshot
from changes.advisor.findings import Finding as Found
from changes.models import Finding
from changes.services.diagnosis_facts import Gathered, gather, scrape_engine, scrape_seconds
from controlpanel.realtime import group_name, publish
from controlpanel.services import audit
from hosts.choices import HostStatus
from hosts.models import Deployment

log = logging.getLogger(__name__)

EVENT = "advisor.findings"
# The group of the fleet-wide findings list (the dashboard): one for everyone.
FLEET_GROUP = "advisor-fleet"
# How long an evaluation's status line is kept: several beats, so a missed one does not
# make the page say "never evaluated".
STATUS_TTL_S = 3600
DISMISS_REASON_CHARS = 500


class DismissRefused(ValueError):
    """A dismissal without a reason, or of a finding that is no longer open."""


@dataclass(frozen=True)
class Evaluation:
    """What one refresh did: the snapshot it read, what the rules found, what changed."""

    gathered: Gathered
    found: list[Found]
    opened: list[Finding]
    updated: list[Finding]
    cleared: list[Finding]

    @property
    def changed(self) -> bool:
        return bool(self.opened or self.cleared)


def snapshot(deployment: Deployment, *, live: bool = True) -> Snapshot:
    """The facts the rules read about ``deployment`` now (``live``: scrape its engine)."""
    return gather(deployment, live=live).snapshot


def _status_key(deployment_pk: int) -> str:
    return f"advisor:evaluated:{deployment_pk}"


def last_evaluation(deployment: Deployment | int) -> dict | None:
    """``{"evaluated_at", "engine_status", "engine_error", "seconds", "live"}`` of the last
    refresh of the deployment, or None when it was not evaluated (recently)."""
    pk = deployment if isinstance(deployment, int) else deployment.pk
    return cache.get(_status_key(pk))


def last_evaluations(pks) -> dict[int, dict]:
    keys = {_status_key(pk): pk for pk in pks}
    return {keys[k]: v for k, v in cache.get_many(list(keys)).items()}


def refresh(deployment: Deployment, *, live: bool = True, scraped=None) -> Evaluation:
    """Evaluate every rule on ``deployment`` now and bring its findings up to date: a new
    problem opens a finding, one still seen is refreshed (last seen, evidence, numbers), one
    no longer seen is cleared. A dismissed finding stays dismissed while it is seen."""
    started = time.monotonic()
    gathered = gather(deployment, live=live, scraped=scraped)
    found = advisor.evaluate(gathered.snapshot)
    opened, updated, cleared = _upsert(deployment, found)
    cache.set(
        _status_key(deployment.pk),
        {
            "evaluated_at": timezone.now().isoformat(),
            "engine_status": gathered.engine_status,
            "engine_error": gathered.engine_error,
            "seconds": round(time.monotonic() - started, 3),
            "live": live,
        },
        STATUS_TTL_S,
    )
    evaluation = Evaluation(gathered, found, opened, updated, cleared)
    if evaluation.changed:
        _announce(deployment, evaluation)
    return evaluation


def _fields(found: Found) -> dict:
    data = found.as_dict()
    return {
        "severity": data["severity"],
        "title": data["title"][:200],
        "seen": data["seen"],
        "why": data["why"],
        "evidence": data["evidence"],
        "suggestion": data["suggestion"],
        "source": data["source"][:100],
    }


def _upsert(deployment: Deployment, found: list[Found]):
    now = timezone.now()
    # One finding per rule: a rule that reports twice is kept at its worst (the list is
    # sorted worst first).
    by_rule: dict[str, Found] = {}
    for finding in found:
        by_rule.setdefault(finding.rule, finding)
    opened, updated, cleared = [], [], []
    with transaction.atomic():
        current = {
            f.rule: f
            for f in Finding.objects.select_for_update().filter(
                deployment=deployment, cleared_at__isnull=True
            )
        }
        for rule_id, finding in by_rule.items():
            row = current.get(rule_id)
            if row is None:
                try:
                    with transaction.atomic():
                        row = Finding.objects.create(
                            deployment=deployment,
                            rule=rule_id,
                            first_seen_at=now,
                            last_seen_at=now,
                            **_fields(finding),
                        )
                except IntegrityError:
                    # A concurrent refresh opened it first: refresh that one instead.
                    row = Finding.objects.get(
                        deployment=deployment, rule=rule_id, cleared_at__isnull=True
                    )
                else:
                    opened.append(row)
                    continue
            for name, value in _fields(finding).items():
                setattr(row, name, value)
            row.last_seen_at = now
            row.save()
            updated.append(row)
        for rule_id, row in current.items():
            if rule_id not in by_rule:
                row.cleared_at = now
                row.save(update_fields=["cleared_at"])
                cleared.append(row)
    return opened, updated, cleared


def _announce(deployment: Deployment, evaluation: Evaluation) -> None:
    """Tell the deployment's pages and the fleet list that its findings changed (they then
    fetch the list again: the event carries what changed, not the whole list)."""
    data = {
        "deployment": deployment.pk,
        "host": deployment.host_id,
        "opened": [f.rule for f in evaluation.opened],
        "cleared": [f.rule for f in evaluation.cleared],
        "active": Finding.objects.filter(deployment=deployment).active().count(),
    }

    def send():
        publish(group_name("deployment", deployment.pk), EVENT, data)
        publish(FLEET_GROUP, EVENT, data)

    transaction.on_commit(send)


def dismiss(actor, finding: Finding, reason: str) -> Finding:
    """Dismiss an open finding with a reason (required), audited; it stays dismissed while
    the rule keeps seeing the problem and a reappearance after it cleared is a new finding."""
    reason = (reason or "").strip()
    if not reason:
        raise DismissRefused("Say why the finding is dismissed.")
    if len(reason) > DISMISS_REASON_CHARS:
        raise DismissRefused(f"Keep the reason under {DISMISS_REASON_CHARS} characters.")
    with transaction.atomic():
        finding = Finding.objects.select_for_update().get(pk=finding.pk)
        if finding.cleared_at is not None:
            raise DismissRefused("The finding has cleared: there is nothing to dismiss.")
        if finding.dismissed_at is not None:
            raise DismissRefused("The finding is already dismissed.")
        finding.dismissed_at = timezone.now()
        finding.dismissed_by = actor if getattr(actor, "is_authenticated", False) else None
        finding.dismiss_reason = reason
        finding.save(update_fields=["dismissed_at", "dismissed_by", "dismiss_reason"])
        audit(
            actor,
            "finding.dismiss",
            finding,
            before={"rule": finding.rule, "severity": finding.severity},
            after={"rule": finding.rule, "reason": reason, "deployment": finding.deployment_id},
        )
        data = {"deployment": finding.deployment_id, "dismissed": [finding.rule]}
        transaction.on_commit(
            lambda: (
                publish(group_name("deployment", data["deployment"]), EVENT, data),
                publish(FLEET_GROUP, EVENT, data),
            )
        )
    return finding


# --- the fleet -----------------------------------------------------------------------------
def deployments_to_diagnose():
    """Every deployment on a host that answers: an offline host's numbers are stale."""
    return Deployment.objects.filter(host__status=HostStatus.ONLINE).select_related("host")


# Engines scraped at once by the fleet sweep (threads waiting on HTTP, not computing).
SCRAPE_THREADS = 16


def _scrape_all(deployments: list[Deployment]) -> dict[int, tuple]:
    """Every engine's live window, scraped in parallel so the sweep takes one scrape's time
    (ADVISOR_SCRAPE_SECONDS plus timeouts), not one per deployment. No database here."""
    if not deployments:
        return {}
    seconds = scrape_seconds()

    def one(deployment):
        try:
            return scrape_engine(deployment, seconds)
        except Exception as exc:  # noqa: BLE001 - reported as the engine's status
            return None, f"{type(exc).__name__}: {exc}"[:300]

    with ThreadPoolExecutor(max_workers=min(SCRAPE_THREADS, len(deployments))) as pool:
        return dict(zip((d.pk for d in deployments), pool.map(one, deployments), strict=True))


def diagnose_fleet(*, live: bool = True) -> dict:
    """Refresh every deployment on an online host; one that fails is logged and the others
    go on. ``{"evaluated": n, "failed": [names], "findings": findings seen}``."""
    evaluated, failed, findings = 0, [], 0
    deployments = list(deployments_to_diagnose().select_related("active_config"))
    scraped = _scrape_all(deployments) if live else {}
    for deployment in deployments:
        try:
            evaluation = refresh(deployment, live=live, scraped=scraped.get(deployment.pk))
        except Exception:  # noqa: BLE001 - one deployment must not stop the sweep
            log.exception("diagnosing %s failed", deployment)
            failed.append(str(deployment))
            continue
        evaluated += 1
        findings += len(evaluation.found)
    return {"evaluated": evaluated, "failed": failed, "findings": findings}
