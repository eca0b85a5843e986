"""The simulated model's knowledge (``--knowledge``): answers to known prompts, right or wrong
as a model of its size and quantisation would be, through the real HTTP API and the openai
client; and the launch rendering that hands the file to the simulator."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from hosts.agent.policy import ExecPolicy
from hosts.engines.catalog import resolve_gpu
from hosts.engines.launch import LaunchConfig, LaunchError, render_process
from hosts.simulator import quality
from hosts.simulator.__main__ import parse as simulator_parse
from hosts.simulator.config import build_config
from hosts.simulator.text import WORDS
from tests.conftest import free_port
from tests.hosts.simulator.conftest import run_cli
from tests.integration.processes import ROOT

BF16 = "meta-llama/Llama-3.1-8B-Instruct"
FP8 = "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8"
AWQ = "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"
QWEN = "Qwen/Qwen2.5-7B-Instruct"
SCHEMA = {"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"]}
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
# category, language, how many: 200 items in all
MIX = (
    ("factual", "en", 40),
    ("factual", "ko", 30),
    ("reasoning", "en", 20),
    ("reasoning", "ko", 10),
    ("math", "en", 20),
    ("math", "ko", 20),
    ("json", "en", 30),
    ("format", "en", 15),
    ("long_context", "en", 15),
)


def synthetic_items() -> list[dict]:
    """Items shaped like a probe's: checkable answers, some with a wrong answer given."""
    items = []
    for category, language, count in MIX:
        for i in range(count):
            text = f"[{category}/{language} #{i}] " + (
                f"{'몇' if language == 'ko' else 'What is'} {i} plus {i * 3 + 7}?"
                if category == "math"
                else f"Question {i} about {WORDS[i % len(WORDS)]} ({category}, {language})."
            )
            item = {"text": text, "category": category, "language": language, "json": False}
            if category == "math":
                item.update(answer=str(i + i * 3 + 7), wrong=None)
            elif category == "json":
                item.update(answer=json.dumps({"value": i, "unit": "ms"}), wrong=None, json=True)
            elif category == "format":
                item.update(answer=f"- {WORDS[i % 9]}\n- {WORDS[(i + 3) % 9]}", wrong=None)
            else:
                answer = f"The answer is {WORDS[(i * 7) % len(WORDS)]}."
                wrong = f"The answer is {WORDS[(i * 7 + 1) % len(WORDS)]}." if i % 2 else None
                item.update(answer=answer, wrong=wrong)
            items.append(item)
    return items


ITEMS = synthetic_items()


class ModelServer:
    """``python -m hosts.simulator`` for one model, as fast as it can run."""

    def __init__(self, engine: str, model: str, knowledge: str, *extra: str):
        self.engine, self.model, self.port = engine, model, free_port()
        model_args = [model] if engine == "vllm" else ["--model-path", model]
        length = ["--max-model-len", "8192"] if engine == "vllm" else ["--context-length", "8192"]
        cmd = [sys.executable, "-m", "hosts.simulator", engine, *model_args, *length]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), "--time-scale", "0"]
        cmd += ["--knowledge", knowledge, *extra]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0)

    def wait_ready(self, timeout: float = 30) -> ModelServer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"simulator exited: {self.proc.stdout.read()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError("simulator never became healthy")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()

    def ask(self, item: dict, **extra) -> str:
        messages = [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": item["text"]},
        ]
        options = {"temperature": 0, "max_tokens": 64, **extra}
        reply = self.client.chat.completions.create(model=self.model, messages=messages, **options)
        return reply.choices[0].message.content

    def ask_all(self, items: list[dict], **extra) -> list[str]:
        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(lambda item: self.ask(item, **extra), items))


