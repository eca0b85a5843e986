"""Refusals as each engine words them: vLLM 0.11.0 (SamplingParams._verify_args, its pydantic
request models, the V1 processor) and SGLang 0.5.3 (SamplingParams.verify, its serving classes),
with each engine's error envelope."""

import json

import httpx
import pytest

from tests.hosts.simulator.test_protocol import SGLANG_ARGS, VLLM_ARGS

VLLM_REFUSALS = [
    ({"top_p": 2}, "top_p must be in (0, 1], got 2.0."),
    ({"top_p": 0}, "top_p must be in (0, 1], got 0.0."),
    ({"temperature": -0.5}, "temperature must be non-negative, got -0.5."),
    ({"n": 0}, "n must be at least 1, got 0."),
    ({"max_tokens": 0}, "max_tokens must be at least 1, got 0."),
    ({"presence_penalty": 3}, "presence_penalty must be in [-2, 2], got 3.0."),
    ({"frequency_penalty": -2.5}, "frequency_penalty must be in [-2, 2], got -2.5."),
    ({"repetition_penalty": 0}, "repetition_penalty must be greater than zero, got 0.0."),
    ({"top_k": -2}, "top_k must be 0 (disable), or at least 1, got -2."),
    ({"min_p": 1.5}, "min_p must be in [0, 1], got 1.5."),
    (
        {"min_tokens": 9, "max_tokens": 4},
        "min_tokens must be less than or equal to max_tokens=4, got 9.",
    ),
    ({"stop": ["a", ""]}, "stop cannot contain an empty string."),
    ({"logprobs": 21}, "Requested sample logprobs of 21, which is greater than max allowed: 20"),
    ({"n": 3, "best_of": 2}, "best_of must be greater than or equal to n, got n=3 and best_of=2."),
    ({"best_of": 2}, "vLLM V1 does not yet support best_of."),
    ({"suffix": "end"}, "suffix is not currently supported"),
]
SGLANG_REFUSALS = [
    ({"top_p": 2}, "top_p must be in (0, 1], got 2.0."),
    ({"temperature": -0.5}, "temperature must be non-negative, got -0.5."),
    ({"top_k": 0}, "top_k must be -1 (disable) or at least 1, got 0."),
    ({"min_p": 1.5}, "min_p must be in [0, 1], got 1.5."),
    ({"presence_penalty": 3}, "presence_penalty must be in [-2, 2], got 3.0."),
    ({"repetition_penalty": 2.5}, "repetition_penalty must be in [0, 2], got 2.5."),
    (
        {"min_tokens": 9, "max_tokens": 4},
        "min_new_tokens must be in [0, max_new_tokens(4)], got 9.",
    ),
]


@pytest.fixture(scope="module")
def servers():
    from tests.hosts.simulator.conftest import SimServer

    started = {
        "vllm": SimServer("vllm", [*VLLM_ARGS, "--time-scale", "0"]),
        "sglang": SimServer("sglang", [*SGLANG_ARGS, "--time-scale", "0"]),
    }
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.stop()


def post(server, body: dict, path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(server.url + path, json={"prompt": "Hi.", **body}, timeout=30)


@pytest.mark.parametrize(("extra", "message"), VLLM_REFUSALS)
def test_vllm_sampling_refusals(servers, extra, message):
    response = post(servers["vllm"], extra)
    assert response.status_code == 400
    assert response.json() == {
        "error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    }


@pytest.mark.parametrize(("extra", "message"), SGLANG_REFUSALS)
def test_sglang_sampling_refusals(servers, extra, message):
    response = post(servers["sglang"], extra)
    assert response.status_code == 400
    assert response.json() == {
        "object": "error",
        "message": message,
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


def test_sglang_refuses_inside_a_stream_that_has_begun(servers):
    """SGLang checks the sampling parameters in its tokenizer manager, after the streaming
    response has started: a 200 whose one event is the error; vLLM refuses with a 400."""
    body = {"top_p": 2, "stream": True}
    response = post(servers["sglang"], body)
    assert response.status_code == 200
    events = [e.removeprefix("data: ") for e in response.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    error = json.loads(events[0])["error"]
    assert error["message"] == "top_p must be in (0, 1], got 2.0." and error["code"] == 400
    assert post(servers["vllm"], body).status_code == 400


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_request_model_refusals_are_pydantic_bad_requests(servers, engine):
    response = post(servers[engine], {"n": "three"})
    assert response.status_code == 400
    body = response.json()
    error = body["error"] if engine == "vllm" else body
    assert error["type"] == "Bad Request"  # HTTPStatus.BAD_REQUEST.phrase
    assert "'loc': ('body', 'n')" in error["message"]
    assert "Input should be a valid integer" in error["message"]


def test_vllm_model_validators(servers):
    server = servers["vllm"]
    checks = [
        ({"stream_options": {"include_usage": True}}, "Stream options can only be defined"),
        ({"logprobs": -3}, "`logprobs` must be a positive value."),
        ({"prompt": ""}, "Either prompt or prompt_embeds must be provided and non-empty."),
    ]
    for extra, words in checks:
        response = post(server, extra)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["type"] == "Bad Request" and words in error["message"]
    chat = {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}
    response = httpx.post(server.url + "/v1/chat/completions", json=chat)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "when using `top_logprobs`, `logprobs` must be set to true." in message


def test_sglang_request_checks(servers):
    server = servers["sglang"]
    response = post(server, {"prompt": ""})
    assert response.status_code == 400 and response.json()["message"] == "Prompt cannot be empty"
    response = post(server, {"max_tokens": 0})
    assert (
        response.status_code == 400 and "max_tokens must be positive" in response.json()["message"]
    )
    chat = {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 9000}
    response = httpx.post(server.url + "/v1/chat/completions", json=chat)
    assert response.status_code == 400
    assert response.json()["message"] == (
        "max_completion_tokens is too large: 9000.This model supports at most 8192 completion "
        "tokens."
    )


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_token_ids_outside_the_vocabulary(servers, engine):
    response = post(servers[engine], {"prompt": [1, 2, 10**9]})
    assert response.status_code == 400
    assert "Token id 1000000000 is out of vocabulary" in response.text
