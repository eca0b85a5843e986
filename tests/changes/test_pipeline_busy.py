"""A change verified on a busy machine (issue 37, "done means"): two CPU burners load both cores
while the pipeline measures its baseline and its verification against a real host agent's
simulator, with the panel's default rule (client-limited runs refused, not merely reported).
The verdict then either says it cannot judge because a run is client-limited, or it rests on
two runs the rule found usable; never "verified" on a starved client's numbers (an ITL p95 of
0.0 → 0.0 read as "ok")."""

from __future__ import annotations

import pytest

from benchmarks.evidence import MODE_ENV, usable_as_evidence
from changes.verdict import CANNOT_JUDGE
from tests.benchmarks.test_client_limited_busy import burners  # noqa: F401 - shared fixture
from tests.changes.test_pipeline_agent import (  # noqa: F401 - shared fixtures
    PROFILE,
    agent,
    apply_inline,
    approved,
    fleet,
)
from tests.factories import make_profile

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.mark.timing
def test_a_change_verified_under_cpu_burners_cannot_judge_or_rests_on_usable_runs(
    fleet,  # noqa: F811
    burners,  # noqa: F811
    operator,
    approver,
    monkeypatch,
):
    # Integration tests run with the rule in "report" mode (tests/conftest.py): this one is
    # about the refusal itself, so the panel's default.
    monkeypatch.delenv(MODE_ENV, raising=False)
    change = approved(
        operator,
        approver,
        fleet,
        {"max_num_seqs": 128},
        verify_profile=make_profile(spec=PROFILE),
        thresholds={"max_ttft_p95_regression": 1.0, "max_itl_p95_regression": 1.0},
    )
    change = apply_inline(operator, change)
    runs = [r for r in (change.baseline_run, change.verification_run) if r is not None]
    assert len(runs) == 2, (change.state, change.outcome)
    limited = [r for r in runs if usable_as_evidence(r).limited]
    reason = change.comparison.get("reason", "")
    if limited:
        # Refused in words, and never applied as verified.
        assert change.state == "unverified", (change.state, change.outcome)
        assert reason.startswith(CANNOT_JUDGE) and "client-limited" in reason, reason
        assert change.comparison.get("outcome") == "inconclusive"
        for run in limited:
            assert run.numbered_name in reason, reason
    else:
        # Both clients kept up: then they saw the tokens apart, and the verdict judged them.
        assert all(r.itl_p50_ms and r.itl_p50_ms > 0 for r in runs), [r.pk for r in runs]
        assert change.state in ("applied", "unverified", "rolled_back"), (
            change.state,
            change.outcome,
        )