@pytest.fixture(scope="module")
def knowledge(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("knowledge") / "items.jsonl"
    lines = ["# synthetic probe items", *(json.dumps(i, ensure_ascii=False) for i in ITEMS)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def servers(knowledge):
    started = {
        "bf16": ModelServer("vllm", BF16, knowledge),
        "fp8": ModelServer("vllm", FP8, knowledge),
        "awq": ModelServer("vllm", AWQ, knowledge),
        "sglang": ModelServer("sglang", QWEN, knowledge),
    }
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="module")
def answers(servers) -> dict[str, list[str]]:
    """Every item asked of the BF16, FP8 and AWQ models (AWQ's JSON items also with a schema)."""
    out = {name: servers[name].ask_all(ITEMS) for name in ("bf16", "fp8", "awq")}
    json_items = [i for i in ITEMS if i["json"]]
    out["awq_schema"] = servers["awq"].ask_all(json_items, response_format=JSON_SCHEMA_FORMAT)
    return out


def correct(item: dict, answer: str) -> bool:
    return answer == item["answer"]


def share(flags) -> float:
    flags = list(flags)
    return sum(flags) / len(flags)


def by(predicate, name, answers) -> list[bool]:
    return [correct(i, a) for i, a in zip(ITEMS, answers[name], strict=True) if predicate(i)]


def test_answers_are_deterministic(servers, answers):
    again = servers["bf16"].ask_all(ITEMS, temperature=0.8, seed=7)
    assert again == answers["bf16"]
    # a known item's wrong answer is the item's own when it has one
    for item, answer in zip(ITEMS, answers["bf16"], strict=True):
        assert answer.strip()
        if item["wrong"]:
            assert answer in (item["answer"], item["wrong"])


def test_accuracy_per_category_is_near_the_table(answers):
    table = quality.BASE_ACCURACY
    expected_total = 0.0
    for category, language, count in MIX:
        group = (category, language)
        got = share(by(lambda i, g=group: (i["category"], i["language"]) == g, "bf16", answers))
        expected = table[category][0 if language == "en" else 1]
        expected_total += expected * count
        # 10-40 items a group: within three binomial standard deviations
        spread = 3 * (expected * (1 - expected) / count) ** 0.5 + 0.02
        assert abs(got - expected) <= spread, (category, language, got)
    overall = share(correct(i, a) for i, a in zip(ITEMS, answers["bf16"], strict=True))
    assert abs(overall - expected_total / len(ITEMS)) <= 0.07


def test_fp8_agrees_with_bf16(answers):
    same = [a == b for a, b in zip(answers["bf16"], answers["fp8"], strict=True)]
    assert share(same) >= 0.97


def test_awq_loses_on_korean_maths_and_unconstrained_json(answers):
    for predicate in (
        lambda i: i["language"] == "ko",
        lambda i: i["category"] == "math",
        lambda i: i["category"] == "json",
    ):
        assert sum(by(predicate, "awq", answers)) < sum(by(predicate, "bf16", answers))
    english_facts = lambda i: (i["category"], i["language"]) == ("factual", "en")  # noqa: E731
    assert sum(by(english_facts, "awq", answers)) >= sum(by(english_facts, "bf16", answers)) - 3


def test_awq_json_is_always_valid_with_a_schema(answers):
    for answer in answers["awq_schema"]:
        json.loads(answer)
    json_items = [i for i in ITEMS if i["json"]]
    right = share(correct(i, a) for i, a in zip(json_items, answers["awq_schema"], strict=True))
    unconstrained = share(by(lambda i: i["json"], "awq", answers))
    assert right >= unconstrained


def test_bf16_misses_are_awq_misses(answers):
    pairs = [
        (correct(i, b), correct(i, a))
        for i, b, a in zip(ITEMS, answers["bf16"], answers["awq"], strict=True)
    ]
    missed = [awq for bf16, awq in pairs if not bf16]
    assert missed and share(not ok for ok in missed) >= 0.90


def test_unknown_prompts_still_get_filler(servers):
    server = servers["bf16"]
    reply = server.client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Something nobody asked before."}],
        max_tokens=12,
        extra_body={"ignore_eos": True},
    )
    words = reply.choices[0].message.content.replace(",", " ").replace(".", " ").split()
    assert reply.usage.completion_tokens == 12 and set(words) <= set(WORDS)


