"""Choices shared by every app, and the base of every choice shown as a coloured badge.

A badge's colour is declared on the choice itself, NetBox-style (``utilities/choices.py``):
each member of a ``ColouredChoices`` is ``value, label, colour``, and ``member.colour`` is the
CSS class of its badge (``grey``, ``blue``, ``green``, ``amber``, ``red``: see base.css).
Pages and live updates read ``colour``; no template or script keeps its own mapping.
"""

from django.db import models
from django.db.models.enums import ChoicesType

COLOURS = frozenset({"grey", "blue", "green", "amber", "red"})


class ColouredChoicesType(ChoicesType):
    """Takes each member's colour off its declaration before Django reads value and label,
    so the choices stored in the database (and the migrations) are those of plain
    ``TextChoices``."""

    def __new__(metacls, classname, bases, classdict, **kwds):
        colours = {}
        for key in classdict._member_names:
            *declared, colour = classdict[key]
            if colour not in COLOURS:
                raise TypeError(f"{classname}.{key}: {colour!r} is not a badge colour")
            colours[key] = colour
            # dict.__setitem__: the enum namespace refuses a second assignment otherwise.
            dict.__setitem__(classdict, key, tuple(declared))
        cls = super().__new__(metacls, classname, bases, classdict, **kwds)
        for key, colour in colours.items():
            cls[key]._colour_ = colour
        return cls


class ColouredChoices(models.TextChoices, metaclass=ColouredChoicesType):
    """``TextChoices`` whose every member declares its badge colour:
    ``QUEUED = "queued", "Queued", "grey"``."""

    @property
    def colour(self) -> str:
        return self._colour_


class OperationStatus(ColouredChoices):
    QUEUED = "queued", "Queued", "grey"
    RUNNING = "running", "Running", "blue"
    SUCCEEDED = "succeeded", "Succeeded", "green"
    FAILED = "failed", "Failed", "red"
    CANCELLED = "cancelled", "Cancelled", "amber"

    @property
    def finished(self) -> bool:
        return self in (self.SUCCEEDED, self.FAILED, self.CANCELLED)
