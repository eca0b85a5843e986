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

Field names in ``LaunchError.errors``: ``engine``, ``model``, ``engine_version``,
``settings.<dest>``, ``env.<NAME>``, ``placement``, ``placement.numa_node``, ``placement.cpus``,
``port``, ``host``, ``runner``, ``simulator.<key>``, and for the renderers ``python``, ``name``,
``image``, ``gpus``, ``unit_name``, ``env_file``, ``user``.
"""

from __future__ import annotations

import ipaddress
import math
import os.path
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hosts.engines import cpulist, get_spec
from hosts.engines.catalog import GPUS
from hosts.engines.environment import env_problem, text_problem
from hosts.engines.flags import EngineArgError, engine_version

ENGINES = ("vllm", "sglang")
RUNNERS = ("engine", "simulator")
# Those are LaunchConfig fields: the renderers put them on the command line themselves, so a
# second value in settings could only contradict them.
RESERVED_SETTINGS = {
    "port": "LaunchConfig.port",
    "host": "LaunchConfig.host",
    "model": "LaunchConfig.model",
}


def code_loading(engine: str, settings: Mapping[str, Any]) -> list[str]:
    """The settings (dests) that make the engine load code, in the table's order."""
    spec = get_spec(engine)
    return [
        f.dest for f in spec.flags if f.dest in settings and f.loads_code_with(settings[f.dest])
    ]


HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
CONTAINER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$")
# A docker image reference: [registry[:port]/]path[:tag][@digest], lower-case path components
# (the grammar of distribution/reference, without the parts no panel needs).
_DOMAIN_PART = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REF = re.compile(
    rf"^(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::\d{{1,5}})?/)?"
    rf"{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::\w[\w.-]{0,127})?"
    r"(?:@sha256:[0-9a-f]{64})?$"
)
UNIT_NAME = re.compile(r"^[a-zA-Z0-9@_][a-zA-Z0-9@_.-]*\.service$")
# Path components may not start with "-": nothing that reads the path should take it for an
# option.
ENV_FILE = re.compile(r"^(/[A-Za-z0-9_.@+][A-Za-z0-9_.@+-]*)+$")
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
PROGRAM = re.compile(r"^[A-Za-z0-9_.+/-]+$")
SIMULATOR_KEYS = ("gpu", "num_gpus", "startup_seconds", "time_scale", "seed", "knowledge")
# The knowledge file (hosts.simulator.quality): an absolute path of plain names like ENV_FILE:
# no control characters, whitespace, quotes, $ or % (a systemd ExecStart= line joins argv with
# spaces) and no component the simulator's argument parser could take for an option.
KNOWLEDGE_PATH = ENV_FILE
STOP_TIMEOUT_S = 60  # engines free GPU memory and NCCL state on SIGTERM; give them time


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

    def problems(self) -> dict[str, str]:
        """Bad fields by name (``placement.numa_node``, ``placement.cpus``)."""
        errors = {}
        node = self.numa_node
        if node is not None and (isinstance(node, bool) or not isinstance(node, int) or node < 0):
            errors["placement.numa_node"] = f"expected a NUMA node number >= 0, got {node!r}"
        if self.cpus is not None:
            problem = _cpu_list_problem(self.cpus)
            if problem:
                errors["placement.cpus"] = problem
        return errors

    def to_dict(self) -> dict:
        return {"numa_node": self.numa_node, "cpus": self.cpus}


def _cpu_list_problem(cpus: Any) -> str | None:
    return cpulist.problem(cpus)  # bounded before expanding (hosts.engines.cpulist)