@pytest.mark.parametrize("engine", ["bf16", "sglang"])
@pytest.mark.parametrize("chat", [True, False])
def test_streamed_and_whole_answers_match_and_count_like_the_tokenizer(servers, engine, chat):
    server = servers[engine]
    item = ITEMS[0]
    path = "/v1/chat/completions" if chat else "/v1/completions"
    base = {"model": server.model, "max_tokens": 64, "temperature": 0}
    if chat:
        base["messages"] = [{"role": "user", "content": "  " + item["text"].replace(" ", "\n ")}]
    else:
        base["prompt"] = item["text"]
    whole = httpx.post(server.url + path, json=base, timeout=30).json()
    choice = whole["choices"][0]
    text = choice["message"]["content"] if chat else choice["text"]
    assert choice["finish_reason"] == "stop"
    body = {**base, "stream": True, "stream_options": {"include_usage": True}}
    events = []
    with httpx.stream("POST", server.url + path, json=body, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    streamed = "".join(
        ((c.get("delta") or {}).get("content") or "") if chat else c["text"]
        for e in events
        for c in e["choices"]
    )
    assert streamed == text == server.ask(item)
    counted = httpx.post(server.url + "/tokenize", json={"prompt": text}).json()["count"]
    assert (
        counted - 1
        == whole["usage"]["completion_tokens"]
        == events[-1]["usage"]["completion_tokens"]
    )


def test_an_answer_longer_than_max_tokens_is_cut(servers):
    server = servers["bf16"]
    item = next(i for i in ITEMS if i["category"] == "format")
    full = server.ask(item)
    reply = server.client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": item["text"]}], max_tokens=2
    )
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 2
    assert (
        full.startswith(reply.choices[0].message.content)
        and full != reply.choices[0].message.content
    )


@pytest.mark.parametrize(
    ("engine", "extra"),
    [
        ("bf16", {"response_format": JSON_SCHEMA_FORMAT}),
        ("bf16", {"response_format": {"type": "json_object"}}),
        ("bf16", {"extra_body": {"guided_json": SCHEMA}}),
        ("bf16", {"extra_body": {"structured_outputs": {"json": SCHEMA}}}),
        ("sglang", {"response_format": JSON_SCHEMA_FORMAT}),
        ("sglang", {"extra_body": {"json_schema": json.dumps(SCHEMA)}}),
        ("sglang", {"extra_body": {"regex": "[0-9]+"}}),
    ],
)
def test_structured_output_requests_are_accepted(servers, engine, extra):
    server = servers[engine]
    item = next(i for i in ITEMS if i["json"])
    json.loads(server.ask(item, **extra))


@pytest.mark.parametrize(
    "response_format",
    [{"type": "yaml"}, {"type": "json_schema"}, {"type": "json_schema", "json_schema": {}}, "json"],
)
@pytest.mark.parametrize("engine", ["bf16", "sglang"])
def test_bad_response_formats_are_refused(servers, engine, response_format):
    server = servers[engine]
    body = {"model": server.model, "prompt": "hi", "max_tokens": 3}
    reply = httpx.post(
        server.url + "/v1/completions", json={**body, "response_format": response_format}
    )
    assert reply.status_code == 400
    error = reply.json()["error"] if engine == "bf16" else reply.json()
    assert error["type"] in ("Bad Request", "BadRequestError")


def test_the_quality_endpoint_reports_the_table(servers):
    bf16 = httpx.get(servers["bf16"].url + "/simulator/quality").json()
    awq = httpx.get(servers["awq"].url + "/simulator/quality").json()
    assert bf16["items"] == awq["items"] == len(ITEMS)
    assert bf16["known"]["factual/ko"] == 30
    assert bf16["model"] == {"family": "llama-3.1-8b", "weights": "bf16", "kv_cache": "auto"}
    assert awq["model"]["weights"] == "awq"
    assert bf16["accuracy"]["factual"]["en"] == 0.88
    assert awq["accuracy"]["math"]["ko"] == pytest.approx(0.68 - 0.12)  # the non-English floor
    assert bf16["json_validity_unstructured"]["en"] == pytest.approx(0.9667)


# --- the model in-process: many items, tight bands ----------------------------------------
def model_for(name: str, **settings) -> quality.QualityModel:
    cfg = build_config("vllm", name, {"max_model_len": 8192, **settings}, resolve_gpu("h100-sxm"))
    return quality.QualityModel(quality.Variant.of(cfg), {})


def many_items(category: str, language: str, n: int = 4000, is_json: bool = False):
    return [
        quality.Item(f"{category} {language} item {k}", category, language, "{}", None, is_json)
        for k in range(n)
    ]


