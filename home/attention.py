"""What needs this user's attention: reviews waiting for them (the navigation's count and the
dashboard), their recent failures, the fleet's serious advisor findings and hosts the panel
cannot reach or log in to.

Who may review what is ``changes.rules`` / ``changes.rules_sweeps``, read here as the buttons
read it, so the count never offers a review the page would refuse (one's own, a stale
change). Each list is one query however many rows there are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property

from django.db import connection
from django.utils import timezone

from benchmarks.models import BenchmarkRun
from changes import rules, rules_sweeps
from changes.choices import ChangeState, SweepState
from changes.models import ChangeRequest, Finding
from changes.models_sweeps import Sweep
from changes.views_advisor import BADGES
from controlpanel.choices import OperationStatus
from hosts.models import Host
from hosts.services.fleet_list import NOT_SHOWN, TROUBLED

# "Recent" failures: a week covers a weekend away.
RECENT_DAYS = 7
SHOWN = 10  # per list: the page links on to the full lists
SERIOUS = ("critical", "warning")
# The rows name a deployment and its host: the host's credentials (decrypted per row when
# read) and larger JSON stay in the database; nothing on the card shows them.
HOST_NOT_SHOWN = tuple(f"deployment__host__{name}" for name in NOT_SHOWN)
# A user's own failed runs and changes are read on every dashboard view, for them alone: only
# the columns their rows show (with ``defer`` Django compiled a select of ~100 columns over
# three tables, ~1.8 ms of CPU a query, for rows that are usually none).
OWN_ROW_FIELDS = ("deployment__name", "deployment__host__name")
REVIEW_FIELDS = (
    "state",
    "title",
    "proposed_by",
    "settings",
    "env",
    "placement",
    "model",
    "prediction",
    "deployment__name",
    "deployment__engine",
    "deployment__active_config",
    "deployment__host__name",
    "base_config__settings",
    "base_config__env",
    "base_config__placement",
    "base_config__model",
    "proposed_by__username",
)


def reviews_waiting(user) -> tuple[list[ChangeRequest], list[Sweep]]:
    """Changes and sweeps pending review that ``user`` may approve now (never their own)."""
    if not user.has_perm(rules.APPROVE):
        return [], []
    # Every page's navigation counts these, so only the columns the approve rule reads
    # (state, proposer, the diff against the base config, staleness, the start prediction)
    # and the dashboard shows are loaded: not the change's other JSON (comparison, warnings,
    # ...) nor the host's encrypted credentials. One's own changes never count (four-eyes),
    # so the database leaves them out; the rule still decides on the rest.
    pending = (
        ChangeRequest.objects.filter(state=ChangeState.PENDING)
        .exclude(proposed_by=user)
        .select_related("deployment__host", "base_config", "proposed_by")
        .only(*REVIEW_FIELDS)
        .order_by("pk")
    )
    changes = [change for change in pending if rules.allowed("approve", user, change)]
    sweeps = [
        sweep
        for sweep in Sweep.objects.filter(state=SweepState.PENDING).select_related(
            "deployment__host", "created_by"
        )
        if "approve" in rules_sweeps.allowed_actions(user, sweep)
    ]
    return changes, sweeps


@dataclass
class Attention:
    """The dashboard's "needs my attention" card: the user's own lists, read at once, and the
    fleet's (serious findings, hosts in trouble), the same for everyone who may see them,
    read only when the card's shared part is rendered (controlpanel.pagecache)."""

    user: object = None
    changes: list = field(default_factory=list)
    sweeps: list = field(default_factory=list)
    failed_runs: list = field(default_factory=list)
    failed_changes: list = field(default_factory=list)
    days: int = RECENT_DAYS

    @cached_property
    def _fleet(self) -> tuple[list, list, int]:
        return fleet_attention(self.user)

    @property
    def findings(self) -> list:
        return self._fleet[0]

    @property
    def hosts(self) -> list:
        return self._fleet[1]

    @property
    def hosts_more(self) -> int:
        """Troubled hosts past the first SHOWN: the hosts list has them all."""
        return self._fleet[2]

    @property
    def own_empty(self) -> bool:
        return not any((self.changes, self.sweeps, self.failed_runs, self.failed_changes))

    @property
    def empty(self) -> bool:
        return self.own_empty and not (self.findings or self.hosts)


