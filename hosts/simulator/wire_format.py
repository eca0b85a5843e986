"""The JSON each simulated engine writes: streamed chunks and whole bodies, field for field.

vLLM 0.11.0 (``vllm/entrypoints/openai/serving_chat.py``, ``serving_completion.py``, models in
``protocol.py``): chat chunks are dumped with ``exclude_unset`` (only the fields the server set),
completion chunks with every field; the chat role chunk goes out when the engine's first output
arrives (the first token), one per choice; the last token's chunk carries ``finish_reason`` and
``stop_reason``; ``stream_options.continuous_usage_stats`` adds ``usage`` to every chunk; the
first chunk of each completion choice carries the prompt's token ids.

SGLang 0.5.3 (``sglang/srt/entrypoints/openai/serving_chat.py``, ``serving_completions.py``):
every field of every chunk; the chat role chunk goes out with each choice's first token, the
finish reasons in separate chunks after the last token (``matched_stop``, not ``stop_reason``);
no continuous usage; usage counts ``reasoning_tokens``; bodies carry ``metadata``.
"""

from __future__ import annotations

import json

from hosts.simulator.quality import AnswerText
from hosts.simulator.wire_text import EOS_TOKEN_ID, token_bytes, token_logprobs

_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_string = json.JSONEncoder().encode  # the C encoder, for the per-token strings


def dumps(obj) -> str:
    """Compact JSON, as pydantic's model_dump_json writes it."""
    if obj is None:
        return "null"
    if isinstance(obj, str):
        return _string(obj)
    return _compact(obj)


def choice_logprobs(choice, pos: int, alternatives: int) -> tuple[str, float, list]:
    """``token_logprobs`` of the choice's token ``pos``: a known answer's own piece in place of
    the made-up one, and no runner-up equal to it."""
    if not isinstance(choice.text, AnswerText):
        return token_logprobs(choice.text.key, pos, alternatives)
    token, lp, alts = token_logprobs(choice.text.key, pos, alternatives + 1)
    piece = choice.text.piece(pos)
    return piece, lp, [(t, v) for t, v in alts if t != piece][:alternatives]


def finish_of(choice) -> tuple[str | None, str | int | None]:
    """(finish_reason, what stopped it) of a finished choice."""
    req = choice.req
    if choice.text.stopped(req.num_output):
        return "stop", choice.text.stop_reason
    return req.finish_reason, None


class Wire:
    """One response's formatting: ``chat`` or completions, for one engine."""

    def __init__(self, chat: bool, rid: str, created: int, model: str, params):
        self.chat, self.rid, self.created, self.model, self.params = (
            chat,
            rid,
            created,
            model,
            params,
        )
        self.kind = "chat.completion.chunk" if chat else "text_completion"
        self._heads: dict[str | None, str] = {}

    def head(self, rid: str | None = None) -> str:
        """The start of a chunk, up to its choices (built once per stream id)."""
        head = self._heads.get(rid)
        if head is None:
            head = self._heads[rid] = (
                f'{{"id":"{rid or self.rid}","object":"{self.kind}","created":{self.created},'
                f'"model":{dumps(self.model)},"choices":['
            )
        return head

    @staticmethod
    def usage(choices) -> dict:
        """Token counts of the whole response: each prompt once, every choice's output."""
        prompts = {c.prompt_idx: len(c.prompt_ids) for c in choices}
        prompt = sum(prompts.values())
        completion = sum(c.req.num_output for c in choices)
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
        }

    def logprobs(self, choice, pos: int, offset: int):
        raise NotImplementedError


