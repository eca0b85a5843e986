"""The advisor's shared-prefix evidence from a run's request log: the share of prompt tokens
that were a shared prefix, as the load generator really sent them (the prefix on top of the
input length, vLLM's --random-prefix-len), never capped at "100 % shared"."""

import pytest

from benchmarks import records as request_records
from benchmarks.loadgen.dataset import PromptFactory
from benchmarks.loadgen.profile import BUILTINS, build_spec
from benchmarks.models import RunRequestLog
from changes.services import diagnosis, diagnosis_facts
from tests.changes.test_diagnosis import request
from tests.factories import make_deployment, make_finished_run, make_host, make_profile

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

SHARED = BUILTINS["Shared system prompt"]["spec"]


@pytest.fixture(autouse=True)
def _fresh_caches():
    diagnosis_facts.clear_caches()
    yield
    diagnosis_facts.clear_caches()


def logged_run(deployment, spec: dict, n: int = 300):
    """A finished run of ``spec`` whose request log holds what the load generator sent;
    returns the run and the true share of prompt tokens that were a group's prefix."""
    profile = make_profile(spec=spec)
    run = make_finished_run(deployment, load_profile=profile)
    built = build_spec(spec, "http://x.invalid", "m")
    factory = PromptFactory(built.dataset, built.seed)
    rows, shared, total = [], 0, 0
    for i in range(n):
        p = factory.make(i)
        rows.append(request(i, prompt=len(p.payload), output=20, prefix=p.prefix_id))
        total += len(p.payload)
        if p.prefix_id is not None:
            prefix = factory._prefix_ids(p.prefix_id)
            shared += sum(1 for a, b in zip(p.payload, prefix, strict=False) if a == b)
    blob = request_records.encode(rows)
    RunRequestLog.objects.create(run=run, count=request_records.count(blob), data=blob)
    return run, shared / total


def share_seen(deployment) -> float:
    return diagnosis.snapshot(deployment, live=False).runs[0].lengths.shared_prefix_share


def test_the_shared_system_prompt_runs_share_is_measured_not_capped():
    deployment = make_deployment(make_host())
    _, true_share = logged_run(deployment, SHARED)
    seen = share_seen(deployment)
    # ~1,800 of ~2,100 tokens a request; it read 100 % when the prefix was cut into 300.
    assert 0.8 < true_share < 0.9
    assert seen == pytest.approx(true_share, abs=0.01)


def test_a_run_under_the_former_rule_counts_the_prefix_it_really_carried():
    deployment = make_deployment(make_host())
    _, true_share = logged_run(deployment, {**SHARED, "prefix_within_input": True})
    # The carriers' whole ~300-token prompts were prefix: ~89 % of the tokens, not 100 %.
    assert 0.85 < true_share < 0.95
    assert share_seen(deployment) == pytest.approx(true_share, abs=0.01)
