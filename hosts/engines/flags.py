"""What an engine accepts on its command line: flag specs, parsing, validation, argv rendering.

One table per engine (``vllm.py``, ``sglang.py``) is the single source of truth: the panel
validates proposed settings against it and renders them as an argv list (never a shell string),
and the simulator builds its command-line parser from the same table, so both refuse the same
things with the same words.

Settings are a mapping of a flag's ``dest`` (``max_num_seqs``) to a typed value.

Engines add, rename and drop flags between releases, so a flag may say in which version it
appeared (``since``) and in which it was gone (``until``). Given the version of the engine that
will run, validation refuses what that version does not have, naming the flag to use instead.
Without a version the table stands for the newest release: flags that have been removed are
refused, flags added recently are accepted.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from packaging.version import InvalidVersion, Version

# Text values that go into argv: no whitespace, no control characters, nothing starting with a
# dash (it would be read as another flag).
SAFE_TEXT = re.compile(r"^[A-Za-z0-9_.:/@+=,\-]+$")


class EngineArgError(ValueError):
    """A flag or value the engine refuses; ``str()`` is the engine-style message."""

    def __init__(self, message: str, flag: str | None = None):
        super().__init__(message)
        self.flag = flag


@dataclass(frozen=True)
class Flag:
    """One command-line option of an engine."""

    dest: str
    options: tuple[str, ...]
    type: str  # "int", "float", "str", "bool"
    default: Any = None
    help: str = ""
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    # bool flags: "negatable" → --x / --no-x (argparse.BooleanOptionalAction);
    #             "store_true" → --x only.
    bool_style: str = "negatable"
    parse: Callable[[str], Any] | None = None  # custom text → value (e.g. "32k" → 32768)
    nargs: str | None = None
    performance: bool = True  # False: accepted but no effect on speed (logging, auth, …)
    since: str | None = None  # first engine version that has the flag (None: all we support)
    until: str | None = None  # first engine version that no longer has it (None: still there)
    # dest of the flag that does this one's job in the versions without it (renames), so the
    # refusal can say what to use instead.
    counterpart: str | None = None
    # The value is a credential (an API key): hosts.engines.redaction masks it wherever the
    # panel shows, logs, exports or sends a config, and refusals never repeat it.
    secret: bool = False
    # Setting it makes the engine run code or read files it names (trust_remote_code runs the
    # model repository's Python): only an Admin may propose or approve it, the review says so,
    # and an agent refuses it unless started with --allow-code-loading.
    loads_code: bool = False
    # Changing it can change the model's answers, not only its speed (weights' or the KV
    # cache's precision, quantisation): a change touching it is verified by a quality probe.
    affects_answers: bool = False

    @property
    def option(self) -> str:
        """The long option, as it is rendered."""
        return next(o for o in self.options if o.startswith("--"))

    def loads_code_with(self, value: Any) -> bool:
        """Whether setting this flag to ``value`` makes the engine load code (turning a
        code-loading switch off, or leaving it unset, does not)."""
        return self.loads_code and value is not None and value is not False

    def _shown(self, value: Any) -> str:
        # What an error message may repeat of a value: never a credential.
        return "(the value is hidden)" if self.secret else repr(value)

    def coerce(self, value: Any) -> Any:
        """Turn a value from a form, JSON or argv into this flag's type, or raise."""
        opt = self.option
        if value is None:
            return None
        if self.type == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            raise EngineArgError(
                f"argument {opt}: expected true or false, got {self._shown(value)}", self.dest
            )
        if self.type in ("int", "float") and isinstance(value, bool):
            raise EngineArgError(
                f"argument {opt}: invalid {self.type} value: {self._shown(value)}", self.dest
            )
        try:
            if isinstance(value, str) and self.parse is not None:
                value = self.parse(value)
            elif self.type == "int":
                if isinstance(value, float) and not value.is_integer():
                    raise ValueError
                value = int(value)
            elif self.type == "float":
                value = float(value)
                if not math.isfinite(value):
                    # nan passes every range check (all comparisons are false) and inf
                    # renders as a word the engine's own parser may read differently.
                    raise ValueError
            elif self.type == "str":
                if self.nargs and isinstance(value, list | tuple):
                    return [self._text(v) for v in value]
                value = self._text(value)
        except EngineArgError:
            raise
        except (TypeError, ValueError):
            raise EngineArgError(
                f"argument {opt}: invalid {self.type} value: {self._shown(value)}", self.dest
            ) from None
        self.check(value)
        return value

    def _text(self, value: Any) -> str:
        if not isinstance(value, str) or not SAFE_TEXT.match(value):
            raise EngineArgError(
                f"argument {self.option}: invalid value {self._shown(value)}: only letters, "
                "digits and "
                "_ . : / @ + = , - are allowed, and it may not start with '-'",
                self.dest,
            )
        if value.startswith("-"):
            raise EngineArgError(f"argument {self.option}: value may not start with '-'", self.dest)
        return value

    def check(self, value: Any) -> None:
        opt = self.option
        if self.choices is not None and value not in self.choices:
            shown = ", ".join(repr(c) for c in self.choices)
            raise EngineArgError(
                f"argument {opt}: invalid choice: {value!r} (choose from {shown})", self.dest
            )
        if self.minimum is not None:
            too_low = value <= self.minimum if self.exclusive_minimum else value < self.minimum
            if too_low:
                relation = ">" if self.exclusive_minimum else ">="
                raise EngineArgError(
                    f"argument {opt}: {value!r} must be {relation} {self.minimum:g}", self.dest
                )
        if self.maximum is not None and value > self.maximum:
            raise EngineArgError(
                f"argument {opt}: {value!r} must be <= {self.maximum:g}", self.dest
            )


