"""A generation request's parameters, checked the way each engine checks them.

vLLM 0.11.0 checks a request in three places, and its errors differ by place:

* pydantic, when FastAPI parses the body (``vllm/entrypoints/openai/protocol.py``: field types,
  ``@model_validator`` checks such as ``validate_stream_options``, ``check_logprobs``): 400 with
  ``type`` "Bad Request" and the pydantic error list as the message
  (``api_server.validation_exception_handler``);
* ``SamplingParams._verify_args`` (``vllm/sampling_params.py``) and the V1 processor's
  ``_validate_logprobs`` (``vllm/v1/engine/processor.py``, ``max_logprobs`` 20 by default):
  400 with ``type`` "BadRequestError" (``OpenAIServing.create_error_response``).

SGLang 0.5.3 checks with pydantic too (``sglang/srt/entrypoints/openai/protocol.py``, the same
"Bad Request" handler in ``http_server.py``), then ``_validate_request`` of each serving class,
then ``SamplingParams.verify`` (``sglang/srt/sampling/sampling_params.py``) inside the tokenizer
manager: that last one is an engine error, which a streamed request gets as an error event
after a 200 (``serving_chat._generate_chat_stream``), not as a 400.

The messages below are copied from those files; the order of the checks is theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hosts.simulator.wire_errors import ApiError

VLLM_MAX_LOGPROBS = 20  # vLLM's ModelConfig.max_logprobs default (--max-logprobs)
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1  # vLLM's seed bounds (torch.iinfo(torch.long))


@dataclass(slots=True)
class Params:
    """What the engine does with one request, once checked."""

    n: int = 1
    max_tokens: int | None = None  # as the client asked (None: the engine's default)
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    include_stop_str: bool = False  # vLLM include_stop_str_in_output / SGLang no_stop_trim
    logprobs: int | None = None  # alternatives per token (completions k / chat top_logprobs)
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # vLLM: usage on every chunk
    ignore_eos: bool = False
    priority: int = 0
    structured: bool = False  # the output is constrained (JSON schema, JSON object, regex, …)


def pydantic_error(kind: str, loc: tuple, msg: str, value) -> ApiError:
    """A 400 as FastAPI's ``RequestValidationError`` handler of both engines words it: the
    ``str()`` of pydantic's error list (fastapi 0.115's ValidationException has no __str__)."""
    error = {"type": kind, "loc": ("body", *loc), "msg": msg, "input": value}
    if kind == "value_error":
        error["ctx"] = {"error": _Repr(f"ValueError({msg.removeprefix('Value error, ')!r})")}
    return ApiError(400, str([error]), "Bad Request")


def value_error(message: str, data: dict, loc: tuple = ()) -> ApiError:
    """A ``@model_validator``/``@field_validator`` refusal, as pydantic reports it."""
    return pydantic_error("value_error", loc, f"Value error, {message}", data)


class _Repr(str):
    """A string that ``repr`` shows bare, to print ``ValueError('…')`` like pydantic's ctx."""

    def __repr__(self) -> str:
        return str(self)


