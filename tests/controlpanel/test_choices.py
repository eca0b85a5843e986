"""Badge colours are declared on the choices themselves (``ColouredChoices``)."""

from __future__ import annotations

import pytest

from benchmarks.choices import ProfileSource
from changes.choices import ChangeState, Decision, StageStatus
from controlpanel.choices import COLOURS, ColouredChoices, OperationStatus
from hosts.choices import DeploymentStatus, HostStatus, OperationOutcome

COLOURED = (
    OperationStatus,
    DeploymentStatus,
    HostStatus,
    OperationOutcome,
    ChangeState,
    Decision,
    StageStatus,
    ProfileSource,
)


@pytest.mark.parametrize("choices", COLOURED, ids=lambda c: c.__name__)
def test_every_member_has_a_badge_colour_the_stylesheet_knows(choices):
    assert issubclass(choices, ColouredChoices)
    assert {member.colour for member in choices} <= COLOURS


def test_the_colour_is_not_part_of_the_stored_choice():
    # Values and labels are those of plain TextChoices: the migrations do not see colours.
    assert OperationStatus.choices[0] == ("queued", "Queued")
    assert OperationStatus("failed").colour == "red" and OperationStatus.FAILED == "failed"
    assert OperationStatus.FAILED.label == "Failed" and OperationStatus.FAILED.finished
    assert (ChangeState.PENDING.colour, Decision.REJECT.colour) == ("amber", "red")


def test_a_member_without_a_known_colour_is_refused_when_declared():
    with pytest.raises(TypeError, match="'Shiny' is not a badge colour"):

        class Broken(ColouredChoices):
            A = "a", "Shiny"

    with pytest.raises(TypeError, match="'purple' is not a badge colour"):

        class Purple(ColouredChoices):
            A = "a", "A", "purple"
