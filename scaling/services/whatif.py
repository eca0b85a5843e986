"""Placeholder: what-if plans (filled in by the what-if work)."""


def execute_plan(plan) -> None:
    raise NotImplementedError


def fail_plan(plan, error: str) -> None:
    raise NotImplementedError
