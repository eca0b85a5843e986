"""Prompts of exact lengths without downloading anything, and recorded traces."""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass
from pathlib import Path

from benchmarks.loadgen.spec import Dataset, SpecError

# Token ids well inside every supported vocabulary, away from special tokens.
TOKEN_LOW, TOKEN_HIGH = 1000, 30000
WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()


@dataclass(slots=True)
class Prompt:
    """One request's prompt, the lengths it was made for and its shared-prefix group."""

    payload: list[int] | str
    input_len: int
    output_len: int
    prefix_id: int | None


class PromptFactory:
    """Deterministic prompts: request ``i`` gets the same prompt for the same seed."""

    def __init__(self, dataset: Dataset, seed: int, tokens_per_word: float = 1.0):
        self.dataset = dataset
        self.seed = seed
        self.tokens_per_word = tokens_per_word
        self.tokenizer = load_tokenizer(dataset.tokenizer) if dataset.tokenizer else None
        self._prefixes: dict[int, list[int]] = {}
        self._prefix_texts: dict[tuple[int | None, int], str] = {}

    def _prefix_ids(self, group: int) -> list[int]:
        if group not in self._prefixes:
            rng = random.Random(f"prefix:{self.seed}:{group}")
            self._prefixes[group] = [
                rng.randrange(TOKEN_LOW, TOKEN_HIGH) for _ in range(self.dataset.prefix_len)
            ]
        return self._prefixes[group]

    def make(
        self,
        index: int,
        input_len: int | None = None,
        output_len: int | None = None,
        prefix_id: int | None = -1,
    ) -> Prompt:
        """Prompt ``index``; lengths and prefix from a trace row when given.

        A sampled prompt is the group's shared prefix followed by ``input_len`` tokens of its
        own (vLLM's ``--random-prefix-len``). A trace row's ``input_len`` is the whole prompt
        as it was recorded, so its prefix is counted within it.
        """
        d = self.dataset
        rng = random.Random(f"req:{self.seed}:{index}")
        from_trace = input_len is not None
        n_in = input_len if from_trace else d.input_len.sample(rng)
        n_out = output_len if output_len is not None else d.output_len.sample(rng)
        if prefix_id == -1:  # not given: the dataset decides
            shared = d.prefix_len > 0 and rng.random() < d.prefix_share
            prefix_id = rng.randrange(d.prefix_groups) if shared else None
        prefix = self._prefix_ids(prefix_id) if prefix_id is not None else []
        if from_trace or d.prefix_within_input:
            prefix = prefix[:n_in]
            own = n_in - len(prefix)
        else:
            own = n_in
        rest = [rng.randrange(TOKEN_LOW, TOKEN_HIGH) for _ in range(own)]
        total = len(prefix) + own
        if d.prompt_format == "token_ids":
            return Prompt(prefix + rest, total, n_out, prefix_id)
        return Prompt(self._text(prefix, rest, prefix_id), total, n_out, prefix_id)

    def _text(self, prefix: list[int], rest: list[int], group: int | None) -> str:
        # The shared part and the own part become text separately, so that the text of a
        # shared prefix is the same in every request of its group and the own part is
        # never swallowed by it (a prefix longer in words than the prompt would make every
        # request of the group the same text).
        parts = []
        if prefix:
            key = (group, len(prefix))
            if key not in self._prefix_texts:
                self._prefix_texts[key] = self._ids_text(prefix)
            parts.append(self._prefix_texts[key])
        if rest or not parts:
            parts.append(self._ids_text(rest))
        return " ".join(parts)

    def _ids_text(self, ids: list[int]) -> str:
        if not ids:
            return ""
        if self.tokenizer is not None:
            return self._exact_text(ids)
        words = max(1, round(len(ids) / self.tokens_per_word))
        # Same ids → same words, so shared prefixes stay shared as text too.
        return " ".join(WORDS[ids[i % len(ids)] % len(WORDS)] for i in range(words))

    def _exact_text(self, ids: list[int]) -> str:
        """Text that the local tokenizer turns into exactly len(ids) tokens."""
        n = len(ids)
        words = [WORDS[i % len(WORDS)] for i in ids]
        text = " ".join(words)
        encoded = self.tokenizer.encode(text, add_special_tokens=False).ids
        while len(encoded) < n:  # a tokenizer that merges words: add more
            words.extend(words[: n - len(encoded)])
            text = " ".join(words)
            encoded = self.tokenizer.encode(text, add_special_tokens=False).ids
        return self.tokenizer.decode(encoded[:n])


def load_tokenizer(path: str):
    """A Hugging Face ``tokenizers`` tokenizer from a local file or directory (no download)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SpecError(
            "dataset.tokenizer needs the 'tokenizers' package (pip install tokenizers)"
        ) from None
    file = Path(path)
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        raise SpecError(f"dataset.tokenizer: no tokenizer.json at {path!r}")
    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:  # noqa: BLE001 - the library raises plain Exception
        raise SpecError(f"dataset.tokenizer: cannot load {file}: {exc}") from None


@dataclass(frozen=True, slots=True)
class TraceRow:
    timestamp: float
    input_tokens: int
    output_tokens: int
    prefix_id: int | None


def load_trace(path: str) -> list[TraceRow]:
    """JSONL (one object a line) or CSV with a header; rows sorted by timestamp."""
    file = Path(path)
    if not file.is_file():
        raise SpecError(f"trace: no such file {path!r}")
    rows = []
    with file.open(newline="") as handle:
        if file.suffix.lower() == ".csv":
            records = list(csv.DictReader(handle))
        else:
            records = []
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise SpecError(f"trace line {number}: {exc.msg}") from None
    for number, record in enumerate(records, start=1):
        try:
            prefix = record.get("prefix_id")
            rows.append(
                TraceRow(
                    float(record["timestamp"]),
                    int(record["input_tokens"]),
                    int(record["output_tokens"]),
                    int(prefix) if prefix not in (None, "") else None,
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecError(
                f"trace row {number}: needs timestamp, input_tokens, output_tokens ({exc})"
            ) from None
        if rows[-1].input_tokens < 1 or rows[-1].output_tokens < 1:
            raise SpecError(f"trace row {number}: token counts must be >= 1")
    if not rows:
        raise SpecError(f"trace: {path!r} has no rows")
    rows.sort(key=lambda r: r.timestamp)
    return rows
