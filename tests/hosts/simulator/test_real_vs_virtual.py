"""Real time and virtual time run the same scheduler: a load test against the running server
and predict() for the same workload agree within 10 %."""

import pytest

from benchmarks.loadgen import Dataset, LengthDist, LoadSpec, Stage, run
from hosts.simulator.predict import Workload, predict
from tests.hosts.simulator.conftest import LLAMA

WORKLOAD = Workload(num_requests=24, input_tokens=512, output_tokens=32, concurrency=8)


@pytest.mark.timing
def test_real_time_server_matches_prediction(sim_server):
    server = sim_server("vllm", "--gpu", "l4", "--max-model-len", "4096")
    spec = LoadSpec(
        base_url=server.url,
        model=LLAMA,
        scrape_metrics=False,
        dataset=Dataset(
            LengthDist("fixed", WORKLOAD.input_tokens), LengthDist("fixed", WORKLOAD.output_tokens)
        ),
        stages=(
            Stage("closed", concurrency=WORKLOAD.concurrency, num_requests=WORKLOAD.num_requests),
        ),
    )
    result = run(spec).to_dict()
    assert result["completed"] == WORKLOAD.num_requests
    assert result["total_output_tokens"] == WORKLOAD.num_requests * WORKLOAD.output_tokens
    measured = {
        "ttft": result["mean_ttft_ms"],
        "itl": result["mean_itl_ms"],
        "throughput": result["output_throughput"],
    }
    predicted = predict("vllm", LLAMA, {"max_model_len": 4096}, "l4", WORKLOAD)
    expected = {
        "ttft": predicted["ttft_ms"]["mean"],
        "itl": predicted["itl_ms"]["mean"],
        "throughput": predicted["output_throughput"],
    }
    for key, value in expected.items():
        assert abs(measured[key] - value) <= 0.10 * value, (key, measured, expected)