def attention(user) -> Attention:
    """The user's own lists, each the first SHOWN rows (a bounded number of queries); the
    fleet's lists are read when first used."""
    since = timezone.now() - timedelta(days=RECENT_DAYS)
    changes, sweeps = reviews_waiting(user)
    found = Attention(user=user, changes=changes[:SHOWN], sweeps=sweeps[:SHOWN])
    may_see_runs = user.has_perm("benchmarks.view_benchmarkrun")
    may_see_changes = user.has_perm("changes.view_changerequest")
    if not (may_see_runs or may_see_changes):
        return found
    runs_failed, changes_failed = _own_failures_exist(user, since)
    if may_see_runs and runs_failed:
        found.failed_runs = list(
            _own_failed_runs(user, since)
            .select_related("deployment__host")
            .only(*OWN_ROW_FIELDS, "status", "label", "created_at")[:SHOWN]
        )
    if may_see_changes and changes_failed:
        found.failed_changes = list(
            _own_failed_changes(user, since)
            .select_related("deployment__host")
            .only(*OWN_ROW_FIELDS, "state", "title", "finished_at")[:SHOWN]
        )
    return found


def _own_failed_runs(user, since):
    return BenchmarkRun.objects.filter(
        requested_by=user, status=OperationStatus.FAILED, created_at__gte=since
    )


def _own_failed_changes(user, since):
    return ChangeRequest.objects.filter(
        proposed_by=user,
        state__in=(ChangeState.FAILED, ChangeState.ROLLED_BACK),
        finished_at__gte=since,
    )


def _own_failures_exist(user, since) -> tuple[bool, bool]:
    """Whether ``_own_failed_runs`` and ``_own_failed_changes`` have a row: one statement of
    two EXISTS subqueries written out here (tests hold it to the querysets' answers). Every
    dashboard view asks and the answer is usually no, while merely building the two
    querysets cost ~0.85 ms of CPU each, a fifth of a dashboard view served from the shared
    cards; the lists are read only when there is something to list."""
    q = connection.ops.quote_name
    run, change = BenchmarkRun._meta, ChangeRequest._meta

    def column(meta, name: str) -> str:
        return q(meta.get_field(name).column)

    # Names from the models' _meta, quoted; every value is a bound parameter.
    sql = (
        f"SELECT EXISTS (SELECT 1 FROM {q(run.db_table)}"  # noqa: S608
        f" WHERE {column(run, 'requested_by')} = %s AND {column(run, 'status')} = %s"
        f" AND {column(run, 'created_at')} >= %s),"
        f" EXISTS (SELECT 1 FROM {q(change.db_table)}"
        f" WHERE {column(change, 'proposed_by')} = %s AND {column(change, 'state')} IN (%s, %s)"
        f" AND {column(change, 'finished_at')} >= %s)"
    )
    when = connection.ops.adapt_datetimefield_value(since)
    params = [user.pk, OperationStatus.FAILED.value, when]
    params += [user.pk, ChangeState.FAILED.value, ChangeState.ROLLED_BACK.value, when]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        runs, changes = cursor.fetchone()
    return bool(runs), bool(changes)


def fleet_attention(user) -> tuple[list, list, int]:
    """The fleet's serious findings (if ``user`` may see findings), its hosts in trouble (a
    red status badge: unreachable, credentials refused, ...; the hosts list's
    ``?status=trouble``) and how many more of those there are than SHOWN."""
    findings = []
    if user.has_perm("changes.view_finding"):
        findings = list(
            Finding.objects.active()
            .filter(severity__in=SERIOUS)
            .worst_first()
            .select_related("deployment__host")
            .defer(*HOST_NOT_SHOWN)[:SHOWN]
        )
        for finding in findings:
            finding.badge = BADGES.get(finding.severity, "grey")
    troubled = Host.objects.filter(status__in=TROUBLED).defer(*NOT_SHOWN).order_by("name")
    hosts = list(troubled[:SHOWN])
    # Counted always, not only when the list is full: the same queries whatever the fleet.
    return findings, hosts, max(troubled.count() - SHOWN, 0)
