"""A tiny deterministic tokenizer and text generator: enough to count tokens like an engine,
hash prompt blocks for prefix caching, and stream plausible text."""

from __future__ import annotations

import re
import zlib

PIECE = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")
FIRST_WORD_ID = 1000
WORDS = (
    "the model answers with a short and useful reply about latency throughput memory cache "
    "batch prefill decode token request server engine queue GPU kernel bandwidth compute "
    "context prompt schedule budget sequence block prefix hit rate cost power clock node "
    "tensor parallel weight activation sample stream chunk metric percentile load test"
).split()
SPECIAL_TOKENS = 3  # a chat template's role markers per message


def tokenize(text: str, vocab: int) -> list[int]:
    """Word-ish pieces (a word with its leading space, or one punctuation mark) → ids."""
    return [token_id(p, vocab) for p in PIECE.findall(text)]


def chat_prompt_ids(messages: list[dict], vocab: int) -> list[int]:
    """Messages rendered through a generic chat template, then tokenized."""
    ids: list[int] = [1]  # BOS
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):  # OpenAI content parts
            content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
        ids.extend([2, 3 + len(str(message.get("role", "")))])
        ids.extend(tokenize(str(content), vocab))
        ids.append(4)
    ids.extend([2, 3 + len("assistant")])  # generation prompt
    return ids


PUNCTUATION = (".", ",")
PUNCTUATION_EVERY = 17  # one output token in 17 is a punctuation mark: the text reads as prose


def token_text(request_key: int, position: int) -> str:
    """The text of output token ``position`` of a request: reproducible for a seed.

    Each output token is exactly one piece of ``tokenize`` (a word with its leading space, or
    one punctuation mark on its own), so the generated text re-tokenizes to as many tokens as
    the usage reports, as a real engine's text does with its own tokenizer: clients that count
    tokens from the text (AIPerf by default) then count what the engine counted."""
    if position % PUNCTUATION_EVERY == PUNCTUATION_EVERY - 1:
        return PUNCTUATION[(request_key + position) % len(PUNCTUATION)]
    return " " + WORDS[(request_key + position * 2654435761) % len(WORDS)]


def token_id(piece: str, vocab: int) -> int:
    """The id ``tokenize`` gives one piece of text."""
    return FIRST_WORD_ID + zlib.crc32(piece.encode()) % (vocab - FIRST_WORD_ID)


def detokenize(ids: list[int]) -> str:
    return "".join(" " + WORDS[i % len(WORDS)] for i in ids)


def block_hashes(ids: list[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks (vLLM's prefix-cache keys)."""
    out, parent = [], 0
    for start in range(0, len(ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(ids[start : start + block_size])))
        out.append(parent)
    return out
