"""The simulator speaks the engines' HTTP API: checked with the real `openai` client."""

import hashlib
import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

ENGINES = ["vllm", "sglang"]
SGLANG_ARGS = ("--context-length", "8192", "--enable-metrics")
VLLM_ARGS = ("--max-model-len", "8192")


@pytest.fixture(scope="module", params=ENGINES)
def server(request, module_sim_server):
    """One simulator per engine for the module: its tests only send requests and read."""
    args = VLLM_ARGS if request.param == "vllm" else SGLANG_ARGS
    return module_sim_server(request.param, *args, "--time-scale", "0.2")


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_models(server):
    models = client(server).models.list().data
    assert [m.id for m in models] == [server.model]


def test_streaming_completion_with_usage(server):
    stream = client(server).completions.create(
        model=server.model,
        prompt="Tell me about KV caches.",
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    text_chunks = [c for c in chunks if c.choices]
    assert len(text_chunks) == 12
    # vLLM names the stream cmpl-<hex>; SGLang 0.5.3 by its bare request id (a uuid4 hex)
    prefix = "cmpl-" if server.engine == "vllm" else ""
    assert all(c.object == "text_completion" and c.id.startswith(prefix) for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert [c.choices[0].finish_reason for c in text_chunks] == [None] * 11 + ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens > 0


def test_streaming_chat_sends_role_then_content(server):
    stream = client(server).chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert (
        chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    )
    content = [c.choices[0].delta.content for c in chunks[1:] if c.choices[0].delta.content]
    assert len(content) == 5
    assert chunks[-1].choices[0].finish_reason == "length"
    if server.engine == "sglang":  # SGLang: the finish reason in its own chunk, no content
        assert chunks[-1].choices[0].delta.content is None and len(chunks) == 7
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert all(c.usage is None for c in chunks)  # no usage chunk unless asked for


def test_non_streaming_both_endpoints(server):
    c = client(server)
    completion = c.completions.create(
        model=server.model, prompt=[1, 2, 3, 4, 5], max_tokens=7, extra_body={"ignore_eos": True}
    )
    assert completion.usage.prompt_tokens == 5 and completion.usage.completion_tokens == 7
    assert completion.choices[0].finish_reason == "length" and completion.choices[0].text
    chat = c.chat.completions.create(
        model=server.model,
        max_tokens=400,
        messages=[{"role": "user", "content": "Explain batching."}],
        extra_body={"min_tokens": 3},
    )
    assert chat.choices[0].message.role == "assistant"
    assert 3 <= chat.usage.completion_tokens <= 400
    reason = chat.choices[0].finish_reason
    assert reason == ("length" if chat.usage.completion_tokens == 400 else "stop")


def test_raw_sse_framing(server):
    body = {
        "model": server.model,
        "prompt": "x",
        "max_tokens": 2,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert [p["choices"][0]["finish_reason"] for p in payloads[:-1]] == [None, "length"]
    assert payloads[-1]["usage"]["completion_tokens"] == 2


def test_the_simulator_records_what_it_streamed(server):
    """/simulator/sent: each streamed body's SHA-256 and length by response id, which a client
    compares with what it read (tests/integration/test_two_jobs_at_once.py)."""
    body = {"model": server.model, "prompt": "x", "max_tokens": 5, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as response:
        raw = response.read()
    rid = json.loads(raw.split(b"\n\n")[0].removeprefix(b"data: "))["id"]
    sent = httpx.get(server.url + "/simulator/sent", timeout=30).json()["bodies"]
    assert sent[rid] == {
        "sha256": hashlib.sha256(raw).hexdigest(),
        "bytes": len(raw),
        "complete": True,
    }


def test_prompt_longer_than_context_is_a_400(server):
    with pytest.raises(openai.BadRequestError) as err:
        client(server).completions.create(model=server.model, prompt=[7] * 9000, max_tokens=4)
    message = str(err.value)
    if server.engine == "vllm":
        assert (
            "maximum context length is 8192 tokens. However, your request has 9000 input" in message
        )
    else:
        assert "The input (9000 tokens) is longer than the model's context length (8192" in message


def test_max_tokens_beyond_context_is_a_400(server):
    with pytest.raises(openai.BadRequestError):
        client(server).completions.create(model=server.model, prompt=[7] * 8000, max_tokens=500)


def test_unknown_model_is_a_404_in_vllm_and_echoed_by_sglang(server):
    if server.engine == "vllm":
        with pytest.raises(openai.NotFoundError) as err:
            client(server).completions.create(model="nope", prompt="x", max_tokens=1)
        assert err.value.body["message"] == "The model `nope` does not exist."
        assert err.value.body["type"] == "NotFoundError" and err.value.body["code"] == 404
    else:  # SGLang 0.5.3 does not check the name: it answers with the name it was sent
        answer = client(server).completions.create(model="nope", prompt="x", max_tokens=1)
        assert answer.model == "nope"


def test_n_stop_and_logprobs_through_the_sdk(server):
    c = client(server)
    answer = c.completions.create(
        model=server.model,
        prompt=["one", "two"],
        n=2,
        max_tokens=40,
        stop=[".", ","],
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    assert [choice.index for choice in answer.choices] == [0, 1, 2, 3]
    assert all(choice.finish_reason == "stop" for choice in answer.choices)
    assert answer.usage.completion_tokens == 4 * 17  # each stops on its 17th token
    assert all(len(choice.logprobs.tokens) == 17 for choice in answer.choices)
    chat = c.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "hi"}],
        n=2,
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    assert [choice.index for choice in chat.choices] == [0, 1]
    for choice in chat.choices:
        entries = choice.logprobs.content
        assert "".join(e.token for e in entries) == choice.message.content
        assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)


def test_bad_sampling_parameters_are_refused_as_the_engine_words_them(server):
    with pytest.raises(openai.BadRequestError) as err:
        client(server).completions.create(model=server.model, prompt="x", top_p=2)
    assert err.value.body["message"] == "top_p must be in (0, 1], got 2.0."
    assert err.value.body["type"] == "BadRequestError"


def test_tokenize(server):
    data = httpx.post(server.url + "/tokenize", json={"prompt": "Hello, world"}).json()
    assert data["count"] == len(data["tokens"]) == 4 and data["max_model_len"] == 8192


def test_metrics_with_real_names(server):
    p = "vllm:" if server.engine == "vllm" else "sglang:"

    def scrape() -> tuple[dict, list[float]]:
        text = httpx.get(server.url + "/metrics").text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        counter = families.get(p + "generation_tokens")
        samples = counter.samples if counter else []
        return families, [s.value for s in samples if s.name.endswith("_total")] or [0.0]

    _, before = scrape()  # the module's server: other tests' tokens are counted already
    client(server).completions.create(
        model=server.model, prompt="hi", max_tokens=3, extra_body={"ignore_eos": True}
    )
    families, after = scrape()
    running = "num_requests_running" if server.engine == "vllm" else "num_running_reqs"
    assert p + running in families
    assert p + "time_to_first_token_seconds" in families
    assert p + "inter_token_latency_seconds" in families
    assert p + "e2e_request_latency_seconds" in families
    assert len(after) == 1 and after[0] - before[0] == 3.0
    if server.engine == "vllm":
        for name in (
            "kv_cache_usage_perc",
            "prefix_cache_queries",
            "prefix_cache_hits",
            "num_preemptions",
            "prompt_tokens",
            "request_queue_time_seconds",
            "request_prefill_time_seconds",
            "request_decode_time_seconds",
        ):
            assert p + name in families, name
    else:
        for name in ("num_queue_reqs", "token_usage", "cache_hit_rate", "gen_throughput"):
            assert p + name in families, name


def test_health_is_503_while_starting(sim_server):
    server = sim_server("vllm", *VLLM_ARGS, "--startup-seconds", "3", ready=False)
    server.wait_listening()
    assert httpx.get(server.url + "/health").status_code == 503
    server.wait_ready()
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.parametrize("engine", ENGINES)
def test_api_key_is_enforced(sim_server, engine):
    args = VLLM_ARGS if engine == "vllm" else SGLANG_ARGS
    server = sim_server(engine, *args, "--api-key", "sekret")
    with pytest.raises(openai.AuthenticationError) as err:
        client(server).models.list()
    # Both engines' API-key middleware: this body, outside their error envelopes.
    assert err.value.response.json() == {"error": "Unauthorized"}
    ok = openai.OpenAI(base_url=server.url + "/v1", api_key="sekret").models.list()
    assert ok.data
    # vLLM guards /v1 only; SGLang every route but /health* and /metrics.
    tokenize = httpx.post(server.url + "/tokenize", json={"prompt": "hi"})
    assert tokenize.status_code == (200 if engine == "vllm" else 401)
    assert httpx.get(server.url + "/health").status_code == 200


def test_sglang_native_endpoints(sim_server):
    server = sim_server("sglang", *SGLANG_ARGS, "--max-running-requests", "48")
    info = httpx.get(server.url + "/get_server_info").json()
    assert info["max_running_requests"] == 48 and info["context_length"] == 8192
    assert info["max_total_num_tokens"] > 0 and "api_key" not in info
    assert httpx.get(server.url + "/health_generate", timeout=30).status_code == 200
    flushed = httpx.post(server.url + "/flush_cache")
    assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed.")


def test_sglang_metrics_need_the_flag(sim_server):
    server = sim_server("sglang", "--context-length", "8192")
    assert httpx.get(server.url + "/metrics").status_code == 404


@pytest.mark.parametrize("engine", ENGINES)
def test_gpu_telemetry_in_nvml_shape(sim_server, engine):
    # A server of its own: the module's shared one has just served other tests (not idle).
    args = VLLM_ARGS if engine == "vllm" else SGLANG_ARGS
    server = sim_server(engine, *args, "--time-scale", "0.2")
    gpus = httpx.get(server.url + "/simulator/gpus").json()["gpus"]
    assert len(gpus) == 1
    gpu = gpus[0]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["power_limit_w"] == 700
    assert 0 < gpu["memory_used_bytes"] <= gpu["memory_total_bytes"]
    assert gpu["numa_node"] == 0 and gpu["clocks_event_reasons"] & 0x1  # idle


def _samples(server) -> dict[str, float]:
    """Each sample's value summed over its labels (histogram buckets left out)."""
    text = httpx.get(server.url + "/metrics").text
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "le" not in s.labels:
                sums[s.name] = sums.get(s.name, 0.0) + s.value
    return sums


def test_n_choices_observe_their_parent_once(sim_server):
    """vLLM's request_params_n is observed once per prompt of the client's request (the
    parent of its n children), not once per choice."""
    server = sim_server("vllm", *VLLM_ARGS, "--time-scale", "0.2")
    client(server).completions.create(
        model=server.model,
        prompt=["one", "two"],
        n=3,
        max_tokens=4,
        extra_body={"ignore_eos": True},
    )
    samples = _samples(server)
    assert samples["vllm:request_params_n_count"] == 2
    assert samples["vllm:request_params_n_sum"] == 6
    assert samples["vllm:request_success_total"] == 6


@pytest.mark.timing
def test_sglang_non_streamed_ttft_is_its_first_output_on_the_wire(sim_server):
    """SGLang's scheduler sends a non-streamed request's output only every 50 tokens, so
    its TTFT is late in the request: most of its end-to-end time, unlike a streamed one."""
    server = sim_server("sglang", *SGLANG_ARGS, "--time-scale", "0.2")
    c = client(server)
    c.completions.create(
        model=server.model, prompt="hi", max_tokens=60, extra_body={"ignore_eos": True}
    )
    samples = _samples(server)
    ratio = (
        samples["sglang:time_to_first_token_seconds_sum"]
        / samples["sglang:e2e_request_latency_seconds_sum"]
    )
    assert ratio > 0.7, ratio  # the 50th of 60 tokens
    list(
        c.completions.create(
            model=server.model,
            prompt="hi",
            max_tokens=60,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    after = _samples(server)
    streamed_ttft = (
        after["sglang:time_to_first_token_seconds_sum"]
        - samples["sglang:time_to_first_token_seconds_sum"]
    )
    streamed_e2e = (
        after["sglang:e2e_request_latency_seconds_sum"]
        - samples["sglang:e2e_request_latency_seconds_sum"]
    )
    # Streamed, the first token leaves at once, not with the 50th (which would be > 0.8).
    # Not tighter: at --time-scale 0.2 a loaded machine's scheduling delays alone took the
    # first token to 0.31 of the request once (CI).
    assert streamed_ttft / streamed_e2e < 0.5
