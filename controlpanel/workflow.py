"""The workflows' shared machinery: a state machine for a model whose ``state`` moves only along
its allowed transitions, stamping the time each state is entered; a reviewer's decision and the
four-eyes rule; and claimed long work (claim, heartbeat, find the lost) that a change's pipeline
and a sweep's lane both run under.

A change request and a tuning sweep are both such machines (``changes.models.ChangeRequest``,
``changes.models_sweeps.Sweep``): each declares its states, what each may become, which time
field each stamps and the noun its refusals use; the rule and its words are here, once.
(``BackgroundOperation`` keeps its own ``status`` machine: queued → running → an end, with its
error and log, one field set for every kind of job.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import models, transaction
from django.db.models import QuerySet
from django.utils import timezone

from controlpanel.choices import ColouredChoices
from controlpanel.heartbeat import Heartbeat
from controlpanel.models import InvalidTransition


class StateMachine:
    """Mixed into a model with a ``state`` field (and ``updated_at``). Subclasses set
    ``STATES`` (the choices class), ``TRANSITIONS`` (state → the states it may become; every
    state listed, a final one with none), ``STAMPS`` (state → the time field it sets when
    entered) and ``NOUN`` (what a refusal calls the object: "Change", "Sweep")."""

    STATES: type[models.TextChoices]
    TRANSITIONS: Mapping
    STAMPS: Mapping = {}
    NOUN = "Object"

    @property
    def state_choice(self):
        return self.STATES(self.state)

    def can_become(self, state) -> bool:
        return self.STATES(state) in self.TRANSITIONS[self.state_choice]

    def transition_problem(self, state) -> str | None:
        """None when the state machine allows becoming ``state``, else why not, naming what
        this state may become."""
        state = self.STATES(state)
        if self.can_become(state):
            return None
        allowed = ", ".join(sorted(s.label.lower() for s in self.TRANSITIONS[self.state_choice]))
        return (
            f"{self.NOUN} #{self.pk} is {self.state_choice.label.lower()}: it cannot become "
            f"{state.label.lower()} (from here: {allowed or 'nothing, it is finished'})."
        )

    def transition_to(self, state):
        """Move to ``state`` if the state machine allows it, stamping its time; saves the row
        and returns the state it left. The caller holds the row lock and writes the audit."""
        state = self.STATES(state)
        problem = self.transition_problem(state)
        if problem:
            raise InvalidTransition(problem)
        before = self.state_choice
        self.state = state
        fields = ["state", "updated_at"]
        stamp = self.STAMPS.get(state)
        if stamp:
            setattr(self, stamp, timezone.now())
            fields.append(stamp)
        self.save(update_fields=fields)
        return before


class Decision(ColouredChoices):
    """A reviewer's decision, on a change, a sweep or a new deployment's first start."""

    APPROVE = "approve", "Approved", "green"
    REJECT = "reject", "Rejected", "red"


class ReviewDecision(models.Model):
    """One reviewer's decision with their comment (the concrete models add what it is on, and
    how often one reviewer may decide). The four-eyes rule is ``four_eyes_problem``."""

    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    reviewer_name = models.CharField(max_length=150)
    decision = models.CharField(max_length=8, choices=Decision.choices)
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True
        ordering = ["created_at", "pk"]


def four_eyes_problem(
    user, author_id, what: str, *, made: str = "made", verb: str = "review it"
) -> str | None:
    """Why ``user`` may not review what they themselves made (``what``: "change #3"), or
    None. The rule every review follows: a change's, a sweep's, a first start's."""
    if author_id is not None and user.pk == author_id:
        return f"You {made} {what}: someone else must {verb} (four-eyes rule)."
    return None


# --- claimed long work -------------------------------------------------------------------------
@dataclass(frozen=True)
class Claim:
    """How a worker claims a row of long work and keeps it (a change's pipeline, a sweep's
    lane): the row's owner and heartbeat fields, and which rows are still work to do. A claim
    whose stamps stopped for three beats (``stale_after``) belongs to a lost worker: another
    may take the row over, and the lost-work sweep resumes it (``lost``)."""

    owner_field: str
    heartbeat_field: str
    workable: Callable[[models.Model], bool]

    @staticmethod
    def beat_s() -> float:
        return float(settings.CHANGE_HEARTBEAT_SECONDS)

    def stale_after(self) -> timedelta:
        return timedelta(seconds=self.beat_s() * 3)

    def alive(self, row) -> bool:
        """A worker stamped ``row`` recently: its work runs, nobody else may take it."""
        beat = getattr(row, self.heartbeat_field)
        return bool(beat and timezone.now() - beat < self.stale_after())

    def take(self, rows: QuerySet, pk: int, owner: str, *, also: dict | None = None):
        """Claim the row ``pk`` for ``owner`` under a row lock unless a live worker has it
        (the row, or None). ``also``: fields set with the claim (a lane's state)."""
        with transaction.atomic():
            row = rows.select_for_update().filter(pk=pk).first()
            if row is None or not self.workable(row):
                return None
            if getattr(row, self.owner_field) not in ("", owner) and self.alive(row):
                return None
            values = {self.owner_field: owner, self.heartbeat_field: timezone.now(), **(also or {})}
            for field, value in values.items():
                setattr(row, field, value)
            row.save(update_fields=list(values))
        return row

    def beating(self, rows: QuerySet, pk: int, owner: str, name: str) -> Heartbeat:
        """Stamp the claimed row while the block runs (stops if another worker took it)."""
        mine = rows.filter(pk=pk, **{self.owner_field: owner})
        return Heartbeat(mine, self.heartbeat_field, self.beat_s(), name)

    def lost(self, rows: QuerySet, grace: timedelta = timedelta(0)) -> QuerySet:
        """The rows of ``rows`` whose stamps stopped ``stale_after`` (+ ``grace``) ago."""
        cutoff = timezone.now() - self.stale_after() - grace
        return rows.filter(**{f"{self.heartbeat_field}__lt": cutoff})
