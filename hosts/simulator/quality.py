"""What the simulated model "knows": answers to known prompts, right or wrong as a model of its
size and quantisation would be.

The knowledge comes as data (``--knowledge FILE``): the simulator never imports a probe package
and never reads an id from a request; it recognises an item by its text alone. The file is JSON
Lines, one item per line (blank lines and lines starting with ``#`` are skipped)::

    {"text": "<the exact text of the last user message, or the completions prompt>",
     "category": "factual|reasoning|math|json|format|long_context|<other>",
     "language": "en|ko|…",
     "answer": "<a correct answer text>",
     "wrong": "<a plausible wrong answer>" | null,
     "json": true|false}

``text``, ``category`` and ``answer`` are required; ``language`` defaults to "en", ``wrong`` to
null, ``json`` to false. Texts match after normalisation (Unicode NFC, runs of whitespace
collapsed to one space, stripped); a later line with the same text replaces an earlier one.

Whether the model answers an item correctly is deterministic per (item text, model config):
``u`` = a hash of (normalised text, model family) in [0, 1), the same for every config of one
base model, and the answer is correct iff ``u < accuracy(config) + jitter``, ``jitter`` a hash of
(text, config) in ±0.02 for quantised configs (0 at full precision). An item the full-precision
model misses is therefore mostly missed by its quantised variants too, as paired evaluations of
real quantised models see, and a few items flip either way. Sampling (temperature, seed, ``n``)
does not change the answer: the probe runs at temperature 0, and a model that knows an answer
gives it at any temperature here.

Accuracy: a Llama-3.1-8B-class table by category × language (English, and a second column for
every other language), scaled with the model's size (the error rate × (8B / params)^0.25), minus
what published quantisation studies report the variant loses (``LOSS_PP``).
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from hosts.simulator.text import PIECE, token_text
from hosts.simulator.wire_text import ChoiceText

# Llama-3.1-8B-Instruct class accuracy: category → (English, other languages).
BASE_ACCURACY: dict[str, tuple[float, float]] = {
    "factual": (0.88, 0.72),
    "reasoning": (0.80, 0.66),
    "math": (0.76, 0.68),
    "json": (0.90, 0.90),
    "format": (0.86, 0.86),
    "long_context": (0.82, 0.82),
}
OTHER_CATEGORY = (0.80, 0.70)  # a category the table does not name
REFERENCE_PARAMS = 8.03e9  # the table's model size
# Without structured output a third of the wrong JSON answers are malformed: validity
# 1 − 0.10 / 3 ≈ 0.97 for the 8B model at full precision; with it every answer parses.
MALFORMED_SHARE = 3

# Accuracy lost, in percentage points, per weight/KV format (vLLM/SGLang quantisation studies:
# FP8 W8A8 and FP8 KV caches within half a point; INT8 W8A8 about 1.5; 4-bit weight-only
# AWQ/GPTQ ~2 on English knowledge, more on reasoning, maths, other languages, long contexts,
# and on JSON that no grammar constrains).
AWQ_LOSS_PP = {
    "factual": 2.0,
    "reasoning": 4.0,
    "math": 8.0,
    # Without structured output; JSON_STRUCTURED_AWQ_LOSS_PP with it. Format compliance is
    # where small quantised models slip most (keys renamed, values translated, braces left
    # open): set so that the built-in set's 41 JSON items show it at 95 %.
    "json": 20.0,
    "format": 2.0,
    "long_context": 6.0,
}
AWQ_OTHER_CATEGORY_PP = 3.0
# A floor for every category in another language than English: non-English suffers first
# (fewer tokens of it in the calibration data of 4-bit quantisers).
AWQ_NON_ENGLISH_PP = 12.0
JSON_STRUCTURED_AWQ_LOSS_PP = 2.0
FLAT_LOSS_PP = {"fp8": 0.3, "int8": 1.5}  # weights, every category
FP8_KV_LOSS_PP = 0.5
JITTER = 0.02
INT8_METHODS = ("w8a8_int8", "experts_int8", "int8", "bitsandbytes")

WHITESPACE = re.compile(r"\s+")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class KnowledgeError(ValueError):
    """The knowledge file cannot be used; ``str()`` names the line."""


def normalise(text: str) -> str:
    """The form texts are matched in: NFC, whitespace runs as one space, stripped."""
    return WHITESPACE.sub(" ", unicodedata.normalize("NFC", text)).strip()


@dataclass(frozen=True, slots=True)
class Item:
    """One thing the model knows."""

    text: str  # normalised
    category: str
    language: str
    answer: str
    wrong: str | None = None
    json: bool = False


def load_knowledge(path: str | Path) -> dict[str, Item]:
    """The items of a knowledge file by normalised text, or KnowledgeError."""
    items: dict[str, Item] = {}
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise KnowledgeError(f"cannot read {path}: {exc}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            item = _item(json.loads(line))
        except (json.JSONDecodeError, TypeError, ValueError) as exc:
            raise KnowledgeError(f"{path}:{number}: {exc}") from None
        items[item.text] = item
    return items


def _item(raw) -> Item:
    if not isinstance(raw, dict):
        raise ValueError("expected a JSON object")
    for name in ("text", "category", "answer"):
        if not isinstance(raw.get(name), str) or not raw[name].strip():
            raise ValueError(f"{name!r} must be a non-empty string")
    language = raw.get("language") or "en"
    wrong = raw.get("wrong")
    if not isinstance(language, str) or (wrong is not None and not isinstance(wrong, str)):
        raise ValueError("'language' must be a string and 'wrong' a string or null")
    if not isinstance(raw.get("json", False), bool):
        raise ValueError("'json' must be true or false")
    return Item(
        text=normalise(raw["text"]),
        category=raw["category"].strip().lower(),
        language=language.strip().lower(),
        answer=raw["answer"],
        wrong=wrong or None,
        json=raw.get("json", False),
    )


def unit_hash(*parts: str) -> float:
    """A stable hash of ``parts`` in [0, 1) (not Python's salted ``hash``)."""
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True, slots=True)
class Variant:
    """The model config that decides accuracy: base model, weight and KV formats."""

    family: str  # the catalog's base model key ("llama-3.1-8b")
    params: float
    weights: str  # "bf16", "fp8", "int8", "awq"
    kv: str  # "auto" or "fp8"

    @classmethod
    def of(cls, cfg) -> Variant:
        """The variant a SimConfig runs (its model as loaded and its settings)."""
        model, settings = cfg.model, cfg.settings
        family = re.sub(r"-(fp8|awq)$", "", model.key)
        weights = model.quantization or "bf16"
        if str(settings.get("quantization") or "") in INT8_METHODS:
            weights = "int8"
        kv = "fp8" if str(settings.get("kv_cache_dtype") or "auto").startswith("fp8") else "auto"
        return cls(family, model.params, weights, kv)

    @property
    def key(self) -> str:
        return f"{self.family}|w={self.weights}|kv={self.kv}"

    @property
    def full_precision(self) -> bool:
        return self.weights == "bf16" and self.kv == "auto"

    def loss_pp(self, category: str, english: bool, structured: bool) -> float:
        """Percentage points this variant loses against the full-precision model."""
        loss = FLAT_LOSS_PP.get(self.weights, 0.0)
        if self.weights == "awq":
            if category == "json" and structured:
                loss = JSON_STRUCTURED_AWQ_LOSS_PP
            else:
                loss = AWQ_LOSS_PP.get(category, AWQ_OTHER_CATEGORY_PP)
            if not english:
                loss = max(loss, AWQ_NON_ENGLISH_PP)
        if self.kv == "fp8":
            loss += FP8_KV_LOSS_PP
        return loss

    def accuracy(self, category: str, language: str, structured: bool = False) -> float:
        """Probability of a correct answer to an item of ``category`` in ``language``."""
        english = language == "en"
        en, other = BASE_ACCURACY.get(category, OTHER_CATEGORY)
        base = en if english else other
        # Bigger models err less, with diminishing returns (error ∝ params^-0.25).
        error = (1 - base) * (REFERENCE_PARAMS / max(self.params, 1e8)) ** 0.25
        accuracy = 1 - error - self.loss_pp(category, english, structured) / 100
        return min(max(accuracy, 0.02), 0.99)