def typed(data: dict, name: str, kind: type, default=None):
    """``data[name]`` checked against its pydantic type (int, float or bool; lax mode: an int is
    a valid float, a float with no fraction a valid int), ``default`` when absent or null."""
    value = data.get(name)
    if value is None:
        return default
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise pydantic_error("bool_type", (name,), "Input should be a valid boolean", value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        if kind is int:
            raise pydantic_error("int_type", (name,), "Input should be a valid integer", value)
        raise pydantic_error("float_type", (name,), "Input should be a valid number", value)
    if kind is int:
        if isinstance(value, float):
            if not value.is_integer():
                raise pydantic_error(
                    "int_from_float",
                    (name,),
                    "Input should be a valid integer, got a number with a fractional part",
                    value,
                )
            return int(value)
        return value
    return float(value)


def stop_strings(data: dict) -> list[str]:
    stop = data.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise pydantic_error("string_type", ("stop",), "Input should be a valid string", stop)


def parse_vllm(data: dict, chat: bool) -> Params:
    """The request's parameters, or vLLM 0.11's refusal (pydantic's first, then SamplingParams')."""
    p = _common(data, chat)
    # pydantic model validators (protocol.py: validate_stream_options, check_logprobs)
    if data.get("stream_options") and not data.get("stream"):
        raise value_error("Stream options can only be defined when `stream=True`.", data)
    if chat:
        top = typed(data, "top_logprobs", int, 0)
        wants = typed(data, "logprobs", bool, False)
        if top < 0 and top != -1:
            raise value_error("`top_logprobs` must be a positive value or -1.", data)
        if (top == -1 or top > 0) and not wants:
            raise value_error("when using `top_logprobs`, `logprobs` must be set to true.", data)
        p.logprobs = top if wants else None  # ChatCompletionRequest.to_sampling_params
    else:
        p.logprobs = typed(data, "logprobs", int)
        if p.logprobs is not None and p.logprobs < 0:
            raise value_error("`logprobs` must be a positive value.", data)
    seed = typed(data, "seed", int)
    if seed is not None and not LONG_MIN <= seed <= LONG_MAX:
        limit = ("greater_than_equal", "greater than or equal to", LONG_MIN)
        if seed > LONG_MAX:
            limit = ("less_than_equal", "less than or equal to", LONG_MAX)
        raise pydantic_error(limit[0], ("seed",), f"Input should be {limit[1]} {limit[2]}", seed)
    options = data.get("stream_options")
    if p.stream and isinstance(options, dict):
        # StreamOptions: include_usage defaults to True once stream_options is given.
        p.include_usage = bool(typed(options, "include_usage", bool, True))
        p.continuous_usage = p.include_usage and bool(
            typed(options, "continuous_usage_stats", bool, False)
        )
    p.include_stop_str = bool(typed(data, "include_stop_str_in_output", bool, False))
    p.structured = response_format(data, VLLM_FORMATS) or any(
        data.get(name) is not None for name in VLLM_GUIDED
    )
    return p


# vLLM 0.11 protocol.py: AnyResponseFormat = ResponseFormat ("text", "json_object",
# "json_schema" with JsonSchemaResponseFormat {name, description, schema, strict}) |
# StructuralTagResponseFormat ("structural_tag"); the guided_* extras and structured_outputs
# (StructuredOutputsParams: json, regex, choice, grammar, json_object, structural_tag).
# SGLang 0.5.3 protocol.py: ResponseFormat ("text", "json_object", "json_schema") |
# StructuralTagResponseFormat, and the json_schema / regex / ebnf extras.
VLLM_FORMATS = ("text", "json_object", "json_schema", "structural_tag")
SGLANG_FORMATS = VLLM_FORMATS
VLLM_GUIDED = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
)
SGLANG_GUIDED = ("json_schema", "regex", "ebnf")


def response_format(data: dict, formats: tuple[str, ...]) -> bool:
    """Whether ``response_format`` asks for structured output, or pydantic's refusal of a
    shape the engine's request model does not take."""
    value = data.get("response_format")
    if value is None:
        return False
    loc = ("response_format",)
    if not isinstance(value, dict):
        raise pydantic_error(
            "model_attributes_type",
            loc,
            "Input should be a valid dictionary or object to extract fields from",
            value,
        )
    kind = value.get("type")
    if kind not in formats:
        allowed = ", ".join(repr(f) for f in formats[:-1]) + f" or {formats[-1]!r}"
        raise pydantic_error("literal_error", (*loc, "type"), f"Input should be {allowed}", kind)
    if kind == "json_schema":
        schema = value.get("json_schema")
        if not isinstance(schema, dict):
            # Neither engine serves a json_schema format without its schema (vLLM asserts on
            # it, SGLang reads an attribute of None): the simulator words the refusal itself.
            raise value_error("response_format.json_schema is required", data, loc)
        if not isinstance(schema.get("name"), str):
            raise pydantic_error("missing", (*loc, "json_schema", "name"), "Field required", schema)
    return kind != "text"


def verify_vllm(data: dict, p: Params, max_tokens: int) -> None:
    """``SamplingParams._verify_args`` then the processor's logprobs limit, for the output limit
    ``max_tokens`` the server computed; a ValueError there is a 400 "BadRequestError"."""
    presence = typed(data, "presence_penalty", float, 0.0)
    frequency = typed(data, "frequency_penalty", float, 0.0)
    repetition = typed(data, "repetition_penalty", float, 1.0)
    temperature = typed(data, "temperature", float, 1.0)
    top_p = typed(data, "top_p", float, 1.0)
    top_k = typed(data, "top_k", int, 0)
    min_p = typed(data, "min_p", float, 0.0)
    best_of = typed(data, "best_of", int)
    checks = (
        (p.n < 1, f"n must be at least 1, got {p.n}."),
        (best_of is not None and best_of < 1, f"best_of must be at least 1, got {best_of}"),
        (
            best_of is not None and best_of < p.n,
            f"best_of must be greater than or equal to n, got n={p.n} and best_of={best_of}.",
        ),
        (not -2.0 <= presence <= 2.0, f"presence_penalty must be in [-2, 2], got {presence}."),
        (
            not -2.0 <= frequency <= 2.0,
            f"frequency_penalty must be in [-2, 2], got {frequency}.",
        ),
        (repetition <= 0.0, f"repetition_penalty must be greater than zero, got {repetition}."),
        (temperature < 0.0, f"temperature must be non-negative, got {temperature}."),
        (not 0.0 < top_p <= 1.0, f"top_p must be in (0, 1], got {top_p}."),
        (top_k < -1, f"top_k must be 0 (disable), or at least 1, got {top_k}."),
        (not 0.0 <= min_p <= 1.0, f"min_p must be in [0, 1], got {min_p}."),
        (max_tokens < 1, f"max_tokens must be at least 1, got {max_tokens}."),
        (
            p.min_tokens < 0,
            f"min_tokens must be greater than or equal to 0, got {p.min_tokens}.",
        ),
        (
            p.min_tokens > max_tokens,
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
            f"got {p.min_tokens}.",
        ),
        (
            p.logprobs is not None and p.logprobs != -1 and p.logprobs < 0,
            f"logprobs must be non-negative or -1, got {p.logprobs}.",
        ),
        (any(not s for s in p.stop), "stop cannot contain an empty string."),
    )
    for failed, message in checks:
        if failed:
            raise ApiError(400, message)
    if best_of is not None and best_of > 1:
        raise ApiError(400, "vLLM V1 does not yet support best_of.")  # Processor
    if p.logprobs is not None and p.logprobs > VLLM_MAX_LOGPROBS:
        raise ApiError(
            400,
            f"Requested sample logprobs of {p.logprobs}, which is greater than max allowed: "
            f"{VLLM_MAX_LOGPROBS}",
        )


