"""A deployment's whole launch config — engine settings, environment, CPU placement — and its
rendering to argv lists for three launch styles: a process supervised by our host agent, a
``docker run`` command, and a systemd unit. (Pure: no Django.)

Nothing is ever joined into a shell string: every value that reaches a command line is
validated first (model names, paths, env names and values, CPU lists, image and unit names)
and refused with a message naming the field when it could smuggle a flag or a command.

CONTRACT (used by hosts.agent, hosts.transport and the Django app; keep these names):

    Placement(numa_node: int | None = None, cpus: str | None = None)
    LaunchConfig(engine, model, settings, engine_version=None, env={}, placement=None,
                 port=8000, host="0.0.0.0", runner="engine", simulator={})
      .validated() -> LaunchConfig        raises LaunchError listing every bad field
      .to_dict() -> dict (JSON-safe)      LaunchConfig.from_dict(d) -> LaunchConfig
    ProcessCommand(argv: tuple[str, ...], env: dict[str, str])
    render_process(cfg, python="python3") -> ProcessCommand
    render_docker(cfg, *, name, image=None, gpus=None) -> list[str]   # argv of `docker run`
    render_systemd(cfg, *, unit_name, env_file, user=None, python="python3") -> SystemdUnit
    SystemdUnit(unit_text: str, env_text: str)
    LaunchError(EngineArgError) with .errors: dict[field, message]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hosts.engines.flags import EngineArgError


class LaunchError(EngineArgError):
    """A launch config that must not run; ``errors`` maps each bad field to why."""

    def __init__(self, errors: Mapping[str, str]):
        self.errors = dict(errors)
        super().__init__("; ".join(f"{k}: {v}" for k, v in self.errors.items()))


@dataclass(frozen=True)
class Placement:
    """Where the engine's CPU work runs: a NUMA node (CPUs and memory), a CPU list, or both."""

    numa_node: int | None = None
    cpus: str | None = None  # "0-15,32-47"


@dataclass(frozen=True)
class LaunchConfig:
    """Everything needed to start one engine. ``runner="simulator"`` starts
    ``python -m hosts.simulator`` with the same flags (demo fleet, tests); ``simulator`` holds
    the simulator's own options (``gpu``, ``num_gpus``, ``startup_seconds``, ``time_scale``)."""

    engine: str
    model: str
    settings: Mapping[str, Any]
    engine_version: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    placement: Placement | None = None
    port: int = 8000
    host: str = "0.0.0.0"  # noqa: S104 - engines listen for the panel and the load generator
    runner: str = "engine"
    simulator: Mapping[str, Any] = field(default_factory=dict)

    def validated(self) -> LaunchConfig:
        raise NotImplementedError

    def to_dict(self) -> dict:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LaunchConfig:
        raise NotImplementedError


@dataclass(frozen=True)
class ProcessCommand:
    argv: tuple[str, ...]
    env: dict[str, str]


@dataclass(frozen=True)
class SystemdUnit:
    unit_text: str
    env_text: str


def render_process(cfg: LaunchConfig, python: str = "python3") -> ProcessCommand:
    raise NotImplementedError


def render_docker(
    cfg: LaunchConfig, *, name: str, image: str | None = None, gpus: list[int] | None = None
) -> list[str]:
    raise NotImplementedError


def render_systemd(
    cfg: LaunchConfig,
    *,
    unit_name: str,
    env_file: str,
    user: str | None = None,
    python: str = "python3",
) -> SystemdUnit:
    raise NotImplementedError
