"""The advisor reads a profile fitted to a real traffic sample the way the product saves one
(``profile_from_traffic``): its lengths are empirical ``[length, weight]`` pairs, so their
percentiles are weighted ones, and the whole advisor pass runs on it (it raised ``TypeError:
float() argument must be … not 'list'`` every minute)."""

from __future__ import annotations

import json

import pytest

from benchmarks.loadgen import traffic
from benchmarks.services.profiles import profile_from_traffic
from changes.services import diagnosis, diagnosis_facts
from tests.factories import make_deployment, make_finished_run, make_host

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_caches():
    diagnosis_facts.clear_caches()
    yield
    diagnosis_facts.clear_caches()


def sample() -> bytes:
    """90 short chats and 10 long documents, one system prompt shared by half of them."""
    lines = []
    for i in range(100):
        long = i % 10 == 9
        lines.append(
            {
                "timestamp": i * 0.5,
                "usage": {
                    "prompt_tokens": 4000 if long else 200,
                    "completion_tokens": 50 if long else 300,
                },
                "prefix_id": "sys" if i % 2 == 0 else None,
                "prefix_len": 100,
            }
        )
    return "\n".join(json.dumps(line) for line in lines).encode()


@pytest.fixture
def fitted(operator):
    rows = traffic.parse(sample(), filename="traffic.jsonl")
    return profile_from_traffic(operator, rows, mode="fit", name="real traffic")


def test_a_fitted_profile_stores_weighted_pairs(fitted):
    # The shape the advisor must read: not a list of numbers.
    assert fitted.spec["input_len"]["values"] == [[200, 0.9], [4000, 0.1]]


def test_the_advisor_reads_a_traffic_fitted_profile(fitted):
    deployment = make_deployment(make_host())
    make_finished_run(deployment, load_profile=fitted)
    facts = diagnosis.snapshot(deployment, live=False).traffic
    assert facts.input_p50 == 200 and facts.input_p99 == 4000
    assert facts.output_p50 == 300 and facts.output_p99 == 300
    # Input and output are drawn independently: P(total >= 4300) = 0.1 · 0.9 = 9 %.
    assert facts.total_p99 == 4300
    mean_input = 0.9 * 200 + 0.1 * 4000
    assert facts.shared_prefix_share == pytest.approx(0.5 * 100 / mean_input)


def test_the_whole_advisor_pass_runs_on_it(fitted):
    deployment = make_deployment(make_host())
    make_finished_run(deployment, load_profile=fitted)
    evaluation = diagnosis.refresh(deployment, live=False)
    assert evaluation.gathered.snapshot.traffic is not None
    assert diagnosis.last_evaluation(deployment)["evaluated_at"]