class QualityModel:
    """Answers known prompts for one simulated model config."""

    def __init__(self, variant: Variant, items: dict[str, Item]):
        self.variant = variant
        self.items = items

    @classmethod
    def for_config(cls, cfg, path: str | Path | None) -> QualityModel:
        return cls(Variant.of(cfg), load_knowledge(path) if path else {})

    def lookup(self, text: str | None) -> Item | None:
        if text is None or not self.items:
            return None
        return self.items.get(normalise(text))

    def correct(self, item: Item, structured: bool = False) -> bool:
        """Whether this config answers ``item`` correctly (deterministic, paired)."""
        v = self.variant
        u = unit_hash("u", item.text, v.family)
        jitter = 0.0 if v.full_precision else (2 * unit_hash("j", item.text, v.key) - 1) * JITTER
        json_structured = structured and item.json
        return u < v.accuracy(item.category, item.language, json_structured) + jitter

    def answer(self, text: str | None, structured: bool = False) -> str | None:
        """The model's answer to a known prompt (None: not known, the engine makes text up).
        ``structured``: the request constrains the output (JSON schema, regex, …)."""
        item = self.lookup(text)
        if item is None:
            return None
        if self.correct(item, structured):
            return item.answer
        return self.wrong_answer(item, structured)

    def answer_pieces(self, text: str | None, structured: bool = False) -> list[str] | None:
        """The answer as the simulator's tokenizer cuts it: one piece per output token."""
        answer = self.answer(text, structured)
        return None if answer is None else PIECE.findall(answer)

    def wrong_answer(self, item: Item, structured: bool) -> str:
        """A plausible wrong answer: the item's own when it has one (and, under structured
        output, it parses), else a perturbation of the right one. Seeded by the base model, not
        the config: variants of one model that miss an item mostly give the same wrong answer."""
        seed = unit_hash("w", item.text, self.variant.family)
        if not item.json:
            return item.wrong or perturb_text(item.answer, item.language, seed)
        if structured:  # a grammar cannot emit bad JSON: a wrong value at worst
            return (
                item.wrong
                if item.wrong and _parses(item.wrong)
                else perturb_json(item.answer, seed)
            )
        wrong = item.wrong or perturb_json(item.answer, seed)
        if _parses(wrong) and int(seed * 1000) % MALFORMED_SHARE == 0:
            return malformed(wrong)
        return wrong  # the item's own wrong answer as given, malformed or not

    def report(self) -> dict:
        """Items known and this config's accuracy table (``/simulator/quality``)."""
        categories = sorted({*BASE_ACCURACY, *(i.category for i in self.items.values())})
        languages = sorted({"en", "ko", *(i.language for i in self.items.values())})
        v = self.variant
        table = {c: {lang: round(v.accuracy(c, lang), 4) for lang in languages} for c in categories}
        known: dict[str, int] = {}
        for item in self.items.values():
            known[f"{item.category}/{item.language}"] = (
                known.get(f"{item.category}/{item.language}", 0) + 1
            )
        return {
            "items": len(self.items),
            "known": dict(sorted(known.items())),
            "model": {"family": v.family, "weights": v.weights, "kv_cache": v.kv},
            "accuracy": table,
            "json_structured_accuracy": {
                lang: round(v.accuracy("json", lang, True), 4) for lang in languages
            },
            "json_validity_unstructured": {
                lang: round(1 - (1 - v.accuracy("json", lang)) / MALFORMED_SHARE, 4)
                for lang in languages
            },
        }


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return False
    return True


