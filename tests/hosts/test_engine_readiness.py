"""The one readiness rule (``hosts.engines.readiness``): the verdict on what /health and
/v1/models answered, the httpx probes (sync and async) and the wait loop with a fake clock."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from hosts.engines.readiness import (
    Answer,
    aprobe,
    ask,
    judge,
    probe,
    served_models,
    wait_ready,
)
from tests.conftest import free_port

MODELS = json.dumps({"object": "list", "data": [{"id": "llama", "object": "model"}]}).encode()


def test_ready_when_health_is_200_and_a_model_is_listed():
    assert judge(Answer(200), Answer(200, MODELS)) is None
    assert served_models(MODELS) == ("llama",)


@pytest.mark.parametrize(
    ("health", "models", "problem"),
    [
        (Answer(503), None, "/health answered 503"),
        (Answer(200), Answer(200, b'{"object": "list", "data": []}'), "/v1/models lists no model"),
        (Answer(200), Answer(200, b"<html>hello</html>"), "did not answer an OpenAI model list"),
        (Answer(200), Answer(200, b'{"data": "llama"}'), "did not answer an OpenAI model list"),
        (Answer(200), Answer(200, b'["llama"]'), "did not answer an OpenAI model list"),
        (Answer(200), Answer(401, b"{}"), "/v1/models answered 401"),
        (Answer(200), Answer(500, b""), "/v1/models answered 500"),
        (Answer(None, error="ConnectError: refused"), None, "ConnectError: refused"),
        (Answer(None), None, "/health: no answer"),
        (Answer(200), Answer(None, error="ReadTimeout: timed out"), "ReadTimeout: timed out"),
        (Answer(200), None, "/v1/models was not asked"),
    ],
)
def test_not_ready_says_why(health, models, problem):
    assert problem in judge(health, models)


def test_a_server_without_a_health_route_is_judged_on_its_model_list():
    assert judge(Answer(404), Answer(200, MODELS)) is None
    assert judge(Answer(404), Answer(404)) == "/v1/models answered 404"


def test_ask_asks_for_models_only_after_health_passes():
    asked: list[str] = []

    def get(path: str) -> Answer:
        asked.append(path)
        return Answer(503)

    assert ask(get).problem == "/health answered 503" and asked == ["/health"]
    assert ask(get, engine="sglang").problem == "/health answered 503"


def engine(routes: dict[str, object]) -> httpx.MockTransport:
    """An engine answering each path with (status, body), or raising the exception given."""

    def handle(request: httpx.Request) -> httpx.Response:
        answer = routes.get(request.url.path, (404, b""))
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer[0], content=answer[1])

    return httpx.MockTransport(handle)


def test_probe_ready_with_the_served_models():
    routes = {"/health": (200, b""), "/v1/models": (200, MODELS)}
    with httpx.Client(transport=engine(routes)) as client:
        state = probe(client, "http://engine:8000/")
    assert state.ready and state.models == ("llama",)


def test_probe_health_503_does_not_ask_for_models():
    routes = {"/health": (503, b""), "/v1/models": RuntimeError("must not be asked")}
    with httpx.Client(transport=engine(routes)) as client:
        state = probe(client, "http://engine:8000")
    assert not state.ready and state.problem == "/health answered 503" and state.models == ()


def test_probe_timeout_is_a_reason_not_an_exception():
    routes = {"/health": httpx.ReadTimeout("timed out")}
    with httpx.Client(transport=engine(routes)) as client:
        assert probe(client, "http://engine:8000").problem == "ReadTimeout: timed out"


def test_probe_connection_refused_on_a_real_port():
    with httpx.Client() as client:
        problem = probe(client, f"http://127.0.0.1:{free_port()}", timeout=2).problem
    assert problem.startswith("ConnectError")


def test_aprobe_applies_the_same_rule():
    async def main():
        routes = {"/health": (200, b""), "/v1/models": (200, b'{"data": []}')}
        async with httpx.AsyncClient(transport=engine(routes)) as client:
            return await aprobe(client, "http://engine:8000")

    assert asyncio.run(main()).problem == "/v1/models lists no model"


class FakeClock:
    def __init__(self):
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_wait_ready_returns_none_once_the_check_passes():
    clock = FakeClock()
    answers = iter(["/health answered 503", "/v1/models lists no model", None])
    assert wait_ready(lambda: next(answers), 10, clock=clock, sleep=clock.sleep) is None
    assert clock.sleeps == [0.25, 0.25]


def test_wait_ready_gives_the_last_problem_at_the_deadline():
    clock = FakeClock()
    problem = wait_ready(
        lambda: "/health answered 503", 1.0, interval_s=0.4, clock=clock, sleep=clock.sleep
    )
    assert problem == "/health answered 503"
    assert clock.sleeps == pytest.approx([0.4, 0.4, 0.2])  # never sleeps past the deadline


def test_wait_ready_checks_once_even_without_time_and_lets_a_check_give_up():
    clock = FakeClock()
    assert wait_ready(lambda: None, 0, clock=clock, sleep=clock.sleep) is None

    def exited():
        raise RuntimeError("the engine exited")

    with pytest.raises(RuntimeError, match="exited"):
        wait_ready(exited, 10, clock=clock, sleep=clock.sleep)