class VllmWire(Wire):
    """vLLM 0.11.0's chunks and bodies."""

    opened = False  # whether the engine's first output has been sent

    def events(self, choice, start: int, texts: list[str], finished: bool, choices) -> str:
        """The chunks for ``texts``, the new tokens of ``choice`` from position ``start`` (the
        last one finishing it when ``finished``)."""
        out = []
        first, self.opened = not self.opened, True
        p = self.params
        if self.chat and first:
            for other in choices:  # vLLM sends every choice's role chunk at the first output
                usage = ""
                if p.continuous_usage:
                    n = len(other.prompt_ids)
                    usage = (
                        f',"usage":{{"prompt_tokens":{n},"total_tokens":{n},"completion_tokens":0}}'
                    )
                out.append(
                    f'data: {self.head()}{{"index":{other.index},"delta":{{"role":"assistant",'
                    f'"content":""}},"logprobs":null,"finish_reason":null}}]{usage},'
                    '"prompt_token_ids":null}\n\n'
                )
        for offset, piece in enumerate(texts):
            pos = start + offset
            last = finished and offset == len(texts) - 1
            reason, why = finish_of(choice) if last else (None, None)
            lp = "null"
            if p.logprobs is not None:
                lp = dumps(self.logprobs(choice, pos, choice.chars))
            choice.chars += len(piece)
            if self.chat:
                tail = f',"stop_reason":{dumps(why)}' if last else ""
                body = (
                    f'{{"index":{choice.index},"delta":{{"content":{dumps(piece)}}},'
                    f'"logprobs":{lp},"finish_reason":{dumps(reason)}{tail},"token_ids":null}}]'
                )
            else:
                ids = "null" if pos else dumps(choice.prompt_ids)
                body = (
                    f'{{"index":{choice.index},"text":{dumps(piece)},"logprobs":{lp},'
                    f'"finish_reason":{dumps(reason)},"stop_reason":{dumps(why)},'
                    f'"prompt_token_ids":{ids},"token_ids":null}}]'
                )
            if p.continuous_usage:
                n, done = len(choice.prompt_ids), pos + 1
                details = "" if self.chat else ',"prompt_tokens_details":null'
                body += (
                    f',"usage":{{"prompt_tokens":{n},"total_tokens":{n + done},'
                    f'"completion_tokens":{done}{details}}}}}'
                )
            else:
                body += "}" if self.chat else ',"usage":null}'
            out.append(f"data: {self.head()}{body}\n\n")
        return "".join(out)

    def closing(self, choices) -> str:
        """After the last token: the usage chunk when asked for (``exclude_none``)."""
        if not self.params.include_usage:
            return ""
        return f'data: {self.head()}],"usage":{dumps(self.usage(choices))}}}\n\n'

    def logprobs(self, choice, pos: int, offset: int):
        """One token's logprobs: the sampled token first (it is also the most likely), then
        the runners-up; completions list max(k, 1) entries, chat ``top_logprobs`` entries."""
        k = self.params.logprobs
        token, lp, alts = choice_logprobs(choice, pos, max(k, 1) - 1)
        if self.chat:
            top = [(token, lp), *alts][:k]
            return {
                "content": [
                    {
                        "token": token,
                        "logprob": lp,
                        "bytes": token_bytes(token),
                        "top_logprobs": [
                            {"token": t, "logprob": v, "bytes": token_bytes(t)} for t, v in top
                        ],
                    }
                ]
            }
        return {
            "text_offset": [offset],
            "token_logprobs": [lp],
            "tokens": [token],
            "top_logprobs": [dict([(token, lp), *alts])],
        }

    def body(self, choices) -> dict:
        """The JSON of a finished response that was not streamed (``model_dump()``)."""
        out = []
        for c in choices:
            reason, why = finish_of(c)
            lp = None
            if self.params.logprobs is not None:
                lp = self._merged_logprobs(c)
            if self.chat:
                message = {
                    "role": "assistant",
                    "content": c.text.full_text(c.req.num_output),
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [],
                    "reasoning_content": None,
                }
                choice = {"index": c.index, "message": message, "logprobs": lp}
                choice.update(finish_reason=reason, stop_reason=why, token_ids=None)
            else:
                choice = {"index": c.index, "text": c.text.full_text(c.req.num_output)}
                choice.update(logprobs=lp, finish_reason=reason, stop_reason=why)
                choice.update(token_ids=None, prompt_logprobs=None, prompt_token_ids=None)
            out.append(choice)
        body = {
            "id": self.rid,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": out,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {**self.usage(choices), "prompt_tokens_details": None},
        }
        if self.chat:
            body.update(prompt_logprobs=None, prompt_token_ids=None)
        body["kv_transfer_params"] = None
        return body

    def _merged_logprobs(self, c) -> dict:
        parts, offset = [], 0
        for pos in range(c.req.num_output):
            parts.append(self.logprobs(c, pos, offset))
            offset += len(choice_logprobs(c, pos, 0)[0])
        if self.chat:
            return {"content": [entry for part in parts for entry in part["content"]]}
        merged = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        for part in parts:
            for name, values in part.items():
                merged[name].extend(values)
        return merged


