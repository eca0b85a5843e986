"""The real-time server keeps its own model's pace: each step starts when the previous one was
planned to end, not when the event loop got round to it (issue: the server ran 6-15 % slower
than its model, more when the client took CPU).

The event loop's lateness is made deterministic here: every sleep of the engine oversleeps by
``LATE`` seconds, far more than a real loop does. The engine's own clock must not see it."""

from __future__ import annotations

import asyncio
import random

import httpx
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


# Real sleeps that overrun by 0.1 s: a busy machine overruns them by other amounts too.
@pytest.mark.timing
def test_a_stall_restarts_the_clock_instead_of_a_burst(monkeypatch):
    """A loop stalled for longer than MAX_CATCH_UP_S (here: every sleep overruns by 0.1 s)
    restarts the engine's clock: the next step starts at "now", so the tokens come at the
    stalled pace rather than all at once, and the restarts are counted."""
    real_sleep = asyncio.sleep

    async def stall(delay, result=None):
        return await real_sleep(delay + 0.1 if delay > 0 else delay, result)

    monkeypatch.setattr(runner_module.asyncio, "sleep", stall)
    tokens = 5

    async def scenario():
        runner = EngineRunner(config(), time_scale=SCALE)
        await runner.start()
        try:
            req = runner.submit(list(range(3000, 3064)), tokens, ignore_eos=True, min_tokens=0)
            await wait_done(req)
        finally:
            await runner.stop()
        return runner, req

    runner, req = asyncio.run(scenario())
    first, last = virtual_timeline(64, tokens)
    assert runner.clock_resets >= tokens - 1
    # Each of the 4 gaps took at least the stall (0.1 s real = 1 s simulated at SCALE 0.1).
    assert req.last_token - req.first_token > (last - first) + 4 * 0.1 / SCALE * 0.9


def test_loop_lag_reports_clock_restarts(sim_server):
    server = sim_server("vllm", "--max-model-len", "4096")
    body = httpx.get(server.url + "/simulator/loop-lag").json()
    assert body["clock_resets"] == 0 and "p99_ms" in body