@dataclass(frozen=True)
class LaunchConfig:
    """Everything needed to start one engine. ``runner="simulator"`` starts
    ``python -m hosts.simulator`` with the same flags (demo fleet, tests); ``simulator`` holds
    the simulator's own options (``gpu``, ``num_gpus``, ``startup_seconds``, ``time_scale``,
    ``seed``, ``knowledge``: the path of what the simulated model knows).
    ``simulator["num_gpus"]``, when given, is also the GPU count the tensor-parallel size must
    divide."""

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

    def validated(self, gpu_count: int | None = None) -> LaunchConfig:
        """A copy with settings coerced by the engine's table (for ``engine_version`` and, when
        known, ``gpu_count`` or else ``simulator["num_gpus"]``), or LaunchError naming every
        bad field."""
        errors: dict[str, str] = {}
        if self.engine not in ENGINES:
            errors["engine"] = f"unknown engine {self.engine!r} (choose from vllm, sglang)"
        problem = text_problem(self.model)
        if problem:
            errors["model"] = problem
        version = None
        if self.engine_version is not None:
            try:
                version = engine_version(self.engine_version)
            except EngineArgError as exc:
                errors["engine_version"] = str(exc)
        if self.runner not in RUNNERS:
            errors["runner"] = f"unknown runner {self.runner!r} (choose from engine, simulator)"
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            errors["port"] = f"expected a port number, got {self.port!r}"
        elif not 1 <= self.port <= 65535:
            errors["port"] = f"port {self.port} is outside 1-65535"
        problem = _host_problem(self.host)
        if problem:
            errors["host"] = problem
        env = _check_env(self.env, errors)
        placement = self.placement
        if placement is not None and not isinstance(placement, Placement):
            errors["placement"] = f"expected a Placement, got {type(placement).__name__}"
        elif placement is not None:
            errors.update(placement.problems())
            if placement.numa_node is None and placement.cpus is None:
                placement = None  # nothing to pin: the same as no placement
        simulator = _check_simulator(self.simulator, errors)
        if gpu_count is None and "simulator.num_gpus" not in errors:
            gpu_count = simulator.get("num_gpus")
        settings = self._check_settings(version, gpu_count, errors)
        seed = simulator.get("seed")
        if self.runner == "simulator" and self.engine == "vllm" and seed is not None:
            # The simulator has no --seed of its own beside vLLM's: vLLM's seeds it too.
            if settings.setdefault("seed", seed) != seed:
                errors["simulator.seed"] = f"{seed} differs from settings.seed {settings['seed']}"
        if errors:
            raise LaunchError(errors)
        return replace(self, settings=settings, env=env, placement=placement, simulator=simulator)

    def _check_settings(self, version, gpu_count, errors: dict[str, str]) -> dict:
        if not isinstance(self.settings, Mapping):
            errors["settings"] = (
                f"expected a mapping of settings, got {type(self.settings).__name__}"
            )
            return {}
        settings = dict(self.settings)
        for name, owner in RESERVED_SETTINGS.items():
            if name in settings:
                del settings[name]
                errors[f"settings.{name}"] = f"{name} is set by {owner}, not in settings"
        if self.engine not in ENGINES:
            return settings
        clean, bad = get_spec(self.engine).validate(settings, version, gpu_count)
        for dest, message in bad.items():
            errors["settings" if dest == "__all__" else f"settings.{dest}"] = message
        return clean

    def to_dict(self) -> dict:
        return {
            "engine": self.engine,
            "model": self.model,
            "settings": {k: _json_safe(v) for k, v in dict(self.settings).items()},
            "engine_version": self.engine_version,
            "env": dict(self.env),
            "placement": self.placement.to_dict() if self.placement is not None else None,
            "port": self.port,
            "host": self.host,
            "runner": self.runner,
            "simulator": dict(self.simulator),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LaunchConfig:
        """The inverse of ``to_dict``; shapes are checked here, values by ``validated()``."""
        if not isinstance(data, Mapping):
            raise LaunchError({"__all__": f"expected a mapping, got {type(data).__name__}"})
        known = set(cls.__dataclass_fields__)
        errors = {k: "unknown field" for k in data if k not in known}
        for required in ("engine", "model"):
            if required not in data:
                errors[required] = "missing"
        placement = data.get("placement")
        if placement is not None:
            if not isinstance(placement, Mapping) or set(placement) - {"numa_node", "cpus"}:
                errors["placement"] = (
                    f"expected {{'numa_node': int | None, 'cpus': str | None}}, got {placement!r}"
                )
            else:
                placement = Placement(**placement)
        for name in ("settings", "env", "simulator"):
            if data.get(name) is not None and not isinstance(data[name], Mapping):
                errors[name] = f"expected a mapping, got {type(data[name]).__name__}"
        if errors:
            raise LaunchError(errors)
        values = {k: v for k, v in data.items() if k in known}
        values["placement"] = placement
        values["settings"] = dict(values.get("settings") or {})
        values["env"] = dict(values.get("env") or {})
        values["simulator"] = dict(values.get("simulator") or {})
        return cls(**values)


@dataclass(frozen=True)
class ProcessCommand:
    argv: tuple[str, ...]
    env: dict[str, str]


@dataclass(frozen=True)
class SystemdUnit:
    unit_text: str
    env_text: str


def render_process(cfg: LaunchConfig, python: str = "python3") -> ProcessCommand:
    """The argv the agent starts (CPU placement as a ``numactl``/``taskset`` prefix) and the
    variables the config adds; the caller merges them into its own environment."""
    errors: dict[str, str] = {}
    _check_program(python, "python", errors)
    cfg = _validated(cfg, errors)
    argv = _placement_prefix(cfg.placement) + _engine_argv(cfg, python)
    return ProcessCommand(argv=tuple(argv), env=dict(cfg.env))


def render_docker(
    cfg: LaunchConfig, *, name: str, image: str | None = None, gpus: list[int] | None = None
) -> list[str]:
    """The argv of a ``docker run`` that starts the engine detached (``gpus=None``: all)."""
    errors: dict[str, str] = {}
    if not isinstance(name, str) or not CONTAINER_NAME.match(name):
        errors["name"] = f"invalid container name {name!r}: letters, digits, _ . - (128 at most)"
    if image is not None and (not isinstance(image, str) or not IMAGE_REF.match(image)):
        errors["image"] = f"invalid image reference {image!r}"
    if gpus is not None and (
        not isinstance(gpus, list | tuple)
        or not gpus
        or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpus)
        or len(set(gpus)) != len(gpus)
    ):
        errors["gpus"] = f"expected distinct GPU indices >= 0 (None for all GPUs), got {gpus!r}"
    if cfg.runner != "engine":
        errors["runner"] = "docker runs the real engine; the simulator runs as a process"
    if _host_problem(cfg.host) is None and not _is_ip(cfg.host):
        errors["host"] = f"docker publishes a port on an IP address, not on {cfg.host!r}"
    cfg = _validated(cfg, errors)
    if image is None:
        image = _default_image(cfg)
        if not IMAGE_REF.match(image):
            raise LaunchError({"image": f"no default image for version {cfg.engine_version!r}"})
    # Inside the container the engine listens on every interface of its own network namespace;
    # the config's host decides which host address the port is published on.
    publish = f"{cfg.port}:{cfg.port}"
    if cfg.host != "0.0.0.0":  # noqa: S104
        address = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
        publish = f"{address}:{publish}"
    argv = ["docker", "run", "-d", "--name", name, "--ipc=host", "-p", publish]
    # docker reads the value of --gpus as CSV: a device list must be one quoted field.
    argv += ["--gpus", "all" if gpus is None else f'"device={",".join(map(str, gpus))}"']
    for key, value in cfg.env.items():
        argv += ["-e", f"{key}={value}"]
    if cfg.placement is not None and cfg.placement.cpus is not None:
        argv += ["--cpuset-cpus", cfg.placement.cpus]
    if cfg.placement is not None and cfg.placement.numa_node is not None:
        # Memory only: docker cannot bind to a node's CPUs by node number, the CPU list does.
        argv += ["--cpuset-mems", str(cfg.placement.numa_node)]
    inside = replace(cfg, host="0.0.0.0")  # noqa: S104
    if cfg.engine == "vllm":
        # vllm-openai's ENTRYPOINT is ["vllm", "serve"] now (docker/Dockerfile, target
        # vllm-openai) but was ["python3", "-m", "vllm.entrypoints.openai.api_server"], which
        # wants --model rather than a positional model, in earlier images (still so in May 2025,
        # vllm-project/vllm#17172); naming the entrypoint makes one argv right for both.
        argv += ["--entrypoint", "vllm", image, *_engine_argv(inside, "python3")[1:]]
    else:
        # lmsysorg/sglang sets no entrypoint of its own: the command is the whole argv.
        argv += [image, *_engine_argv(inside, "python3")]
    return argv