def test_accuracy_and_losses_match_the_table_on_many_items():
    bf16, fp8, kv8, awq = (
        model_for(BF16),
        model_for(BF16, quantization="fp8"),
        model_for(BF16, kv_cache_dtype="fp8"),
        model_for(AWQ),
    )
    assert fp8.variant.weights == "fp8" and kv8.variant.kv == "fp8"
    for category, (en, ko) in quality.BASE_ACCURACY.items():
        for language, expected in (("en", en), ("ko", ko)):
            items = many_items(category, language, is_json=category == "json")
            got = share(bf16.correct(i) for i in items)
            assert abs(got - expected) < 0.02, (category, language, got)
            loss = got - share(awq.correct(i) for i in items)
            wanted = awq.variant.loss_pp(category, language == "en", False) / 100
            assert abs(loss - wanted) < 0.015, (category, language, loss)
            for quantised in (fp8, kv8):
                agree = share(bf16.correct(i) == quantised.correct(i) for i in items)
                assert agree >= 0.98


def test_model_size_scales_accuracy():
    small, base = model_for("Qwen/Qwen2.5-0.5B-Instruct"), model_for(BF16)
    big = quality.Variant("llama-3.1-70b", 70.6e9, "bf16", "auto")  # needs more than one GPU
    for category in quality.BASE_ACCURACY:
        ladder = [m.accuracy(category, "en") for m in (small.variant, base.variant, big)]
        assert ladder == sorted(ladder) and ladder[0] < ladder[1] < ladder[2]


def test_json_validity_without_structured_output():
    items = [
        quality.Item(f"json {k}", "json", "en", json.dumps({"v": k}), None, True)
        for k in range(3000)
    ]
    model = quality.QualityModel(model_for(BF16).variant, {i.text: i for i in items})
    loose = [model.answer(i.text) for i in items]
    valid = share(_parses(a) for a in loose)
    assert 0.955 <= valid <= 0.98
    constrained = [model.answer(i.text, structured=True) for i in items]
    assert all(_parses(a) for a in constrained)


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def test_wrong_answers_are_plausible():
    assert quality.perturb_text("42", "en", 0.5) in {"39", "40", "41", "43", "44", "45"}
    assert quality.perturb_text("Yes.", "en", 0.1) == "no"
    assert quality.perturb_text("Paris", "en", 0.3) != "Paris"
    wrong = json.loads(quality.perturb_json('{"value": 3, "unit": "ms"}', 0.2))
    assert wrong["unit"] == "ms" and wrong["value"] != 3
    assert not _parses(quality.malformed('{"value": 3}'))


def test_texts_match_after_normalisation():
    assert quality.normalise("  Caf\u0065\u0301\n\t latte ") == "Café latte"


def test_a_bad_knowledge_file_is_refused(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "q", "category": "factual"}\n')  # no answer
    done = run_cli("vllm", BF16, "--knowledge", str(bad))
    assert done.returncode == 2 and "bad.jsonl:1" in done.stderr
    done = run_cli("vllm", BF16, "--knowledge", str(tmp_path / "missing.jsonl"))
    assert done.returncode == 2 and "cannot read" in done.stderr


# --- the deployment's simulator options ----------------------------------------------------
def test_knowledge_reaches_the_simulator_argv():
    cfg = LaunchConfig(
        engine="vllm",
        model=BF16,
        settings={},
        runner="simulator",
        simulator={"knowledge": "/var/lib/panel/probes/knowledge.jsonl", "time_scale": 0.5},
    )
    argv = list(render_process(cfg, python=sys.executable).argv)
    at = argv.index("--knowledge")
    assert argv[at + 1] == "/var/lib/panel/probes/knowledge.jsonl"
    assert argv[:3] == [sys.executable, "-m", "hosts.simulator"]
    model, settings, sim = simulator_parse("vllm", argv[4:])
    assert sim["knowledge"] == "/var/lib/panel/probes/knowledge.jsonl" and model == BF16
    # the host agent checks the program, not the simulator's options: it runs as rendered
    assert ExecPolicy().check(argv)[-2:] == ["--knowledge", argv[at + 1]]


@pytest.mark.parametrize(
    "path",
    ["knowledge.jsonl", "/a/../b.jsonl", "/a/-x.jsonl", "/a/b\n", "/a b.jsonl", "/a/%h", 3, ""],
)
def test_bad_knowledge_paths_are_refused(path):
    cfg = LaunchConfig(
        engine="vllm", model=BF16, settings={}, runner="simulator", simulator={"knowledge": path}
    )
    with pytest.raises(LaunchError) as caught:
        cfg.validated()
    assert "simulator.knowledge" in caught.value.errors
