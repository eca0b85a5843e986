"""Typed readers for environment variables.

Every setting the panel takes from the environment goes through one of these, so a bad value
stops the process at start with a message that names the variable, instead of failing later in
some unrelated place. Secrets may also come from ``<NAME>_FILE`` (Docker/Kubernetes secrets).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path

TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}


class EnvError(ValueError):
    """A variable is set to something the panel cannot use."""

    def __init__(self, name: str, value: str, expected: str):
        super().__init__(f"Environment variable {name}={value!r} is invalid: expected {expected}.")
        self.name = name


def _raw(name: str, environ: Mapping[str, str] | None) -> str | None:
    env = os.environ if environ is None else environ
    value = env.get(name)
    return None if value is None else value.strip()


def env_str(name: str, default: str | None = None, environ: Mapping[str, str] | None = None):
    value = _raw(name, environ)
    return default if value is None or value == "" else value


def env_choice(
    name: str, default: str, choices: tuple[str, ...], environ: Mapping[str, str] | None = None
) -> str:
    value = env_str(name, default, environ)
    if value.upper() not in choices:
        raise EnvError(name, value, "one of " + ", ".join(choices))
    return value.upper()


def env_bool(name: str, default: bool = False, environ: Mapping[str, str] | None = None) -> bool:
    value = _raw(name, environ)
    if value is None:
        return default
    word = value.lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise EnvError(name, value, "one of true/false, yes/no, on/off, 1/0")


def env_int(
    name: str,
    default: int,
    environ: Mapping[str, str] | None = None,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    value = _raw(name, environ)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise EnvError(name, value, "an integer") from None
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        bounds = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise EnvError(name, value, f"an integer {bounds}")
    return number


def env_float(
    name: str,
    default: float,
    environ: Mapping[str, str] | None = None,
    minimum: float | None = None,
) -> float:
    value = _raw(name, environ)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except ValueError:
        raise EnvError(name, value, "a number") from None
    if minimum is not None and number < minimum:
        raise EnvError(name, value, f"a number >= {minimum}")
    return number


def env_list(name: str, default: list[str], environ: Mapping[str, str] | None = None) -> list[str]:
    value = _raw(name, environ)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_networks(
    name: str, environ: Mapping[str, str] | None = None
) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Comma-separated addresses and CIDR networks (``10.0.0.5,10.1.0.0/16,::1``)."""
    networks = []
    for item in env_list(name, [], environ):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise EnvError(
                name, item, "IP addresses or networks (10.0.0.0/8), comma-separated"
            ) from None
    return networks


def env_secret(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """``NAME`` itself, or the contents of the file named by ``NAME_FILE`` (not both)."""
    value = _raw(name, environ)
    path = _raw(f"{name}_FILE", environ)
    if value and path:
        raise EnvError(f"{name}_FILE", path, f"only one of {name} and {name}_FILE to be set")
    if path:
        try:
            secret = Path(path).read_text().strip()
        except OSError as exc:
            raise EnvError(f"{name}_FILE", path, f"a readable file ({exc.strerror})") from None
        if not secret:
            raise EnvError(f"{name}_FILE", path, "a file that is not empty")
        return secret
    return value or None


def env_url(
    name: str,
    default: str | None,
    schemes: tuple[str, ...],
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """A URL whose scheme is one of ``schemes``."""
    value = env_str(name, default, environ)
    if value is None:
        return None
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in schemes or not rest:
        raise EnvError(
            name, value, "a URL starting with " + " or ".join(f"{s}://" for s in schemes)
        )
    return value
