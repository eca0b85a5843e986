"""The simulated output text: one token = one piece of the simulator's own tokenizer; stop
strings and logprobs as vLLM's detokenizer and sampler produce them."""

import math

import pytest

from hosts.simulator import text
from hosts.simulator.wire_text import ChoiceText, token_logprobs

VOCAB = 128256
LENGTHS = [1, 2, 15, 16, 17, 18, 33, 34, 35, 100, 257, 1000]


@pytest.mark.parametrize("key", [0, 1, 7, 12345, 2**31 + 11, 4294967295])
def test_output_text_retokenizes_to_its_token_count(key):
    """AIPerf counts output tokens from the text: it must count what the usage says (the old
    text put ". word" — two pieces — in every 17th token, 128 tokens read back as 135)."""
    for n in LENGTHS:
        pieces = [text.token_text(key, i) for i in range(n)]
        assert len(text.tokenize("".join(pieces), VOCAB)) == n, (key, n)
        assert all(len(text.tokenize(p, VOCAB)) == 1 for p in pieces)


def test_output_text_reads_as_prose():
    out = "".join(text.token_text(42, i) for i in range(60))
    assert out.startswith(" ") and ("." in out or "," in out)
    assert ".." not in out and " ." not in out  # punctuation follows a word


def test_stop_string_ends_the_text_before_it():
    key = 99
    full = "".join(text.token_text(key, i) for i in range(200))
    word = text.token_text(key, 40)  # a stop string that first occurs somewhere in the text
    first = full.find(word)
    expected_tokens = len(text.tokenize(full[: first + len(word)], VOCAB))
    out = ChoiceText(key, [word], include_stop=False, min_tokens=0, hold=True)
    assert out.plan(200) == expected_tokens
    assert out.stop_reason == word and out.full_text(expected_tokens) == full[:first]
    kept = ChoiceText(key, [word], include_stop=True, min_tokens=0, hold=True)
    kept.plan(200)
    assert kept.full_text(expected_tokens) == full[: first + len(word)]


def test_stop_string_ignored_before_min_tokens_and_beyond_the_target():
    key = 5
    word = text.token_text(key, 0)
    assert ChoiceText(key, [word], include_stop=False, min_tokens=0, hold=True).plan(500) == 1
    out = ChoiceText(key, [word], include_stop=False, min_tokens=3, hold=True)
    out.plan(500)
    assert out.stop_at is None or out.stop_at > 3
    assert ChoiceText(key, [word + "zzz"], False, 0, True).plan(50) == 50  # never matches


def test_streamed_deltas_hold_back_a_possible_stop_string_then_add_up():
    """vLLM holds back len(stop) - 1 characters while streaming; the deltas still add up to
    the final (cut) text."""
    key = 3
    word = text.token_text(key, 30)
    out = ChoiceText(key, [word], include_stop=False, min_tokens=0, hold=True)
    target = out.plan(300)
    deltas = []
    for upto in range(1, target + 1):
        deltas += out.deltas(upto, upto == target)
    assert len(deltas) == target  # one chunk per token, some of them empty
    assert "".join(deltas) == out.full_text(target)
    assert any(d == "" or len(d) < len(text.token_text(key, i)) for i, d in enumerate(deltas))


@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_logprobs_are_finite_ordered_and_a_distribution(k):
    for pos in range(50):
        token, lp, alts = token_logprobs(77, pos, k)
        assert token == text.token_text(77, pos)
        values = [lp] + [v for _, v in alts]
        assert len(alts) == k and all(math.isfinite(v) and v <= 0 for v in values)
        assert values == sorted(values, reverse=True)  # the sampled token is the most likely
        assert sum(math.exp(v) for v in values) < 1.0
        assert len({t for t, _ in alts} | {token}) == k + 1
        assert token_logprobs(77, pos, k) == (token, lp, alts)  # deterministic