def render_systemd(
    cfg: LaunchConfig,
    *,
    unit_name: str,
    env_file: str,
    user: str | None = None,
    python: str = "python3",
) -> SystemdUnit:
    """A service unit and the EnvironmentFile it reads. Placement is systemd's own
    (CPUAffinity=, NUMAPolicy=) rather than a numactl prefix, so systemd applies it to every
    process of the unit."""
    errors: dict[str, str] = {}
    if not isinstance(unit_name, str) or not UNIT_NAME.match(unit_name):
        errors["unit_name"] = f"invalid unit name {unit_name!r}: expected NAME.service"
    if (
        not isinstance(env_file, str)
        or not ENV_FILE.match(env_file)
        or "/../" in env_file + "/"
        or "/./" in env_file + "/"
    ):
        errors["env_file"] = f"expected an absolute path of plain names, got {env_file!r}"
    if user is not None and (not isinstance(user, str) or not USER_NAME.match(user)):
        errors["user"] = f"invalid user name {user!r}"
    _check_program(python, "python", errors)
    cfg = _validated(cfg, errors)
    argv = _engine_argv(cfg, python)
    if cfg.runner == "engine" and cfg.engine == "vllm" and os.path.isabs(python):
        # systemd looks bare program names up in a fixed, compiled-in PATH, which holds no
        # virtual environment; the vllm script sits next to the environment's python.
        argv[0] = os.path.join(os.path.dirname(python), "vllm")
    # Every item passed _text/flag validation: no whitespace, quotes, $, %, \ or ; — so joined by
    # spaces the line means exactly these words (systemd splits ExecStart= itself, no shell).
    lines = [
        "# Rendered by the control panel: change the deployment there, not here.",
        "[Unit]",
        f"Description={cfg.engine} {cfg.model} on port {cfg.port} (control panel)",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=simple",
    ]
    if user is not None:
        lines.append(f"User={user}")
    lines += [
        f"EnvironmentFile={env_file}",
        "ExecStart=" + " ".join(argv),
        "# No restarts by systemd: the panel's agent watches the engine, reports a failure and",
        "# rolls back a bad change; a restart behind its back would hide what happened.",
        "Restart=no",
        "KillMode=control-group",
        f"TimeoutStopSec={STOP_TIMEOUT_S}",
    ]
    placement = cfg.placement
    if placement is not None:
        if placement.cpus is not None:
            lines.append(f"CPUAffinity={placement.cpus}")
        if placement.numa_node is not None:
            lines += ["NUMAPolicy=bind", f"NUMAMask={placement.numa_node}"]
            if placement.cpus is None:
                lines.append("CPUAffinity=numa")  # the node's CPUs, like numactl --cpunodebind
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    env_text = "".join(f"{k}={v}\n" for k, v in cfg.env.items())
    return SystemdUnit(unit_text="\n".join(lines), env_text=env_text)