class SglangWire(Wire):
    """SGLang 0.5.3's chunks and bodies."""

    def events(self, choice, start: int, texts: list[str], finished: bool, choices) -> str:
        """The chunks for ``texts``, the new tokens of ``choice`` from position ``start``."""
        out = []
        head = self.head(choice.rid)
        if self.chat and start == 0 and texts:
            out.append(
                f'data: {head}{{"index":{choice.index},"delta":{{"role":"assistant",'
                '"content":"","reasoning_content":null,"tool_calls":null},"logprobs":null,'
                '"finish_reason":null,"matched_stop":null}],"usage":null}\n\n'
            )
        for offset, piece in enumerate(texts):
            pos = start + offset
            last = finished and offset == len(texts) - 1
            lp = "null"
            if self.params.logprobs is not None:
                lp = dumps(self.logprobs(choice, pos))
            if self.chat:
                if not piece:  # SGLang sends a content chunk only when there is new text
                    continue
                out.append(
                    f'data: {head}{{"index":{choice.index},"delta":{{"role":null,'
                    f'"content":{dumps(piece)},"reasoning_content":null,"tool_calls":null}},'
                    f'"logprobs":{lp},"finish_reason":null,"matched_stop":null}}],'
                    '"usage":null}\n\n'
                )
            else:
                reason, why = self.finish(choice) if last else (None, None)
                out.append(
                    f'data: {head}{{"index":{choice.index},"text":{dumps(piece)},'
                    f'"logprobs":{lp},"finish_reason":{dumps(reason)},'
                    f'"matched_stop":{dumps(why)}}}],"usage":null}}\n\n'
                )
        return "".join(out)

    def finish(self, choice) -> tuple[str | None, str | int | None]:
        reason, why = finish_of(choice)
        if reason == "stop" and why is None:
            why = EOS_TOKEN_ID  # SGLang's FINISH_MATCHED_TOKEN: the EOS id
        return reason, why

    def closing(self, choices) -> str:
        out = []
        if self.chat:  # SGLang: the finish reasons come after every choice's last token
            for c in choices:
                reason, why = self.finish(c)
                out.append(
                    f'data: {self.head(c.rid)}{{"index":{c.index},"delta":{{"role":null,'
                    '"content":null,"reasoning_content":null,"tool_calls":null},'
                    f'"logprobs":null,"finish_reason":{dumps(reason)},'
                    f'"matched_stop":{dumps(why)}}}],"usage":null}}\n\n'
                )
        if self.params.include_usage:
            usage = {**self.usage(choices)}
            if self.chat:
                usage["prompt_tokens_details"] = None
            usage["reasoning_tokens"] = 0
            rid = choices[-1].rid
            out.append(f'data: {self.head(rid)}],"usage":{dumps(usage)}}}\n\n')
        return "".join(out)

    def logprobs(self, choice, pos: int, offset: int = -1):
        """SGLang: the top ``k`` tokens (the sampled one first here, being the most likely);
        completions have no text offsets (-1)."""
        k = self.params.logprobs
        token, lp, alts = choice_logprobs(choice, pos, max(k, 1) - 1)
        top = [(token, lp), *alts][:k]
        if self.chat:
            return {
                "content": [
                    {
                        "token": token,
                        "bytes": token_bytes(token),
                        "logprob": lp,
                        "top_logprobs": [
                            {"token": t, "bytes": token_bytes(t), "logprob": v} for t, v in top
                        ],
                    }
                ]
            }
        return {
            "text_offset": [-1],
            "token_logprobs": [lp],
            "tokens": [token],
            "top_logprobs": [dict(top)],
        }

    def body(self, choices) -> dict:
        out = []
        for c in choices:
            reason, why = self.finish(c)
            lp = None
            if self.params.logprobs is not None:
                parts = [self.logprobs(c, pos) for pos in range(c.req.num_output)]
                if self.chat:
                    lp = {"content": [e for part in parts for e in part["content"]]}
                else:
                    names = ("text_offset", "token_logprobs", "tokens", "top_logprobs")
                    lp = {name: [v for part in parts for v in part[name]] for name in names}
            content = c.text.full_text(c.req.num_output)
            if self.chat:
                message = {
                    "role": "assistant",
                    "content": content,
                    "reasoning_content": None,
                    "tool_calls": None,
                }
                choice = {"index": c.index, "message": message}
            else:
                choice = {"index": c.index, "text": content}
            choice.update(logprobs=lp, finish_reason=reason, matched_stop=why)
            out.append(choice)
        usage = {**self.usage(choices), "prompt_tokens_details": None, "reasoning_tokens": 0}
        return {
            "id": choices[0].rid,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": out,
            "usage": usage,
            "metadata": {"weight_version": "default"},
        }


WIRES = {"vllm": VllmWire, "sglang": SglangWire}
