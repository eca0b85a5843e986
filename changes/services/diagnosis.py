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
from datetime import datetime

from django.conf import settings as conf
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

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
# Findings older than this many advisor intervals are stale even without a failure (the beat
# or the worker is not running); with the periodic advisor off, older than this many seconds.
STALE_INTERVALS = 3
STALE_WHEN_OFF_S = 600.0


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
    no longer seen is cleared. A dismissed finding stays dismissed while it is seen.

    A pass that raises is recorded on the status line (since when it fails, and the
    exception's class) before the exception goes on, so the pages and the API can say
    that the findings they show are stale and why (``freshness``)."""
    started = time.monotonic()
    try:
        gathered = gather(deployment, live=live, scraped=scraped)
        found = advisor.evaluate(gathered.snapshot)
        opened, updated, cleared = _upsert(deployment, found)
    except Exception as exc:
        if _record_failure(deployment.pk, exc):
            _announce_freshness(deployment)
        raise
    was_failing = bool((cache.get(_status_key(deployment.pk)) or {}).get("failed_since"))
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
    elif was_failing:
        _announce_freshness(deployment)  # the pages drop their "stale" line
    return evaluation


def _record_failure(deployment_pk: int, exc: Exception) -> bool:
    """Keep the last good evaluation's fields and add when the failures began, the latest
    one, and the exception's class (not its message: a status line is shown to every
    reader and an exception's text may carry a URL with credentials). True when this is
    the first failure since a good pass."""
    status = dict(cache.get(_status_key(deployment_pk)) or {})
    now = timezone.now().isoformat()
    first = "failed_since" not in status
    status.setdefault("failed_since", now)
    status.update(failed_at=now, error_class=type(exc).__name__)
    cache.set(_status_key(deployment_pk), status, STATUS_TTL_S)
    return first


@dataclass(frozen=True)
class Freshness:
    """How current a deployment's findings are: ``stale`` with how old (``as_of``, the last
    good evaluation, or the newest finding's last sighting when none is known) and why."""

    stale: bool
    as_of: datetime | None
    age_s: float | None
    reason: str
    failed_since: datetime | None = None
    error_class: str = ""

    @property
    def text(self) -> str:
        """ "as of 14:02 (12 min ago): the advisor failed since 14:03: TypeError"."""
        if self.as_of is None:
            when = "as of an unknown time"
        else:
            when = f"as of {_clock(self.as_of)} ({_ago(self.age_s)})"
        return f"{when}: {self.reason}" if self.reason else when

    def as_dict(self) -> dict:
        return {
            "stale": self.stale,
            "as_of": self.as_of,
            "age_s": None if self.age_s is None else round(self.age_s),
            "reason": self.reason,
            "failed_since": self.failed_since,
            "error_class": self.error_class,
            "text": self.text,
        }


def _clock(moment: datetime) -> str:
    local = timezone.localtime(moment)
    same_day = local.date() == timezone.localtime().date()
    return local.strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M")


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "age unknown"
    if seconds < 90:
        return f"{max(0, round(seconds))} s ago"
    if seconds < 5400:
        return f"{round(seconds / 60)} min ago"
    return f"{seconds / 3600:.1f} h ago"


def stale_after_s() -> float:
    """Age at which findings are stale though nothing failed: ``STALE_INTERVALS`` beats of
    the periodic advisor (a missed beat is normal, three are not), or ``STALE_WHEN_OFF_S``
    when it is off and only runs on request."""
    interval = float(getattr(conf, "ADVISOR_INTERVAL_SECONDS", 60.0) or 0)
    return STALE_INTERVALS * interval if interval > 0 else STALE_WHEN_OFF_S


def freshness(status: dict | None, *, newest_seen=None, now=None) -> Freshness:
    """How current the findings of a deployment are, from its status line
    (``last_evaluation``) and, when there is none, the newest ``last_seen_at`` of its
    findings. Stale when the advisor failed since its last good pass, when that pass is
    older than ``stale_after_s()``, or when nothing says when it ran but findings exist."""
    now = now or timezone.now()
    status = status or {}
    evaluated = parse_datetime(status.get("evaluated_at") or "")
    as_of = evaluated or newest_seen
    age = (now - as_of).total_seconds() if as_of is not None else None
    failed_since = parse_datetime(status.get("failed_since") or "")
    if failed_since is not None:
        error = status.get("error_class") or "an error"
        return Freshness(
            True,
            as_of,
            age,
            f"the advisor failed since {_clock(failed_since)}: {error}",
            failed_since,
            error,
        )
    if evaluated is None:
        if newest_seen is None:
            return Freshness(False, None, None, "")
        return Freshness(True, as_of, age, "the advisor has not evaluated it since")
    if age is not None and age > stale_after_s():
        interval = float(getattr(conf, "ADVISOR_INTERVAL_SECONDS", 60.0) or 0)
        why = (
            f"the advisor has not run since (every {interval:g} s while the worker and its "
            "beat are up)"
            if interval > 0
            else "the periodic advisor is off (ADVISOR_INTERVAL_SECONDS=0): it runs on request"
        )
        return Freshness(True, as_of, age, why)
    return Freshness(False, as_of, age, "")


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


def _announce_freshness(deployment: Deployment) -> None:
    """Tell the deployment's pages that its findings became stale, or fresh again: they
    fetch the list again, and with it the line that says how current it is. Sent at once:
    a failed pass may have rolled its transaction back."""
    data = {
        "deployment": deployment.pk,
        "host": deployment.host_id,
        "opened": [],
        "cleared": [],
        "freshness": True,
    }
    publish(group_name("deployment", deployment.pk), EVENT, data)


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
