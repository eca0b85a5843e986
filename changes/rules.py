"""Who may do what with a change, and when: one definition that the change page's buttons
(``ChangeRequest.allowed_actions``) and the services (``require``) both read.

Each action has a *who* rule (the acting user's permissions and relation to the change: a
failure is ``PermissionDenied``, a 403) and a *when* rule (the change's state: a failure is
``ChangeRefused``, a message saying what to do). Permissions are explicit, not Django's
"change"/"delete" stand-ins:

- ``changes.add_changerequest``: propose and comment (Operators and up);
- ``changes.approve_changerequest``: review others' changes (Approvers and up);
- ``changes.apply_changerequest``: apply approved changes, rebase, roll back or resume a change
  being applied (Operators and up);
- ``changes.override_changerequest``: act as the proposer on someone else's change: submit,
  withdraw; approve a change the simulator predicts would not start, with a written reason
  (``approve_override``) (Admins);
- ``changes.load_code_changerequest``: propose or approve a change that turns on a flag that
  makes the engine load code (``trust_remote_code``: the model repository's Python runs on
  the GPU server) (Admins).

The services check again under the change's row lock what a page may have shown stale, plus
what needs other rows (the deployment's lock, its maintenance window, a running benchmark).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.core.exceptions import PermissionDenied
from django.utils import timezone

from changes.advice import start_failures
from changes.choices import ChangeState
from controlpanel.workflow import four_eyes_problem
from hosts.services.code_loading import (  # noqa: F401 - the one rule, used by name here
    LOAD_CODE,
    code_loading_flags,
    code_loading_problem,
    require_code_loading,
)

S = ChangeState

PROPOSE = "changes.add_changerequest"
APPROVE = "changes.approve_changerequest"
APPLY = "changes.apply_changerequest"
OVERRIDE = "changes.override_changerequest"


class ChangeRefused(Exception):
    """A change action the rules do not allow now; the message says why and what to do."""


def stale_message(change) -> str:
    running = change.deployment.active_config
    was = f"v{change.base_config.version}" if change.base_config else "no config"
    now = f"v{running.version}" if running else "no config"
    return (
        f"The deployment's running config changed since this change was proposed ({was} → "
        f"{now}): rebase it onto the running config and have it reviewed again."
    )


def _state(change) -> str:
    return change.state_choice.label.lower()


def _is_proposer(user, change) -> bool:
    return user.pk == change.proposed_by_id


# --- who ---------------------------------------------------------------------------------------
def _proposer_or_override(verb: str) -> Callable:
    def who(user, change) -> str | None:
        if _is_proposer(user, change) or user.has_perm(OVERRIDE):
            return None
        return f"Only the proposer (or an Admin) may {verb} change #{change.pk}."

    return who


def _may_comment(user, change) -> str | None:
    return None if user.has_perm(PROPOSE) else "Operators and up comment on changes."


def _may_review(user, change) -> str | None:
    """The four-eyes rule, whatever the page showed."""
    if not user.has_perm(APPROVE):
        return "Only Approvers and Admins review changes."
    return four_eyes_problem(user, change.proposed_by_id, f"change #{change.pk}", made="proposed")


def _may_approve(user, change) -> str | None:
    return _may_review(user, change) or code_loading_problem(
        user, change.deployment.engine, change.diff()
    )


def _may_rebase(user, change) -> str | None:
    if _is_proposer(user, change) or user.has_perm(APPLY):
        return None
    return "Operators and the proposer rebase changes."


def _may_apply(user, change) -> str | None:
    return None if user.has_perm(APPLY) else "Only Operators and up apply changes."


def _may_override_start(user, change) -> str | None:
    """Approving a change predicted not to start: an Admin who may approve it anyway."""
    if not user.has_perm(OVERRIDE):
        return (
            f"The simulator predicts change #{change.pk} would not start: only an Admin may "
            "approve it, with a written reason."
        )
    return _may_approve(user, change)


# --- when --------------------------------------------------------------------------------------
def start_problem(change) -> str | None:
    """Why a change cannot be approved plainly: the simulator predicts the engine would
    refuse to start with it (``advice.start_failures``). The approve button, the override
    form and ``approve_change`` all read this one rule."""
    failures = start_failures(change.prediction)
    if not failures:
        return None
    stage, error = failures[0]
    return (
        f"The simulator predicts the engine would refuse to start with this config (stage "
        f"{stage}: {error}). Fix the proposal, or an Admin approves it with a written reason."
    )


def _fresh(change) -> str | None:
    return stale_message(change) if change.is_stale() else None


def _submittable(change) -> str | None:
    return change.transition_problem(S.PENDING) or _fresh(change)


def _reviewable(change) -> str | None:
    if change.state != S.PENDING:
        return (
            f"Change #{change.pk} is {_state(change)}: only changes pending review can be "
            "approved or rejected."
        )
    return _fresh(change)


def _approvable(change) -> str | None:
    return _reviewable(change) or start_problem(change)


def _overridable(change) -> str | None:
    """Only a change held back by a predicted start failure needs (or allows) an override."""
    problem = _reviewable(change)
    if problem:
        return problem
    if start_problem(change) is None:
        return f"Change #{change.pk} is not predicted to fail to start: approve it plainly."
    return None


def _withdrawable(change) -> str | None:
    return change.transition_problem(S.WITHDRAWN)


def _rebasable(change) -> str | None:
    return None if change.is_stale() else f"Change #{change.pk} is not stale: nothing to rebase."


def _appliable(change) -> str | None:
    if change.state != S.APPROVED:
        return f"Change #{change.pk} is {_state(change)}: only approved changes are applied."
    return _fresh(change)


def _being_applied(change) -> str | None:
    if change.holds_lock:
        return None
    return (
        f"Change #{change.pk} is {_state(change)}: only a change being applied can be rolled "
        "back this way (propose a rollback change instead)."
    )


def _resumable(change) -> str | None:
    if not change.holds_lock:
        return f"Change #{change.pk} is {_state(change)}: nothing to resume."
    if change.pipeline_alive():
        beat = timezone.localtime(change.pipeline_heartbeat_at)
        return (
            f"The pipeline of change #{change.pk} is alive (last heartbeat {beat:%H:%M:%S}): "
            "it goes on."
        )
    return None


def _always(change) -> str | None:
    return None


@dataclass(frozen=True)
class Rule:
    """One action: who may take it, and in which states of the change."""

    who: Callable
    when: Callable


RULES: dict[str, Rule] = {
    "comment": Rule(_may_comment, _always),
    "submit": Rule(_proposer_or_override("submit"), _submittable),
    "approve": Rule(_may_approve, _approvable),
    "approve_override": Rule(_may_override_start, _overridable),
    "reject": Rule(_may_review, _reviewable),
    "withdraw": Rule(_proposer_or_override("withdraw"), _withdrawable),
    "rebase": Rule(_may_rebase, _rebasable),
    "apply": Rule(_may_apply, _appliable),
    "rollback": Rule(_may_apply, _being_applied),
    "resume": Rule(_may_apply, _resumable),
}


def allowed(action: str, user, change) -> bool:
    rule = RULES[action]
    return rule.who(user, change) is None and rule.when(change) is None


def allowed_actions(user, change) -> set[str]:
    """The actions ``user`` may take on ``change`` now (the page's buttons)."""
    return {action for action in RULES if allowed(action, user, change)}


def require(action: str, user, change) -> None:
    """Raise ``PermissionDenied`` when ``user`` may not take ``action`` at all, or
    ``ChangeRefused`` when the change is not in a state for it. ``user`` None is the panel
    itself (beat resuming a lost pipeline): only the state is checked."""
    rule = RULES[action]
    if user is not None:
        problem = rule.who(user, change)
        if problem:
            raise PermissionDenied(problem)
    problem = rule.when(change)
    if problem:
        raise ChangeRefused(problem)
