"""What one choice of a simulated completion says: its text, where a stop string ends it, and
the log-probabilities of its tokens.

Stop strings follow vLLM 0.11's detokenizer (``vllm/v1/engine/detokenizer.py``): checked from
the token after ``min_tokens`` on, in the text the new token added (plus a stop string's length
back), the output cut before the stop string unless ``include_stop_str_in_output``; while a
stream runs, the last ``len(longest stop) - 1`` characters are held back
(``get_next_output_text``) so that a stop string is never half-sent. SGLang 0.5.3 trims the
matched string at the end (``no_stop_trim`` keeps it) and holds nothing back.

Logprobs are made up but shaped and bounded like a model's: the sampled token is always the
most likely one (probability 0.35–0.99), the alternatives share what is left in halves, so
every value is finite, ≤ 0, and the probabilities of one step sum to less than 1.
"""

from __future__ import annotations

import math
import zlib

from hosts.simulator.text import WORDS, token_text


class ChoiceText:
    """The text of one choice (one request of the engine), delivered token by token."""

    __slots__ = (
        "key",
        "stop",
        "include_stop",
        "min_tokens",
        "hold",
        "stop_at",
        "stop_reason",
        "final_text",
        "generated",
        "sent_chars",
        "sent_tokens",
    )

    def __init__(self, key: int, stop: list[str], include_stop: bool, min_tokens: int, hold: bool):
        self.key = key
        self.stop = stop
        self.include_stop = include_stop
        self.min_tokens = min_tokens
        # vLLM holds back what could be the start of a stop string; SGLang does not.
        self.hold = max(len(s) for s in stop) - 1 if stop and hold and not include_stop else 0
        self.stop_at: int | None = None  # the output token count at which a stop string matched
        self.stop_reason: str | None = None
        self.final_text: str | None = None  # the whole output once cut at the stop string
        self.generated = ""  # streamed so far, before hold-back (only kept with stop strings)
        self.sent_chars = 0
        self.sent_tokens = 0

    def plan(self, target: int) -> int:
        """Where a stop string ends this choice among its first ``target`` tokens: the new
        token target (``target`` when none matches)."""
        if not self.stop:
            return target
        out = ""
        for count in range(1, target + 1):
            piece = token_text(self.key, count - 1)
            out += piece
            if count <= self.min_tokens:
                continue
            for stop in self.stop:
                # vLLM: output_text.find(stop_str, 1 - new_char_count - stop_string_len);
                # an empty one (only SGLang lets it through) matches at once and its trim
                # (output.find("")) leaves nothing.
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

    def stopped(self, num_output: int) -> bool:
        """Whether the choice ended on its stop string (having generated ``num_output``)."""
        return self.stop_at is not None and num_output == self.stop_at

    def deltas(self, upto: int, finished: bool) -> list[str]:
        """The text each newly delivered token adds to the stream, for tokens up to ``upto``
        (the last of them finishing the choice when ``finished``)."""
        start = self.sent_tokens
        self.sent_tokens = upto
        if not self.stop:
            return [token_text(self.key, i) for i in range(start, upto)]
        out = []
        for i in range(start, upto):
            self.generated += token_text(self.key, i)
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
        """The whole output of a finished choice that generated ``num_output`` tokens."""
        if self.stopped(num_output):
            return self.final_text
        return "".join(token_text(self.key, i) for i in range(num_output))


def token_logprobs(key: int, position: int, alternatives: int) -> tuple[str, float, list]:
    """(token text, its logprob, [(alternative text, logprob), …]) for output token
    ``position``: ``alternatives`` runners-up, most likely first, none equal to the token."""
    piece = token_text(key, position)
    h = zlib.crc32(f"{key}:{position}".encode())
    p0 = 0.35 + 0.64 * (h % 10007) / 10006
    rest = 1.0 - p0
    alts: list[tuple[str, float]] = []
    step = 1
    while len(alts) < min(alternatives, len(WORDS) - 1):
        word = " " + WORDS[(h + 7 * step) % len(WORDS)]  # 7 and 50 coprime: all distinct
        step += 1
        if word != piece:
            alts.append((word, math.log(rest * 0.5 ** (len(alts) + 1))))
    return piece, math.log(p0), alts


def token_bytes(piece: str) -> list[int]:
    return list(piece.encode("utf-8", errors="replace"))


# SGLang reports the EOS token id that stopped a choice as its matched_stop (vLLM: null); the
# simulator's end-of-message marker (text.chat_prompt_ids) stands for the model's EOS.
EOS_TOKEN_ID = 4
