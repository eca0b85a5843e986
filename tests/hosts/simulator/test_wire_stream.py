"""What a client reads from the simulator's streams, compared with what vLLM 0.11.0 and SGLang
0.5.3 send (their serving_chat.py / serving_completion(s).py, read for these tests)."""

import json
import time

import httpx
import pytest

from tests.hosts.simulator.test_protocol import SGLANG_ARGS, VLLM_ARGS

ENGINES = ["vllm", "sglang"]


def args_for(engine: str) -> tuple:
    return VLLM_ARGS if engine == "vllm" else SGLANG_ARGS


@pytest.fixture(scope="module", params=ENGINES)
def fast(request, module_sim_server):
    """A server that runs as fast as it can (virtual time): for the shape of what it sends
    (one per engine for the module: its tests only send requests and read the answers)."""
    return module_sim_server(request.param, *args_for(request.param), "--time-scale", "0")


def sse(server, path: str, body: dict) -> list[dict]:
    """The JSON events of a streamed request, [DONE] checked and dropped."""
    with httpx.stream("POST", server.url + path, json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        raw = response.read().decode()
    events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def chat_body(server, **extra) -> dict:
    return {"model": server.model, "messages": [{"role": "user", "content": "Hi."}], **extra}


@pytest.mark.parametrize("engine", ENGINES)
def test_chat_role_chunk_comes_with_the_first_token(sim_server, engine):
    """vLLM's chat benchmark takes the first chunk with choices as the first token: with the
    role chunk sent when the stream opened it read TTFT ten times too short. The simulator is
    slowed 5× so that prefilling 6000 tokens takes long against the stream opening; the test
    compares two timestamps of the same stream, never the machine's speed."""
    server = sim_server(engine, *args_for(engine), "--time-scale", "5")
    body = chat_body(server, max_tokens=2, stream=True, ignore_eos=True)
    body["messages"][0]["content"] = " word" * 6000
    opened = first_choices = first_content = None
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json=body, timeout=120
    ) as response:
        opened = time.perf_counter()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            now, event = time.perf_counter(), json.loads(line[6:])
            if event["choices"] and first_choices is None:
                first_choices = now
                delta = event["choices"][0]["delta"]
                assert delta["role"] == "assistant" and delta["content"] == ""
            if event["choices"] and event["choices"][0]["delta"].get("content"):
                first_content = now
                break
    prefill = first_content - opened
    assert first_content - first_choices < 0.1 * prefill, (opened, first_choices, first_content)


@pytest.mark.parametrize("engine", ENGINES)
def test_final_chat_chunk_says_why_it_stopped(sim_server, engine):
    server = sim_server(engine, *args_for(engine), "--time-scale", "0")
    events = sse(server, "/v1/chat/completions", chat_body(server, max_tokens=4, stream=True))
    with_choices = [e for e in events if e["choices"]]
    last = with_choices[-1]["choices"][0]
    assert last["finish_reason"] == "length"
    if engine == "vllm":  # the last token's chunk carries stop_reason (null: not a stop string)
        assert "stop_reason" in last and last["stop_reason"] is None
        assert last["delta"]["content"]
    else:  # SGLang: a separate empty chunk after the last token, with matched_stop
        assert last["delta"]["content"] is None and last["matched_stop"] is None


@pytest.mark.parametrize("chat", [False, True])
def test_streamed_and_whole_text_round_trip_to_completion_tokens(fast, chat):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    for n in (1, 16, 17, 18, 40, 129):
        base = chat_body(fast) if chat else {"model": fast.model, "prompt": "Hi."}
        body = {**base, "max_tokens": n, "ignore_eos": True}
        whole = httpx.post(fast.url + path, json=body, timeout=60).json()
        choice = whole["choices"][0]
        content = choice["message"]["content"] if chat else choice["text"]
        options = {"include_usage": True}
        events = sse(fast, path, {**body, "stream": True, "stream_options": options})
        streamed = "".join(
            (c["delta"].get("content") or "") if chat else c["text"]
            for e in events
            for c in e["choices"]
        )
        for out, usage in ((content, whole["usage"]), (streamed, events[-1]["usage"])):
            counted = httpx.post(fast.url + "/tokenize", json={"prompt": out}).json()["count"]
            assert counted - 1 == usage["completion_tokens"] == n  # /tokenize adds BOS


def test_continuous_usage_stats_on_every_chunk_in_vllm(sim_server):
    server = sim_server("vllm", *VLLM_ARGS, "--time-scale", "0")
    options = {"include_usage": True, "continuous_usage_stats": True}
    for path, body in (
        ("/v1/completions", {"model": server.model, "prompt": "Hi."}),
        ("/v1/chat/completions", chat_body(server)),
    ):
        body = {**body, "max_tokens": 5, "ignore_eos": True, "stream": True}
        events = sse(server, path, {**body, "stream_options": options})
        usages = [e["usage"] for e in events]
        assert all(u is not None for u in usages)
        prompt = usages[0]["prompt_tokens"]
        counts = [
            u["completion_tokens"] for u, e in zip(usages, events, strict=True) if e["choices"]
        ]
        chat = path.endswith("chat/completions")
        assert counts == ([0] if chat else []) + [1, 2, 3, 4, 5]  # the chat role chunk: 0
        assert all(u["total_tokens"] == prompt + u["completion_tokens"] for u in usages)
        plain = sse(server, path, {**body, "stream_options": {"include_usage": True}})
        assert all(e.get("usage") is None for e in plain[:-1]) and plain[-1]["usage"]


