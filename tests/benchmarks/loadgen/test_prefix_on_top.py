"""A shared prefix comes on top of the input length, as vLLM's ``--random-prefix-len``
(vllm/benchmarks/datasets.py RandomDataset: prompt = prefix_len fixed tokens + a context of
input_len × [1 - range_ratio, 1 + range_ratio]), and the built-in profiles send what their
names say. Pure: prompts are generated and counted, nothing is sent."""

import functools
import statistics

import pytest

from benchmarks.loadgen import profile as P
from benchmarks.loadgen.__main__ import build_parser, length
from benchmarks.loadgen.dataset import WORDS, PromptFactory
from benchmarks.loadgen.spec import Dataset, LengthDist, SpecError

N = 1000


def sent(dataset: Dataset, n: int = N, seed: int = 0):
    """(prompts, their token counts, tokens each shares with its group's prefix)."""
    factory = PromptFactory(dataset, seed)
    prompts = [factory.make(i) for i in range(n)]
    shared = []
    for p in prompts:
        prefix = factory._prefix_ids(p.prefix_id) if p.prefix_id is not None else []
        k = 0
        while k < min(len(prefix), len(p.payload)) and p.payload[k] == prefix[k]:
            k += 1
        shared.append(k)
    return prompts, [len(p.payload) for p in prompts], shared


def test_a_shared_prefix_is_sent_on_top_of_the_input_len():
    prompts, lengths, shared = sent(
        Dataset(LengthDist("fixed", 300), LengthDist("fixed", 8), prefix_len=2000), n=20
    )
    assert lengths == [2300] * 20  # was 300: the prefix was cut into the input
    assert shared == [2000] * 20
    assert all(p.input_len == 2300 for p in prompts)  # what the records count as sent
    # Each request's own part is its own.
    assert len({tuple(p.payload[2000:]) for p in prompts}) == 20


def test_the_range_ratio_spreads_the_own_part_only_with_vllms_bounds():
    # vLLM: [floor(len * (1 - r)), ceil(len * (1 + r))]; 3 × [0.5, 1.5] → 1…5 (round gave 2…4).
    own = length("fixed", 3, 0.0, 0.5)
    assert (own.low, own.high) == (1, 5)
    _, lengths, shared = sent(Dataset(own, LengthDist("fixed", 8), prefix_len=10), n=400)
    assert set(shared) == {10}
    assert set(lengths) == {11, 12, 13, 14, 15}
    with pytest.raises(SpecError, match="range-ratio"):
        length("fixed", 100, 0.0, 1.0)


def test_the_cli_help_says_the_prefix_is_added():
    help_text = " ".join(build_parser().format_help().split())
    assert "shared prefix tokens sent before each request's own --random-input-len tokens" in (
        help_text
    )
    assert "the total input is their sum" in help_text


def test_only_the_share_of_requests_carries_a_prefix_and_groups_differ():
    prompts, lengths, shared = sent(
        Dataset(
            LengthDist("fixed", 100),
            LengthDist("fixed", 8),
            prefix_len=50,
            prefix_groups=3,
            prefix_share=0.5,
        )
    )
    carried = [p.prefix_id is not None for p in prompts]
    assert 0.45 < sum(carried) / N < 0.55
    assert all(n == (150 if c else 100) for n, c in zip(lengths, carried, strict=True))
    heads = {p.prefix_id: tuple(p.payload[:50]) for p in prompts if p.prefix_id is not None}
    assert len(heads) == 3 and len(set(heads.values())) == 3


def test_the_former_rule_still_cuts_the_prefix_into_the_input():
    _, lengths, shared = sent(
        Dataset(
            LengthDist("fixed", 300),
            LengthDist("fixed", 8),
            prefix_len=2000,
            prefix_within_input=True,
        ),
        n=10,
    )
    assert lengths == [300] * 10 and shared == [300] * 10


def test_a_trace_rows_input_is_the_whole_prompt():
    factory = PromptFactory(Dataset(prefix_len=100), seed=0)
    row = factory.make(0, input_len=250, output_len=8, prefix_id=0)
    assert len(row.payload) == row.input_len == 250
    assert row.payload[:100] == factory._prefix_ids(0)
    short = factory.make(1, input_len=40, output_len=8, prefix_id=0)
    assert short.payload == factory._prefix_ids(0)[:40]


