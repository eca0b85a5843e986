"""The prediction models the GPUs the deployment uses, not every GPU its host has."""

import pytest

from changes.services.facts import gpu_count, gpu_facts
from tests.factories import make_deployment, make_gpu, make_host

pytestmark = pytest.mark.django_db


def test_a_one_gpu_deployment_on_a_two_gpu_host_is_predicted_on_one_gpu():
    host = make_host()
    gpus = [make_gpu(host), make_gpu(host)]
    simulated = make_deployment(
        host, runner="simulator", simulator={"gpu": "h100-sxm", "num_gpus": 2}
    )
    simulated.gpus.set([gpus[1]])
    assert gpu_facts(simulated)[:2] == ("h100-sxm", 1)
    real = make_deployment(host)
    real.gpus.set([gpus[0]])
    assert gpu_count(real) == 1
    # Given no GPUs by index, a deployment runs on the whole host (or its simulator's count).
    assert gpu_count(make_deployment(host)) == 2
    whole = make_deployment(host, runner="simulator", simulator={"num_gpus": 2})
    assert gpu_facts(whole)[:2] == ("h100-sxm", 2)


def test_a_sweep_prices_one_gpu_of_the_host_not_the_whole_host():
    from decimal import Decimal

    from changes.services.sweeps import target

    host = make_host(hourly_price=Decimal("4.90"))
    gpus = [make_gpu(host), make_gpu(host)]
    deployment = make_deployment(
        host, runner="simulator", simulator={"gpu": "h100-sxm", "num_gpus": 2}
    )
    deployment.gpus.set([gpus[0]])
    modelled = target(deployment)
    assert modelled["num_gpus"] == 1
    assert modelled["price_per_gpu_hour"] == pytest.approx(2.45)
