"""The real-time server keeps its own model's pace: each step starts when the previous one was
planned to end, not when the event loop got round to it (issue: the server ran 6-15 % slower
than its model, more when the client took CPU).

The event loop's lateness is made deterministic here: every sleep of the engine oversleeps by
``LATE`` seconds, far more than a real loop does. The engine's own clock must not see it."""

from __future__ import annotations

import asyncio
import random

import pytest

from hosts.engines.catalog import GPUS
from hosts.simulator import runner as runner_module
from hosts.simulator.config import build_config
from hosts.simulator.core import EngineCore, Request
from hosts.simulator.runner import EngineRunner, wait_done
from tests.hosts.simulator.conftest import LLAMA

LATE = 0.004  # seconds each sleep overruns
SCALE = 0.1  # real seconds per simulated second


@pytest.fixture
def late_loop(monkeypatch):
    real_sleep = asyncio.sleep

    async def oversleep(delay, result=None):
        if delay > 0:
            delay += LATE
        return await real_sleep(delay, result)

    monkeypatch.setattr(runner_module.asyncio, "sleep", oversleep)
    # A loaded machine may stall the loop for tens of milliseconds: this test is about the
    # plan, so it never restarts the engine's clock.
    monkeypatch.setattr(runner_module, "MAX_CATCH_UP_S", 3600.0)


def config():
    return build_config("vllm", LLAMA, {"max_model_len": 4096}, GPUS["h100-sxm"])


def virtual_timeline(prompt_len: int, tokens: int) -> tuple[float, float]:
    """(first token, last token) of one request alone, in the model's own time."""
    core = EngineCore(config())
    req = Request("v", prompt_len, [], tokens, tokens, 0.0)
    core.add(req)
    clock = 0.0
    while core.has_work:
        clock = core.step(clock).end
    return req.first_token, req.last_token


def test_a_late_event_loop_does_not_slow_the_engine(late_loop):
    tokens, prompt = 40, list(range(1000, 1064))

    async def scenario():
        runner = EngineRunner(config(), time_scale=SCALE)
        await runner.start()
        try:
            req = runner.submit(prompt, tokens, ignore_eos=True, min_tokens=0)
            await wait_done(req)
        finally:
            await runner.stop()
        return req

    req = asyncio.run(scenario())
    first, last = virtual_timeline(len(prompt), tokens)
    assert req.num_output == tokens
    # Time between the first and last token: 39 decode steps of the model, not 39 × (step +
    # the loop's lateness).
    assert req.last_token - req.first_token == pytest.approx(last - first, rel=1e-9)
    assert req.first_token - req.first_scheduled == pytest.approx(first, rel=1e-9)


def test_requests_taken_late_wait_for_the_next_step(late_loop):
    """With the plan ahead of the real clock, a request the handler took after the next
    step's planned start must not be computed in a step that began before it arrived."""
    rng = random.Random(7)

    async def scenario():
        runner = EngineRunner(config(), time_scale=SCALE)
        await runner.start()
        requests = []
        try:
            for i in range(40):
                await asyncio.sleep(rng.uniform(0, 0.004))
                ids = [2000 + i] * rng.randint(8, 400)
                requests.append(runner.submit(ids, 6, ignore_eos=True, min_tokens=0))
            for req in requests:
                await wait_done(req)
        finally:
            await runner.stop()
        return requests

    requests = asyncio.run(scenario())
    assert all(r.num_output == 6 for r in requests)
    for r in requests:
        assert r.first_scheduled >= r.arrival, (r.id, r.arrival, r.first_scheduled)
        assert r.first_token > r.arrival


def test_abort_before_the_engine_saw_the_request():
    async def scenario():
        runner = EngineRunner(config(), time_scale=SCALE)
        await runner.start()
        try:
            req = runner.submit([5, 6, 7], 4, ignore_eos=True, min_tokens=0)
            runner.abort(req)  # before the engine task ran
            await asyncio.sleep(0.05)  # the engine task runs: it must find nothing to do
        finally:
            await runner.stop()
        return runner, req

    runner, req = asyncio.run(scenario())
    assert req.finish_reason == "abort" and req.num_output == 0
    assert not runner.core.has_work and runner.core.finished_requests == 1
