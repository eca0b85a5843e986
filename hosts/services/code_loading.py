"""Who may turn on engine options that run code from outside the panel (``--trust-remote-code``
and the like, ``Flag.loads_code``): one rule for every entry point that sets an engine's
options (a change, a sweep, a new deployment, the API), so that none is a way around another
(issue 38: a new deployment took ``trust_remote_code`` from an Operator that a change refused)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import PermissionDenied

from hosts.engines import get_spec

# The permission (an Admin's) that allows it; named after the change request it began with.
LOAD_CODE = "changes.load_code_changerequest"


def code_loading_flags(engine: str, diff: dict) -> list[str]:
    """The options a diff (``{dest: (running, proposed)}``) turns on that make the engine load
    code (``Flag.loads_code``); turning one off needs no one special."""
    spec = get_spec(engine)
    return [
        spec.by_dest[dest].option
        for dest, (_, new) in diff.items()
        if dest in spec.by_dest and spec.by_dest[dest].loads_code_with(new)
    ]


def code_loading_problem(user, engine: str, diff: dict) -> str | None:
    """Why ``user`` may not propose or approve ``diff`` (it turns on code loading), or None."""
    flags = code_loading_flags(engine, diff)
    if not flags or (user is not None and user.has_perm(LOAD_CODE)):
        return None
    return (
        f"{', '.join(flags)} makes the engine run code from outside the panel (the model "
        "repository's Python): only an Admin may propose or approve it."
    )


def require_code_loading(user, engine: str, diff: dict) -> None:
    """PermissionDenied when ``user`` may not propose ``diff`` (see code_loading_problem)."""
    problem = code_loading_problem(user, engine, diff)
    if problem:
        raise PermissionDenied(problem)


def as_diff(settings: Mapping[str, Any]) -> dict:
    """A new engine's settings as a diff from nothing, for the rule above."""
    return {dest: (None, value) for dest, value in settings.items()}