def malformed(text: str) -> str:
    """JSON a model left unfinished: its last closing brace or bracket dropped."""
    stripped = text.rstrip()
    if stripped and stripped[-1] in "}]":
        return stripped[:-1]
    return "{" + stripped  # not an object or array: an unclosed brace before it


DISTRACTORS = {
    "en": ("London", "1999", "blue", "Mercury", "none of them", "Jupiter", "42"),
    "ko": ("서울", "모르겠습니다", "1999년", "파란색", "부산", "없음"),
}
OPPOSITES = {"yes": "no", "no": "yes", "true": "false", "false": "true", "예": "아니요"}
OPPOSITES.update({"아니요": "예", "네": "아니요"})


def perturb_text(answer: str, language: str, seed: float) -> str:
    """A different short answer: a number off by a little, a yes/no flipped, or a distractor."""
    numbers = list(NUMBER.finditer(answer))
    if numbers:
        last = numbers[-1]
        return answer[: last.start()] + _off_by(last.group(), seed) + answer[last.end() :]
    bare = answer.strip().rstrip(".").lower()
    if bare in OPPOSITES:
        return OPPOSITES[bare]
    pool = DISTRACTORS.get(language, DISTRACTORS["en"])
    start = int(seed * len(pool))
    for i in range(len(pool)):
        candidate = pool[(start + i) % len(pool)]
        if candidate.lower() not in answer.lower():
            return candidate
    return answer + " (probably)"


