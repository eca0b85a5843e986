"""The change page puts predicted harm where a reviewer reads first (issue 21): a predicted
regression past ``advice.PREDICTED_HARM`` is a warning with its stage and numbers."""

from __future__ import annotations

import pytest

from changes import advice
from changes.models import ChangeRequest
from changes.services import review
from tests.factories import make_config, make_deployment, make_gpu, make_host, make_profile

pytestmark = pytest.mark.django_db

PROFILE = {
    "stages": [
        {"name": "steady", "concurrency": 2, "num_requests": 32},
        {"name": "peak", "concurrency": 16, "num_requests": 64},
    ],
    "input_len": {"kind": "fixed", "mean": 256},
    "output_len": {"kind": "fixed", "mean": 64},
}


@pytest.fixture
def deployment(db):
    deployment = make_deployment(make_host(name="gpu-a"), name="chat")
    make_gpu(deployment.host)
    deployment.active_config = make_config(
        deployment, {"max_num_seqs": 64, "gpu_memory_utilization": 0.9}
    )
    deployment.save()
    return deployment


def propose(actor, deployment, **settings):
    proposed = {**deployment.active_config.settings, **settings}
    return review.propose_change(
        actor,
        deployment,
        title="Try it",
        rationale="measured",
        settings=proposed,
        verify_profile=make_profile("chat", spec=PROFILE),
    )


def fresh(change) -> ChangeRequest:
    return ChangeRequest.objects.get(pk=change.pk)


# --- predicted harm is a warning ---------------------------------------------------------------
def test_a_predicted_regression_is_a_warning_with_its_stage_and_numbers(operator, deployment):
    change = propose(operator, deployment, max_num_seqs=2)  # queues at peak: TTFT explodes
    harm = [w for w in change.warnings if w["code"] == "predicted_regression"]
    ttft = next(w["message"] for w in harm if "TTFT p95" in w["message"])
    assert "peak +" in ttft and " ms → " in ttft and "Warned at +20 %" in ttft
    # The stage table's number is the warning's number.
    peak = next(s for s in change.prediction["stages"] if s["stage"] == "peak")
    metric = next(m for m in peak["metrics"] if m["key"] == "ttft_p95_ms")
    assert f"peak {metric['change'] * 100:+.0f} %" in ttft


def test_the_warnings_sit_above_the_actions_and_name_the_harm(client, operator, deployment):
    change = propose(operator, deployment, max_num_seqs=2)
    client.force_login(operator)
    html = client.get(change.get_absolute_url()).content.decode()
    assert 'data-warning="predicted_regression"' in html and "Predicted harm:" in html
    assert "No warnings" not in html
    assert html.index('data-testid="warnings"') < html.index('data-testid="actions"')
    assert html.index('data-testid="warnings"') < html.index('data-testid="prediction"')


def test_an_older_change_without_stored_harm_warnings_still_shows_them(
    client, operator, deployment
):
    change = propose(operator, deployment, max_num_seqs=2)
    ChangeRequest.objects.filter(pk=change.pk).update(warnings=[])  # proposed before the rule
    client.force_login(operator)
    html = client.get(change.get_absolute_url()).content.decode()
    assert html.count('data-warning="predicted_regression"') >= 1


def test_small_predicted_changes_are_no_warning():
    prediction = {
        "available": True,
        "stages": [
            {
                "stage": "main",
                "after_error": None,
                "metrics": [
                    {
                        "key": "ttft_p95_ms",
                        "label": "TTFT p95",
                        "unit": "ms",
                        "change": 0.19,
                        "before": 100.0,
                        "after": 119.0,
                    },
                    {
                        "key": "output_throughput",
                        "label": "Output tok/s",
                        "unit": "tok/s",
                        "change": -0.09,
                        "before": 1000,
                        "after": 910,
                    },
                    {
                        "key": "ttft_p50_ms",
                        "label": "TTFT p50",
                        "unit": "ms",
                        "change": 3.0,
                        "before": 10.0,
                        "after": 40.0,
                    },
                ],
            }
        ],
    }
    assert advice.prediction_warnings(prediction) == []
    prediction["stages"][0]["metrics"][1]["change"] = -0.10
    (warning,) = advice.prediction_warnings(prediction)
    assert warning.code == "predicted_regression"
    assert "main -10 % (1,000 tok/s → 910 tok/s)" in warning.message