# --- helpers --------------------------------------------------------------------------------------


def _validated(cfg: LaunchConfig, errors: dict[str, str]) -> LaunchConfig:
    """``cfg.validated()`` with the renderer's own errors reported alongside the config's."""
    try:
        cfg = cfg.validated()
    except LaunchError as exc:
        errors = {**errors, **exc.errors}
    if errors:
        raise LaunchError(errors)
    return cfg


def _engine_argv(cfg: LaunchConfig, python: str) -> list[str]:
    spec = get_spec(cfg.engine)
    gpu_count = cfg.simulator.get("num_gpus")
    settings = {**cfg.settings, "host": cfg.host, "port": cfg.port}
    sim_flags: list[str] = []
    if cfg.runner == "simulator":
        seed = cfg.simulator.get("seed")
        if seed is not None and cfg.engine == "sglang":  # vLLM's went into settings.seed
            sim_flags += ["--seed", str(seed)]
        for key, option in (
            ("gpu", "--gpu"),
            ("num_gpus", "--num-gpus"),
            ("startup_seconds", "--startup-seconds"),
            ("time_scale", "--time-scale"),
        ):
            if cfg.simulator.get(key) is not None:
                sim_flags += [option, _number(cfg.simulator[key])]
        if cfg.engine_version is not None:
            sim_flags += ["--engine-version", cfg.engine_version]
        if cfg.simulator.get("knowledge") is not None:
            sim_flags += ["--knowledge", cfg.simulator["knowledge"]]
    engine_args = spec.render_command(cfg.model, settings, cfg.engine_version, gpu_count)
    if cfg.runner == "simulator":
        return [python, "-m", "hosts.simulator", cfg.engine, *engine_args, *sim_flags]
    if cfg.engine == "vllm":
        return ["vllm", "serve", *engine_args]
    return [python, "-m", "sglang.launch_server", *engine_args]


