"""Real time and virtual time run the same scheduler: a load test against the running server
and predict() for the same workload agree within 10 %."""

import asyncio
import random
import statistics

from hosts.simulator.predict import Workload, predict
from hosts.simulator.probe import stream_completion
from tests.hosts.simulator.conftest import LLAMA

WORKLOAD = Workload(num_requests=24, input_tokens=512, output_tokens=32, concurrency=8)
ARGS = {"max_model_len": 4096}


async def closed_loop(port: int, workload: Workload):
    rng = random.Random(1)
    prompts = [
        [rng.randrange(1000, 100000) for _ in range(workload.input_tokens)]
        for _ in range(workload.num_requests)
    ]
    queue = list(range(workload.num_requests))
    results = []

    async def worker():
        while queue:
            i = queue.pop(0)
            body = {
                "model": LLAMA,
                "prompt": prompts[i],
                "max_tokens": workload.output_tokens,
                "ignore_eos": True,
            }
            results.append(await stream_completion("127.0.0.1", port, body))

    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.gather(*(worker() for _ in range(workload.concurrency)))
    return results, loop.time() - start


def test_real_time_server_matches_prediction(sim_server):
    server = sim_server("vllm", "--gpu", "l4", "--max-model-len", "4096")
    results, elapsed = asyncio.run(closed_loop(server.port, WORKLOAD))
    assert all(r.ok and r.completion_tokens == WORKLOAD.output_tokens for r in results)
    measured = {
        "ttft": statistics.mean(r.ttft for r in results) * 1000,
        "itl": statistics.mean(x for r in results for x in r.itls) * 1000,
        "throughput": sum(r.completion_tokens for r in results) / elapsed,
    }
    predicted = predict("vllm", LLAMA, ARGS, "l4", WORKLOAD)
    expected = {
        "ttft": predicted["ttft_ms"]["mean"],
        "itl": predicted["itl_ms"]["mean"],
        "throughput": predicted["output_throughput"],
    }
    for key, value in expected.items():
        assert abs(measured[key] - value) <= 0.10 * value, (key, measured, expected)