def test_text_prompts_share_the_prefix_text_and_keep_their_own(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    dataset = Dataset(
        LengthDist("uniform", low=5, high=50),
        LengthDist("fixed", 4),
        prefix_len=200,
        prompt_format="text",
        tokenizer=str(tmp_path),
    )
    factory = PromptFactory(dataset, seed=1)
    prompts = [factory.make(i) for i in range(30)]
    heads = set()
    for p in prompts:
        tokens = tokenizer.encode(p.payload).ids
        assert len(tokens) == p.input_len and 205 <= p.input_len <= 250
        heads.add(tuple(tokens[:200]))
    assert len(heads) == 1  # one prefix, the same text in every request
    assert len({p.payload for p in prompts}) == 30
    # Without a tokenizer the words follow the ids too: the own part is not swallowed.
    plain = PromptFactory(Dataset(LengthDist("fixed", 40), prefix_len=200, prompt_format="text"), 0)
    plain.tokens_per_word = 1.3
    texts = [plain.make(i).payload for i in range(5)]
    assert len(set(texts)) == 5
    assert len({t.split()[: round(200 / 1.3)].__repr__() for t in texts}) == 1


# -- what the profiles send -------------------------------------------------------------------


BUILTIN_N = 400  # a RAG prompt is ~6,000 random ids: enough for the means, and quick


@functools.cache
def builtin_sends(name: str):
    spec = P.build_spec(P.BUILTINS[name]["spec"], "http://x.invalid", "m")
    prompts, lengths, shared = sent(spec.dataset, n=BUILTIN_N, seed=spec.seed)
    return {
        "mean": statistics.fmean(lengths),
        "min": min(lengths),
        "max": max(lengths),
        "carried": sum(p.prefix_id is not None for p in prompts) / BUILTIN_N,
        "shared_mean": statistics.fmean(shared),
        "shared_share": sum(shared) / sum(lengths),
        "carriers_min": min(
            (n for n, p in zip(lengths, prompts, strict=True) if p.prefix_id is not None),
            default=None,
        ),
    }


def test_the_shared_system_prompt_profile_sends_its_2000_token_prefix():
    s = builtin_sends("Shared system prompt")
    # 90 % of requests carry one of 4 prefixes: 2,000 shared tokens, then ~300 of their own.
    assert 0.85 < s["carried"] < 0.95
    assert s["carriers_min"] >= 2000 + 16
    assert 2000 < s["mean"] < 2200  # was ~300: the prefix never went out
    assert 0.8 < s["shared_share"] < 0.9  # ~1,800 of ~2,100 tokens a request


@pytest.mark.parametrize(
    ("name", "low", "high", "mean_range"),
    [
        ("Interactive chat", 16, 4096, (500, 700)),  # short prompts
        ("RAG long-prompt", 4000, 8000, (5800, 6200)),  # 4–8k-token prompts
        ("Offline batch", 64, 4096, (900, 1100)),
    ],
)
def test_the_other_builtins_send_what_their_names_say(name, low, high, mean_range):
    s = builtin_sends(name)
    assert low <= s["min"] and s["max"] <= high
    assert mean_range[0] < s["mean"] < mean_range[1]
    assert s["shared_mean"] == 0


@pytest.mark.parametrize("name", list(P.BUILTINS))
def test_the_one_reading_of_a_profile_agrees_with_the_generator(name):
    s = builtin_sends(name)
    mean, shared = P.prompt_tokens(P.BUILTINS[name]["spec"])
    assert mean == pytest.approx(s["mean"], rel=0.05)
    assert shared == pytest.approx(s["shared_mean"], rel=0.05, abs=1)


def test_the_one_reading_under_the_former_rule_and_a_replay():
    doc = {"input_len": {"kind": "fixed", "mean": 300}, "prefix_len": 2000}
    assert P.prompt_tokens(doc) == (2300, 2000)
    assert P.prompt_tokens({**doc, "prefix_within_input": True}) == (300, 300)
    replay = {**doc, "replay": {"rows": [[0, 2500, 8, 0], [1, 100, 8, None]]}}
    assert P.prompt_tokens(replay) == (1300, 1000)


def test_the_document_says_which_rule_and_refuses_a_non_boolean():
    assert "+ 2000-token shared prefix on 90%" in P.describe(
        P.BUILTINS["Shared system prompt"]["spec"]
    )
    within = {"prefix_len": 10, "prefix_within_input": True}
    assert "(within the input)" in P.describe(within)
    assert P.build_spec(within, "http://x.invalid", "m").dataset.prefix_within_input is True
    with pytest.raises(SpecError, match="prefix_within_input"):
        P.validate({"prefix_within_input": "yes"})


def test_a_version_1_export_keeps_the_rule_it_was_written_under():
    old = {
        "format": P.EXPORT_FORMAT,
        "version": 1,
        "name": "agents",
        "spec": {"input_len": {"kind": "fixed", "mean": 300}, "prefix_len": 2000},
    }
    _, _, spec = P.read_export(old)
    assert spec["prefix_within_input"] is True
    _, _, none = P.read_export({**old, "spec": {}})
    assert none["prefix_within_input"] is False
    current = P.export_document("agents", "", P.validate(old["spec"]))
    assert current["version"] == 2
    assert P.read_export(current)[2]["prefix_within_input"] is False
