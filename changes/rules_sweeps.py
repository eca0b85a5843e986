"""Who may do what with a tuning sweep, and when: the sweep page's buttons and the services
read the same rules (as ``changes.rules`` does for changes).

A sweep restarts engines and runs their configs for minutes, so it takes the change
permissions: Operators propose and run sweeps (``add_changerequest``, ``apply_changerequest``),
Approvers review them (``approve_changerequest``) — never their own (four-eyes) — and a sweep
whose space turns on a flag that loads code needs an Admin, as such a change does.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied

from changes.choices import SweepState
from changes.rules import APPLY, APPROVE, OVERRIDE, PROPOSE, Rule
from controlpanel.workflow import four_eyes_problem

S = SweepState


class SweepRefused(Exception):
    """A sweep action the rules do not allow now; the message says why and what to do."""


def _state(sweep) -> str:
    return sweep.state_choice.label.lower()


def _may_propose(user, sweep) -> str | None:
    return None if user.has_perm(PROPOSE) else "Operators and up run tuning sweeps."


def _may_review(user, sweep) -> str | None:
    if not user.has_perm(APPROVE):
        return "Only Approvers and Admins review sweeps."
    return four_eyes_problem(user, sweep.created_by_id, f"sweep #{sweep.pk}")


def _may_run(user, sweep) -> str | None:
    return None if user.has_perm(APPLY) else "Only Operators and up run a sweep's trials."


def _may_cancel(user, sweep) -> str | None:
    if user.pk == sweep.created_by_id or user.has_perm(APPLY) or user.has_perm(OVERRIDE):
        return None
    return "Only the sweep's author or an Operator may cancel it."


def _reviewable(sweep) -> str | None:
    if sweep.state != S.PENDING:
        return f"Sweep #{sweep.pk} is {_state(sweep)}: only sweeps pending review are reviewed."
    return None


def _runnable(sweep) -> str | None:
    if sweep.state != S.READY:
        return f"Sweep #{sweep.pk} is {_state(sweep)}: only a sweep ready to run is started."
    return None


def _cancellable(sweep) -> str | None:
    if sweep.is_finished:
        return f"Sweep #{sweep.pk} is {_state(sweep)}: nothing to cancel."
    if sweep.cancel_requested:
        return f"Sweep #{sweep.pk} is already being cancelled."
    return None


def _proposable(sweep) -> str | None:
    if sweep.state != S.DONE or sweep.winner_id is None:
        return f"Sweep #{sweep.pk} has no winner to propose."
    if sweep.winner.is_control:
        return "The running config won: there is nothing to change."
    return None


def _always(sweep) -> str | None:
    return None


RULES: dict[str, Rule] = {
    "approve": Rule(_may_review, _reviewable),
    "reject": Rule(_may_review, _reviewable),
    "start": Rule(_may_run, _runnable),
    "cancel": Rule(_may_cancel, _cancellable),
    "propose": Rule(_may_propose, _proposable),
    "create": Rule(_may_propose, _always),
}


def allowed_actions(user, sweep) -> set[str]:
    return {
        action
        for action, rule in RULES.items()
        if action != "create" and rule.who(user, sweep) is None and rule.when(sweep) is None
    }


def require(action: str, user, sweep) -> None:
    """``PermissionDenied`` when ``user`` may never take ``action`` on ``sweep``,
    ``SweepRefused`` when not now. ``user`` None is the panel itself."""
    rule = RULES[action]
    if user is not None:
        problem = rule.who(user, sweep)
        if problem:
            raise PermissionDenied(problem)
    problem = rule.when(sweep)
    if problem:
        raise SweepRefused(problem)