def _placement_prefix(placement: Placement | None) -> list[str]:
    if placement is None:
        return []
    node, cpus = placement.numa_node, placement.cpus
    if node is not None and cpus is not None:
        return ["numactl", f"--physcpubind={cpus}", f"--membind={node}", "--"]
    if node is not None:
        return ["numactl", f"--cpunodebind={node}", f"--membind={node}", "--"]
    return ["taskset", "-c", cpus]


def _default_image(cfg: LaunchConfig) -> str:
    repo = "vllm/vllm-openai" if cfg.engine == "vllm" else "lmsysorg/sglang"
    if cfg.engine_version is None:
        return f"{repo}:latest"
    return f"{repo}:v{cfg.engine_version.removeprefix('v')}"


def _host_problem(host: Any) -> str | None:
    if not isinstance(host, str):
        return f"expected an IP address or host name, got {host!r}"
    if _is_ip(host) or HOSTNAME.match(host):
        return None
    return f"invalid host {host!r}: expected an IP address or a host name"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _check_program(program: Any, name: str, errors: dict[str, str]) -> None:
    if (
        not isinstance(program, str)
        or not PROGRAM.match(program)
        or program.startswith("-")
        or "/../" in program + "/"
    ):
        errors[name] = f"invalid program {program!r}: a plain name or an absolute path"


def _check_env(env: Any, errors: dict[str, str]) -> dict[str, str]:
    if not isinstance(env, Mapping):
        errors["env"] = f"expected a mapping of variables, got {type(env).__name__}"
        return {}
    clean = {}
    for name, value in env.items():
        problem = env_problem(name, value)
        if problem:
            errors[f"env.{name}"] = problem
            continue
        clean[name] = value
    return clean


def _check_simulator(options: Any, errors: dict[str, str]) -> dict[str, Any]:
    if not isinstance(options, Mapping):
        errors["simulator"] = f"expected a mapping of options, got {type(options).__name__}"
        return {}
    clean: dict[str, Any] = {}
    for key, value in options.items():
        field_name = f"simulator.{key}"
        if key not in SIMULATOR_KEYS:
            errors[field_name] = (
                f"unknown simulator option (choose from {', '.join(SIMULATOR_KEYS)})"
            )
        elif value is None:
            continue
        elif key == "gpu":
            if not isinstance(value, str) or value not in GPUS:
                errors[field_name] = f"unknown GPU {value!r} (choose from {', '.join(GPUS)})"
            else:
                clean[key] = value
        elif key == "knowledge":
            if (
                not isinstance(value, str)
                or not KNOWLEDGE_PATH.fullmatch(value)
                or "/../" in value + "/"
                or "/./" in value + "/"
                or len(value) > 4096
            ):
                errors[field_name] = (
                    f"expected an absolute path to a JSON Lines file, got {value!r}"
                )
            else:
                clean[key] = value
        elif key in ("num_gpus", "seed"):
            low = 1 if key == "num_gpus" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                errors[field_name] = f"expected an integer >= {low}, got {value!r}"
            else:
                clean[key] = value
        else:
            number = (
                value if isinstance(value, int | float) and not isinstance(value, bool) else None
            )
            if number is None or not math.isfinite(number) or number < 0:
                errors[field_name] = f"expected a number >= 0, got {value!r}"
            else:
                clean[key] = float(number)
    return clean


def _number(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _json_safe(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