def parse_sglang(data: dict, chat: bool) -> Params:
    """The request's parameters, or SGLang 0.5.3's pydantic refusal."""
    p = _common(data, chat)
    if not chat and p.max_tokens is not None and p.max_tokens <= 0:
        # CompletionRequest.validate_max_tokens_positive (a field validator)
        raise value_error("max_tokens must be positive", p.max_tokens, ("max_tokens",))
    if chat:
        wants = typed(data, "logprobs", bool, False)
        p.logprobs = (typed(data, "top_logprobs", int, 0) or 0) if wants else None
    else:
        p.logprobs = typed(data, "logprobs", int)
    options = data.get("stream_options")
    if isinstance(options, dict):
        # SGLang's StreamOptions has include_usage only (default False); no continuous stats.
        p.include_usage = bool(typed(options, "include_usage", bool, False))
    p.include_stop_str = bool(typed(data, "no_stop_trim", bool, False))
    p.structured = response_format(data, SGLANG_FORMATS) or any(
        data.get(name) is not None for name in SGLANG_GUIDED
    )
    return p


def verify_sglang(data: dict, p: Params, max_tokens: int) -> None:
    """``SamplingParams.verify`` (after ``top_k == -1`` became "all"): an engine error."""
    temperature = typed(data, "temperature", float, 1.0)
    top_p = typed(data, "top_p", float, 1.0)
    min_p = typed(data, "min_p", float, 0.0)
    top_k = typed(data, "top_k", int, -1)
    frequency = typed(data, "frequency_penalty", float, 0.0)
    presence = typed(data, "presence_penalty", float, 0.0)
    repetition = typed(data, "repetition_penalty", float, 1.0)
    checks = (
        (p.n < 1, f"n must be at least 1, got {p.n}."),  # the simulator's own words
        (temperature < 0.0, f"temperature must be non-negative, got {temperature}."),
        (not 0.0 < top_p <= 1.0, f"top_p must be in (0, 1], got {top_p}."),
        (not 0.0 <= min_p <= 1.0, f"min_p must be in [0, 1], got {min_p}."),
        (top_k != -1 and top_k < 1, f"top_k must be -1 (disable) or at least 1, got {top_k}."),
        (
            not -2.0 <= frequency <= 2.0,
            f"frequency_penalty must be in [-2, 2], got {frequency}.",
        ),
        (not -2.0 <= presence <= 2.0, f"presence_penalty must be in [-2, 2], got {presence}."),
        (
            not 0.0 <= repetition <= 2.0,
            f"repetition_penalty must be in [0, 2], got {repetition}.",
        ),
        (
            p.min_tokens < 0,
            f"min_new_tokens must be in [0, max_new_tokens], got {p.min_tokens}.",
        ),
        (max_tokens < 0, f"max_new_tokens must be at least 0, got {max_tokens}."),
        (
            p.min_tokens > max_tokens,
            f"min_new_tokens must be in [0, max_new_tokens({max_tokens})], got {p.min_tokens}.",
        ),
    )
    for failed, message in checks:
        if failed:
            raise ApiError(400, message, engine=True)


def _common(data: dict, chat: bool) -> Params:
    """The fields both engines read with the same pydantic types."""
    name = "max_completion_tokens" if chat and data.get("max_completion_tokens") else "max_tokens"
    return Params(
        n=typed(data, "n", int, 1),
        max_tokens=typed(data, name, int),
        min_tokens=typed(data, "min_tokens", int, 0),
        stop=stop_strings(data),
        stream=bool(typed(data, "stream", bool, False)),
        ignore_eos=bool(typed(data, "ignore_eos", bool, False)),
        priority=typed(data, "priority", int, 0),
    )
