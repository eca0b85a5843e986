"""Each test's time budget, so that the run that adds a slow test shows it.

Loaded with ``-p tests.budget`` (pyproject's addopts): a plugin, not conftest hooks, because
the time a session-scoped fixture takes (the test database, a session's sshd) is only seen by
a plugin, and it is not the test's own cost.

A test's time is its set-up + call + tear-down, less the session-scoped set-up that happened to
run in its set-up and less the last test's tear-down (the session's, with it). A test over its
budget is listed at the end of the run, after pytest's own ``--durations=30`` table (`make test`
passes both). ``--budget-unit``/``--budget-process`` change the budgets for a run. Reports
only: a slow test is a finding, not a failure.
"""

from __future__ import annotations

import time

import pytest

BUDGET_UNIT_S = 10.0  # a test with no mark
BUDGET_PROCESS_S = 60.0  # a test marked integration or e2e: it starts real processes

_shared_setup = pytest.StashKey[list]()
_last = pytest.StashKey[bool]()


def pytest_addoption(parser):
    group = parser.getgroup("budget", "per-test time budget (tests/budget.py)")
    group.addoption("--budget-unit", type=float, default=BUDGET_UNIT_S, help="seconds a unit test")
    group.addoption(
        "--budget-process", type=float, default=BUDGET_PROCESS_S, help="seconds a process test"
    )


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # reports reach the xdist controller, or the one process
        budget = Budget(config.getoption("budget_unit"), config.getoption("budget_process"))
        config.pluginmanager.register(budget, "time-budget")


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if fixturedef.scope != "session":
        return (yield)
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        request.config.stash.setdefault(_shared_setup, []).append(time.perf_counter() - start)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # The last test's tear-down also tears the session down (its database, its servers).
    item.stash[_last] = nextitem is None
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    # user_properties travel with the report to the xdist controller, which keeps the budget.
    if call.when == "setup":
        shared = item.config.stash.get(_shared_setup, [])
        if shared:
            report.user_properties.append(("shared_s", sum(shared)))
            shared.clear()
    elif call.when == "teardown" and item.stash.get(_last, False):
        report.user_properties.append(("shared_s", report.duration))
    return report


class Budget:
    """Adds up each test's phases where the reports arrive and lists, at the end, the tests
    that took longer than their budget."""

    def __init__(self, unit_s: float, process_s: float):
        self.unit_s, self.process_s = unit_s, process_s
        self.spent: dict[str, float] = {}
        self.limit: dict[str, float] = {}

    def pytest_runtest_logreport(self, report):
        shared = sum(v for k, v in report.user_properties if k == "shared_s")
        self.spent[report.nodeid] = self.spent.get(report.nodeid, 0.0) + report.duration - shared
        process = "integration" in report.keywords or "e2e" in report.keywords
        self.limit[report.nodeid] = self.process_s if process else self.unit_s

    def over(self) -> list[tuple[float, float, str]]:
        return sorted(
            (
                (spent, self.limit[nodeid], nodeid)
                for nodeid, spent in self.spent.items()
                if spent > self.limit[nodeid]
            ),
            reverse=True,
        )

    def pytest_terminal_summary(self, terminalreporter):
        if not self.spent:
            return  # nothing ran (--collect-only, an empty selection)
        terminalreporter.write_sep(
            "=",
            f"tests over their time budget ({self.unit_s:g} s a unit test, {self.process_s:g} s "
            "one marked integration or e2e; tests/budget.py)",
        )
        over = self.over()
        if not over:
            terminalreporter.write_line("none")
        for spent, limit, nodeid in over:
            terminalreporter.write_line(f"{spent:8.2f}s  over {limit:g} s  {nodeid}")
