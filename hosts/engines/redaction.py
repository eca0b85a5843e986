"""Which config values are secret, and how they are masked (pure: no Django).

``is_secret`` is the one rule, for every place that shows, logs, exports or sends a config:
a setting is secret when the engine's flag spec marks it (``Flag.secret``: ``api_key``), an
environment variable when the launch rules' named list marks it (``EnvVar.secret``:
``HF_TOKEN``, ``HUGGING_FACE_HUB_TOKEN``, ``VLLM_API_KEY``). Nothing is decided by a
substring of a name: ``max_num_batched_tokens`` holds "TOKEN" and is not a secret.

The stored config keeps the real value (the engine needs it); only what people read is masked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hosts.engines import ENGINES
from hosts.engines.environment import SAFE_ENV

# What a masked value reads as: the same wherever it appears (pages, exports, notifications,
# logs), so a reader learns to recognise it.
MASK = "•••"
ENV_PREFIX = "env."
# Secret values shorter than this are not searched for in free text (engine output): they
# would mask harmless words.
MIN_SCRUBBED_CHARS = 6

SECRET_SETTINGS = frozenset(
    flag.dest for module in ENGINES.values() for flag in module.SPEC.flags if flag.secret
)
SECRET_ENV = frozenset(name for name, var in SAFE_ENV.items() if var.secret)
SECRET_OPTIONS = frozenset(
    option
    for module in ENGINES.values()
    for flag in module.SPEC.flags
    if flag.secret
    for option in flag.options
)


def is_secret(name: Any) -> bool:
    """Whether a value named ``name`` must not be shown: a setting's dest (``api_key``), an
    environment variable's name (``HF_TOKEN``) or its flattened key (``env.HF_TOKEN``)."""
    if not isinstance(name, str):
        return False
    if name.startswith(ENV_PREFIX):
        return name[len(ENV_PREFIX) :] in SECRET_ENV
    return name in SECRET_SETTINGS or name in SECRET_ENV


def mask(value: Any) -> Any:
    """A secret's value as shown: the mask, except "not set" (None) stays visible, and each
    item of a list (the two sides of a diff) is masked on its own."""
    if value is None:
        return None
    if isinstance(value, list | tuple):
        return type(value)(mask(item) for item in value)
    return MASK


def masked(values: Mapping | None) -> dict:
    """A mapping of settings, environment or flattened config with secret values masked."""
    return {k: (mask(v) if is_secret(k) else v) for k, v in (values or {}).items()}


def mask_argv(argv: Iterable[str]) -> list[str]:
    """An engine command line for logs: the values of secret flags (``--api-key``) masked."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        option, eq, _ = arg.partition("=")
        if option in SECRET_OPTIONS:
            out.append(option + "=" + MASK if eq else arg)
            hide_next = not eq
            continue
        out.append(arg)
    return out


def secret_values(settings: Mapping | None, env: Mapping | None) -> set[str]:
    """The secret values of a config, to find them where an engine repeats them in its own
    output (vLLM logs its non-default arguments, api_key included, at start)."""
    values = {v for k, v in (settings or {}).items() if is_secret(k)}
    values |= {v for k, v in (env or {}).items() if is_secret(k)}
    return {v for v in values if isinstance(v, str) and len(v) >= MIN_SCRUBBED_CHARS}


def scrub(text: str, values: Iterable[str]) -> str:
    """``text`` with every occurrence of the given secret values masked (longest first, so a
    value that contains another is masked whole)."""
    for value in sorted(values, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text
