"""The probe runner against a mock OpenAI-compatible server (httpx.MockTransport)."""

import asyncio
import json

import httpx

from benchmarks.quality.builtin import builtin_set
from benchmarks.quality.items import AnswerKey, ProbeItem, prompt_text
from benchmarks.quality.runner import request_for, run_probe, run_probe_sync

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def sample_items():
    return [
        ProbeItem(
            id="chat",
            category="factual",
            language="en",
            answer=AnswerKey(scorer="exact", expected="Paris"),
            messages=({"role": "user", "content": "Capital of France?"},),
            reference="Paris",
            max_tokens=16,
        ),
        ProbeItem(
            id="plain",
            category="math",
            language="ko",
            answer=AnswerKey(scorer="numeric", expected=4),
            prompt="2 더하기 2는?",
            reference="4",
            max_tokens=8,
        ),
        ProbeItem(
            id="json",
            category="json",
            language="en",
            answer=AnswerKey(scorer="json", schema=SCHEMA, fields={"n": 3}),
            messages=({"role": "user", "content": "Give n=3 as JSON"},),
            reference='{"n": 3}',
            structured=True,
        ),
        ProbeItem(
            id="boom",
            category="factual",
            language="en",
            answer=AnswerKey(scorer="exact", expected="x"),
            messages=({"role": "user", "content": "fail please"},),
            reference="x",
        ),
    ]


class Engine:
    """Answers from a prompt -> answer table, like the simulator's knowledge file."""

    def __init__(self, answers, delay=0.0):
        self.answers = answers
        self.delay = delay
        self.requests = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append((request.url.path, body, request.headers.get("authorization")))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        text = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
        if text == "fail please":
            return httpx.Response(500, text="engine exploded")
        answer = self.answers.get(text, "?")
        usage = {"prompt_tokens": 7, "completion_tokens": 2}
        if request.url.path == "/v1/chat/completions":
            choice = {"message": {"role": "assistant", "content": answer}}
        else:
            choice = {"text": answer}
        return httpx.Response(200, json={"choices": [choice], "usage": usage})


def test_requests_carry_greedy_settings_and_results_are_scored():
    engine = Engine(
        {"Capital of France?": "Paris.", "2 더하기 2는?": "답: 4", "Give n=3 as JSON": '{"n": 3}'}
    )
    seen = []
    results = run_probe_sync(
        "http://engine:8000/v1/",
        "m",
        sample_items(),
        api_key="k",
        seed=7,
        structured_output=True,
        on_result=seen.append,
        transport=httpx.MockTransport(engine),
    )
    assert [r.id for r in results] == ["chat", "plain", "json", "boom"]
    assert sorted(r.id for r in seen) == sorted(r.id for r in results)
    by_path = {}
    for path, body, auth in engine.requests:
        assert auth == "Bearer k"
        assert body["temperature"] == 0 and body["seed"] == 7 and body["model"] == "m"
        by_path.setdefault(path, []).append(body)
    assert [b["max_tokens"] for b in by_path["/v1/completions"]] == [8]
    chats = {b["messages"][-1]["content"]: b for b in by_path["/v1/chat/completions"]}
    assert "response_format" not in chats["Capital of France?"]
    assert chats["Give n=3 as JSON"]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": SCHEMA},
    }
    chat, plain, js, boom = results
    assert (chat.correct, chat.answer, chat.prompt_tokens, chat.completion_tokens) == (
        True,
        "Paris.",
        7,
        2,
    )
    assert plain.correct and chat.latency_ms >= 0
    assert (js.correct, js.json_valid, js.schema_ok) == (True, True, True)
    assert boom.correct is False and boom.error.startswith(
        "RuntimeError: HTTP 500: engine exploded"
    )


def test_without_structured_output_no_response_format_is_sent():
    path, body = request_for(sample_items()[2], "m", seed=0, structured_output=False)
    assert path == "/v1/chat/completions" and "response_format" not in body


def test_concurrency_is_bounded_and_connection_errors_are_recorded():
    engine = Engine({}, delay=0.01)
    its = builtin_set("format")
    results = asyncio.run(
        run_probe("http://engine", "m", its, concurrency=3, transport=httpx.MockTransport(engine))
    )
    assert len(results) == len(its) and engine.max_in_flight == 3
    assert all(r.correct is False and r.error is None for r in results)

    def refuse(request):
        raise httpx.ConnectError("connection refused")

    results = run_probe_sync("http://engine", "m", its[:2], transport=httpx.MockTransport(refuse))
    assert all(
        r.error == "ConnectError: connection refused" and r.correct is False for r in results
    )


def test_a_model_that_knows_the_references_scores_everything():
    its = builtin_set("panel-quick")
    engine = Engine({prompt_text(i): i.reference for i in its})
    results = run_probe_sync(
        "http://engine", "m", its, concurrency=16, transport=httpx.MockTransport(engine)
    )
    assert all(r.correct for r in results), [r.id for r in results if not r.correct][:5]
