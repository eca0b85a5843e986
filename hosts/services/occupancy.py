"""What may use a deployment now: the one rule every operation on an engine goes through.

Restarting or applying a config, measuring the engine with a benchmark, starting a change's
pipeline (and, later, a sweep's trial) each need the engine to themselves: a restart during a
benchmark makes its numbers describe a restart (the issue's 92.5 % error baseline, judged
"within limits"), and two runs measure each other. So each entry point, inside the
transaction that row-locks the deployment (``select_for_update``), calls::

    occupancy.require_free(deployment, Purpose.RESTART, owner=None)

which asks every registered *holder* kind what occupies the deployment and refuses with a
message naming it. Holders are registered by the app that owns them, from its
``AppConfig.ready`` (hosts cannot import the apps above it): engine operations (hosts), active
benchmark runs (benchmarks), the change holding the deployment's lock (changes). The row lock
serialises every entry point on one deployment, so the check and the row it then creates are
one step; each holder's partial unique index stays as the database's own backstop.

A holder may work through other rows: a change's pipeline runs its own baseline, restart and
verification. It passes itself as ``owner``; what the change's occupant names as its parts
(its runs and operations) is then the owner's own and does not refuse it. A sweep is one more
purpose and one more holder registered the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.db import models, transaction

from hosts.models import Deployment


class Purpose(models.TextChoices):
    """What an entry point wants the engine for (the label completes "Cannot …")."""

    RUN = "run", "start a benchmark on"
    RESTART = "restart", "restart"
    APPLY = "apply", "apply a config to"
    CHANGE = "change", "start applying a change to"
    SWEEP = "sweep", "start a tuning sweep on"
    PROBE = "probe", "start a quality probe on"


Key = tuple[str, object]


def key(obj: models.Model) -> Key:
    """A row's identity across models: ("app_label.model", pk)."""
    return (obj._meta.label_lower, obj.pk)


@dataclass(frozen=True)
class Occupant:
    """Something that holds a deployment now. ``text`` says what, who and why nothing else
    may use the engine meanwhile (a sentence); ``parts`` are the keys (``key``) of the rows it
    works through, which are its own when it asks (``require_free(owner=subject)``)."""

    subject: models.Model
    text: str
    parts: frozenset[Key] = field(default=frozenset())


Lookup = Callable[[Deployment], Iterable[Occupant]]
_HOLDERS: dict[str, Lookup] = {}


class DeploymentBusy(Exception):
    """The deployment is held by something else; ``occupants`` name what."""

    def __init__(self, message: str, occupants: list[Occupant]):
        super().__init__(message)
        self.occupants = occupants


def register(name: str, lookup: Lookup) -> None:
    """Declare a kind of holder: ``lookup(deployment)`` yields what of that kind occupies it.
    Called from the owning app's ``AppConfig.ready``; registering a name again replaces it."""
    _HOLDERS[name] = lookup


def holders() -> tuple[str, ...]:
    """The registered holder kinds, in registration order."""
    return tuple(_HOLDERS)


def occupants(deployment: Deployment) -> list[Occupant]:
    """Everything that occupies ``deployment`` now, from every registered holder."""
    return [occupant for lookup in _HOLDERS.values() for occupant in lookup(deployment)]


def require_free(
    deployment: Deployment, purpose: Purpose, *, owner: models.Model | None = None
) -> None:
    """Refuse (``DeploymentBusy``) unless nothing but ``owner`` and its parts occupies
    ``deployment``. Call it inside the transaction that row-locked the deployment, before
    creating the row that will occupy it: without the lock two requests can both find it free
    (the issue's run and restart started together)."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("require_free needs the transaction that row-locks the deployment")
    found = occupants(deployment)
    own: set[Key] = set()
    if owner is not None:
        own.add(key(owner))
        for occupant in found:
            if key(occupant.subject) == key(owner):
                own.update(occupant.parts)
    others = [occupant for occupant in found if key(occupant.subject) not in own]
    if others:
        message = f"Cannot {purpose.label} {deployment} now: " + " ".join(o.text for o in others)
        raise DeploymentBusy(message, others)