def test_sglang_ignores_continuous_usage_stats(sim_server):
    server = sim_server("sglang", *SGLANG_ARGS, "--time-scale", "0")
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"prompt": "Hi.", "max_tokens": 3, "stream": True, "stream_options": options}
    events = sse(server, "/v1/completions", body)
    assert [e["usage"] for e in events[:-1]] == [None] * 3 and events[-1]["usage"]


@pytest.mark.parametrize("chat", [False, True])
def test_stop_string_ends_the_request_early(fast, chat):
    """Every 17th output token is a punctuation mark: with stop=[".", ","] the request ends on
    token 17 (34 with min_tokens=20), which the usage counts and the text leaves out."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    base = chat_body(fast) if chat else {"model": fast.model, "prompt": "Hi."}
    why = "stop_reason" if fast.engine == "vllm" else "matched_stop"
    for extra, tokens in (({}, 17), ({"min_tokens": 20}, 34)):
        body = {**base, "max_tokens": 60, "ignore_eos": True, "stop": [".", ","], **extra}
        answer = httpx.post(fast.url + path, json=body).json()
        choice = answer["choices"][0]
        out = choice["message"]["content"] if chat else choice["text"]
        assert choice["finish_reason"] == "stop" and choice[why] in (".", ",")
        assert answer["usage"]["completion_tokens"] == tokens
        assert not out.endswith((".", ",")) and len(out.split()) == tokens - 1 - (tokens > 17)
        options = {"include_usage": True}
        events = sse(fast, path, {**body, "stream": True, "stream_options": options})
        streamed = "".join(
            (c["delta"].get("content") or "") if chat else c["text"]
            for e in events
            for c in e["choices"]
        )
        assert len(streamed.split()) == len(out.split()) and not streamed.endswith((".", ","))
        assert events[-1]["usage"]["completion_tokens"] == tokens
        finals = [c for e in events for c in e["choices"] if c["finish_reason"]]
        assert finals[-1]["finish_reason"] == "stop" and finals[-1][why] in (".", ",")


def test_n_choices_interleave_and_usage_counts_them_all(fast):
    body = chat_body(fast, max_tokens=6, n=3, ignore_eos=True, stream=True)
    events = sse(fast, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    by_index: dict[int, str] = {}
    reasons = {}
    for e in events:
        for c in e["choices"]:
            by_index[c["index"]] = by_index.get(c["index"], "") + (c["delta"]["content"] or "")
            if c["finish_reason"]:
                reasons[c["index"]] = c["finish_reason"]
    assert sorted(by_index) == [0, 1, 2] and reasons == {0: "length", 1: "length", 2: "length"}
    assert len(set(by_index.values())) == 3  # three samples, not one text three times
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == 18
    whole = httpx.post(fast.url + "/v1/chat/completions", json={**body, "stream": False}).json()
    assert [c["index"] for c in whole["choices"]] == [0, 1, 2]
    assert whole["usage"]["completion_tokens"] == 18
    assert whole["usage"]["prompt_tokens"] == usage["prompt_tokens"]  # the prompt counts once


@pytest.mark.parametrize("prompt", [["Hi.", "Tell me more."], [[1, 2, 3], [4, 5]]])
def test_batched_prompts_get_one_choice_per_prompt_and_sample(fast, prompt):
    body = {"prompt": prompt, "max_tokens": 3, "n": 2, "ignore_eos": True}
    whole = httpx.post(fast.url + "/v1/completions", json=body).json()
    assert [c["index"] for c in whole["choices"]] == [0, 1, 2, 3]
    lens = [len(p) if isinstance(p, list) else None for p in prompt]
    if lens[0] is not None:
        assert whole["usage"]["prompt_tokens"] == sum(lens)  # each prompt once, not per n
    assert whole["usage"]["completion_tokens"] == 12
    events = sse(fast, "/v1/completions", {**body, "stream": True})
    seen = sorted({c["index"] for e in events for c in e["choices"]})
    assert seen == [0, 1, 2, 3]


@pytest.mark.parametrize("chat", [False, True])
def test_logprobs_have_the_engines_shape(fast, chat):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    base = chat_body(fast) if chat else {"model": fast.model, "prompt": "Hi."}
    asks = {"logprobs": True, "top_logprobs": 3} if chat else {"logprobs": 3}
    body = {**base, "max_tokens": 5, "ignore_eos": True, **asks}
    whole = httpx.post(fast.url + path, json=body).json()["choices"][0]
    streamed = [
        c["logprobs"]
        for e in sse(fast, path, {**body, "stream": True})
        for c in e["choices"]
        if c["logprobs"]
    ]
    if chat:
        entries = whole["logprobs"]["content"]
        assert len(entries) == 5 and len(streamed) == 5
        assert "".join(e["token"] for e in entries) == whole["message"]["content"]
        for e in entries:
            assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 3
            assert e["top_logprobs"][0]["token"] == e["token"]
            assert bytes(e["bytes"]).decode() == e["token"]
    else:
        lp = whole["logprobs"]
        assert "".join(lp["tokens"]) == whole["text"] and len(lp["token_logprobs"]) == 5
        assert all(v <= 0 for v in lp["token_logprobs"])
        assert all(len(top) == 3 for top in lp["top_logprobs"])
        offsets = lp["text_offset"]
        if fast.engine == "vllm":  # character offsets of each token in the text
            assert offsets == [
                whole["text"].find(t, o) for t, o in zip(lp["tokens"], offsets, strict=True)
            ]
            assert offsets[0] == 0 and offsets == sorted(offsets)
        else:
            assert offsets == [-1] * 5  # SGLang: "Not supported yet"
        assert len(streamed) == 5