def engine_version(text: Any) -> Version:
    """An engine's version as reported by ``/version`` or pip: ``0.11.0``, ``v0.6.0``,
    ``0.5.3.post1``, ``0.11.1rc2``, ``0.10.2+cu128``; raises EngineArgError otherwise."""
    if not isinstance(text, str) or not SAFE_TEXT.match(text):
        raise EngineArgError(f"invalid engine version {text!r}", "engine_version")
    try:
        return Version(text)
    except InvalidVersion:
        raise EngineArgError(
            f"invalid engine version {text!r}: expected a release number like 0.11.0",
            "engine_version",
        ) from None


def _release(version: Version) -> Version:
    # Flags are compared on the release number alone: a release candidate, a post release or
    # a local build (0.11.0rc1, 0.11.0.post1, 0.11.0+cu128) takes the flags of its release.
    return Version(version.base_version)


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so callers choose how to report."""

    def error(self, message):
        raise EngineArgError(message)


@dataclass
class EngineSpec:
    """Everything the panel and the simulator need to know about one engine's CLI."""

    kind: str
    prog: str  # how the real engine names itself in usage/error lines
    model_option: str | None  # None: the model is a positional argument (vllm serve MODEL)
    flags: tuple[Flag, ...]
    cross_checks: tuple[Callable[[dict], None], ...] = field(default=())
    # The tensor-parallel setting, checked against the host's GPU count when that is known.
    tp_dest: str | None = None
    title: str = ""  # how messages about versions name the engine ("vllm serve 0.10.0 has no")

    def __post_init__(self):
        self.by_dest = {f.dest: f for f in self.flags}

    def flag(self, dest: str) -> Flag:
        return self.by_dest[dest]

    # --- versions -----------------------------------------------------------------------------
    def missing(self, flag: Flag, version: str | Version | None = None) -> str | None:
        """Why ``version`` of the engine has no ``flag``, or None when it has it."""
        name = self.title or self.prog
        other = self.by_dest.get(flag.counterpart) if flag.counterpart else None
        if version is None:
            if flag.until is None:
                return None
            instead = f"use {other.option} instead, or " if other else ""
            return (
                f"{self.prog} has no setting {flag.dest!r} (removed in {flag.until}; "
                f"{instead}give the engine version to use it with older releases)"
            )
        v = _release(version if isinstance(version, Version) else engine_version(version))
        if flag.since is not None and v < Version(flag.since):
            older = f"; older versions use {other.option}" if other else ""
            return f"{name} {version} has no {flag.option} (added in {flag.since}{older})"
        if flag.until is not None and v >= Version(flag.until):
            newer = f"; use {other.option} instead" if other else ""
            return f"{name} {version} has no {flag.option} (removed in {flag.until}{newer})"
        return None

    def flags_for(self, version: str | Version | None = None) -> tuple[Flag, ...]:
        """The flags ``version`` of the engine has (the newest release's when None)."""
        return tuple(f for f in self.flags if self.missing(f, version) is None)

    # --- argv → settings ------------------------------------------------------------------
    def add_arguments(
        self, parser: argparse.ArgumentParser, version: str | Version | None = None
    ) -> None:
        if self.model_option is None:
            parser.add_argument("model", help="name or path of the model")
        else:
            parser.add_argument(self.model_option, dest="model", required=True)
        for flag in self.flags_for(version):
            kwargs: dict[str, Any] = {"dest": flag.dest, "default": None, "help": flag.help}
            if flag.type == "bool":
                if flag.bool_style == "negatable":
                    kwargs["action"] = argparse.BooleanOptionalAction
                else:
                    kwargs["action"] = "store_true"
            else:
                kwargs["type"] = self._argparse_type(flag)
                if flag.nargs:
                    kwargs["nargs"] = flag.nargs
            parser.add_argument(*flag.options, **kwargs)

    @staticmethod
    def _argparse_type(flag: Flag):
        def convert(text: str):
            try:
                return flag.coerce(text)
            except EngineArgError as exc:
                # argparse prefixes "argument --x: " itself.
                raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None

        convert.__name__ = flag.type
        return convert

    def parser(self, version: str | Version | None = None, **kwargs) -> argparse.ArgumentParser:
        parser = _Parser(prog=self.prog, **kwargs)
        self.add_arguments(parser, version)
        return parser

    def parse_argv(
        self, argv: Iterable[str], version: str | Version | None = None
    ) -> tuple[str, dict]:
        """``(model, settings)`` from an engine command line; only flags given are returned."""
        ns = self.parser(version).parse_args(list(argv))
        values = vars(ns)
        model = values.pop("model")
        settings = {k: v for k, v in values.items() if v is not None}
        self.check_combination(settings)
        return model, settings

    # --- settings → validated settings / argv -----------------------------------------------
    def validate(
        self,
        settings: Mapping[str, Any],
        version: str | Version | None = None,
        gpu_count: int | None = None,
    ) -> tuple[dict, dict[str, str]]:
        """``(clean settings, errors by dest)``; unknown names are errors too, and so are flags
        ``version`` of the engine does not have. ``gpu_count``, when known, is what the
        tensor-parallel size must divide. An unreadable version raises EngineArgError."""
        if version is not None and not isinstance(version, Version):
            version = engine_version(version)
        if gpu_count is not None and (
            isinstance(gpu_count, bool) or not isinstance(gpu_count, int) or gpu_count < 1
        ):
            raise ValueError(f"gpu_count must be a positive int, got {gpu_count!r}")
        clean, errors = {}, {}
        for dest, value in settings.items():
            flag = self.by_dest.get(dest)
            if flag is None:
                errors[dest] = f"{self.prog} has no setting {dest!r}"
                continue
            reason = self.missing(flag, version)
            if reason is not None:
                errors[dest] = reason
                continue
            try:
                coerced = flag.coerce(value)
            except EngineArgError as exc:
                errors[dest] = str(exc)
                continue
            if coerced is not None:
                clean[dest] = coerced
        if gpu_count is not None and self.tp_dest in clean:
            # Needs only the one clean value, so it is reported alongside other errors.
            tp = clean[self.tp_dest]
            if tp > gpu_count:
                errors[self.tp_dest] = (
                    f"{self.tp_dest} ({tp}) is more than the {gpu_count} GPU(s) on this host"
                )
            elif gpu_count % tp:
                errors[self.tp_dest] = (
                    f"{self.tp_dest} ({tp}) must divide the number of GPUs ({gpu_count}): "
                    f"{gpu_count % tp} GPU(s) would sit idle"
                )
        if not errors:
            try:
                self.check_combination(clean)
            except EngineArgError as exc:
                errors[exc.flag or "__all__"] = str(exc)
        return clean, errors

    def check_combination(self, settings: dict) -> None:
        for check in self.cross_checks:
            check(settings)

    def render_args(
        self,
        settings: Mapping[str, Any],
        version: str | Version | None = None,
        gpu_count: int | None = None,
    ) -> list[str]:
        """Validated settings as argv items, in the table's order (stable diffs and logs)."""
        clean, errors = self.validate(settings, version, gpu_count)
        if errors:
            raise EngineArgError("; ".join(errors.values()))
        argv: list[str] = []
        for flag in self.flags:
            if flag.dest not in clean:
                continue
            value = clean[flag.dest]
            if flag.type == "bool":
                if flag.bool_style == "negatable":
                    argv.append(flag.option if value else "--no-" + flag.option[2:])
                elif value:
                    argv.append(flag.option)
            elif isinstance(value, list):
                argv.extend([flag.option, *map(str, value)])
            else:
                argv.extend([flag.option, _render_value(value)])
        return argv

    def render_command(
        self,
        model: str,
        settings: Mapping[str, Any],
        version: str | Version | None = None,
        gpu_count: int | None = None,
    ) -> list[str]:
        """The engine's arguments including the model (without the executable)."""
        model_arg = Flag("model", ("--model",), "str").coerce(model)
        head = [model_arg] if self.model_option is None else [self.model_option, model_arg]
        return head + self.render_args(settings, version, gpu_count)

    def effective(self, settings: Mapping[str, Any], version: str | Version | None = None) -> dict:
        """Settings with the table's static defaults filled in (auto defaults stay None)."""
        return {f.dest: settings.get(f.dest, f.default) for f in self.flags_for(version)}


def _render_value(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def human_int(text: str) -> int:
    """vLLM's human-readable integers: 1k = 1000, 1K = 1024, 25.6k, 2M, ...; auto = -1."""
    if text.strip().lower() == "auto":
        return -1
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", text.strip())
    if not match:
        raise ValueError(text)
    number, suffix = match.groups()
    scale = {"": 1, "k": 1000, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}
    value = float(number) * scale[suffix]
    if not value.is_integer():
        raise ValueError(text)
    return int(value)