def _off_by(number: str, seed: float) -> str:
    delta = 1 + int(seed * 6) % 3  # 1, 2 or 3
    sign = -1 if int(seed * 1000) % 2 else 1
    if "." in number:
        decimals = len(number.split(".")[1])
        return f"{float(number) + sign * delta * 10**-decimals:.{decimals}f}"
    return str(int(number) + sign * delta)


def perturb_json(answer: str, seed: float) -> str:
    """Valid JSON with one wrong value (the first leaf changed), or a JSON string holding a
    perturbed text when the answer is not JSON."""
    try:
        value = json.loads(answer)
    except json.JSONDecodeError:
        return json.dumps(perturb_text(answer, "en", seed), ensure_ascii=False)
    return json.dumps(_perturb_value(value, seed), ensure_ascii=False)


def _perturb_value(value, seed: float):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return json.loads(_off_by(json.dumps(value), seed))
    if isinstance(value, str):
        return perturb_text(value, "en", seed) if value else "unknown"
    if isinstance(value, list):
        if not value:
            return [0]
        return [_perturb_value(value[0], seed), *value[1:]]
    if isinstance(value, dict):
        if not value:
            return {"answer": None}
        first = next(iter(value))
        return {**value, first: _perturb_value(value[first], seed)}
    return 0  # null


def request_text(data: dict, chat: bool) -> list[str | None]:
    """The text a request is recognised by, per prompt: the last user message of a chat, the
    prompt (or each prompt of a batch) of a completion; None where there is no text."""
    if chat:
        messages = data.get("messages") or []
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                content = message.get("content") or ""
                if isinstance(content, list):  # OpenAI content parts, as text.chat_prompt_ids
                    content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
                return [str(content)]
        return [None]
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    return []  # token ids: nothing to recognise


class AnswerText(ChoiceText):
    """A choice whose first tokens are a known answer: the answer's pieces (as the simulator's
    tokenizer cuts it, so the text re-tokenizes to the usage's count), then, should the engine
    go on (``ignore_eos``, ``min_tokens``), made-up text as for any other prompt."""

    __slots__ = ("pieces",)

    def __init__(self, pieces: list[str], key: int, stop, include_stop, min_tokens, hold):
        super().__init__(key, stop, include_stop, min_tokens, hold)
        self.pieces = pieces

    def piece(self, position: int) -> str:
        if position < len(self.pieces):
            return self.pieces[position]
        return token_text(self.key, position)

    # ChoiceText's stop-string logic, over this choice's pieces.
    def plan(self, target: int) -> int:
        if not self.stop:
            return target
        out = ""
        for count in range(1, target + 1):
            piece = self.piece(count - 1)
            out += piece
            if count <= self.min_tokens:
                continue
            for stop in self.stop:
                start = max(0, len(out) + 1 - len(piece) - len(stop)) if stop else 0
                index = out.find(stop, start)
                if index == -1:
                    continue
                if self.include_stop:
                    index += len(stop)
                self.stop_at, self.stop_reason = count, stop
                self.final_text = out[:index]
                return count
        return target

    def deltas(self, upto: int, finished: bool) -> list[str]:
        start = self.sent_tokens
        self.sent_tokens = upto
        if not self.stop:
            return [self.piece(i) for i in range(start, upto)]
        out = []
        for i in range(start, upto):
            self.generated += self.piece(i)
            last = finished and i == upto - 1
            if last and self.final_text is not None and self.stopped(i + 1):
                visible = self.final_text
                end = len(visible)
            else:
                visible = self.generated
                end = len(visible) - (0 if last else self.hold)
            out.append(visible[self.sent_chars : end] if end > self.sent_chars else "")
            self.sent_chars = max(self.sent_chars, end)
        return out

    def full_text(self, num_output: int) -> str:
        if self.stopped(num_output):
            return self.final_text
        return "".join(self.piece(i) for i in range(num_output))
