"""New deployments from the panel: the rules a new engine on a host must meet (a free name and
port, GPUs of this host that no other engine holds, an engine version and model the launch
rules accept, settings the engine's flag spec accepts), the fit check of the model's weights
against the chosen GPUs' memory, and the creation itself: the deployment, its config v1, the
audit entry and the first start, queued as an ordinary apply of v1.

One definition of each rule: versions, the model text, ports and settings are checked by
``LaunchConfig.validated`` (hosts.engines.launch), the flags text is read by the engine's own
argument parser (``EngineSpec.parse_argv``), weights and KV bytes come from the catalogue."""

from __future__ import annotations

import shlex
import socket
from dataclasses import dataclass, field

from django.db import IntegrityError, transaction

from controlpanel.services import audit
from hosts.addresses import is_loopback
from hosts.choices import DeploymentStatus, LaunchStyle, OperationKind, Runner
from hosts.engines import ENGINES, get_spec, sglang
from hosts.engines.catalog import GPUS, HF_REPOS, MODELS, UnknownModel, gpu_key, resolve_model
from hosts.engines.flags import EngineArgError
from hosts.engines.launch import LaunchConfig, LaunchError
from hosts.models import ENGINE_NAME, Deployment, EngineConfig, Gpu, Host
from hosts.services.code_loading import as_diff, require_code_loading
from hosts.services.deployment_review import first_start_approvals
from hosts.services.operations import request_operation

GIB = 2**30
CREATED_NOTE = "created in the panel"
# The form's and the API's field names; an error of the launch rules lands on one of them.
FIELDS = ("name", "engine", "engine_version", "model", "gpus", "port", "launch_style", "settings")
FIRST_PORTS = {"vllm": 8000, "sglang": 30000}  # the engines' own default ports


class DeploymentRefused(Exception):
    """A new deployment that must not be created; ``errors`` maps each field to its reasons."""

    def __init__(self, errors: dict[str, list[str]]):
        self.errors = errors
        super().__init__("; ".join(f"{k}: {m}" for k, v in errors.items() for m in v))


@dataclass
class Fit:
    """Whether the model's weights fit the chosen GPUs, in numbers people can check.

    ``fits`` is None when the model's size is unknown (not in the catalogue): a warning, not a
    refusal."""

    fits: bool | None
    message: str
    weights_gib: float | None = None  # per GPU (weights split by tensor parallelism)
    budget_gib: float | None = None  # per GPU: memory × the engine's memory fraction
    kv_cache_gib: float | None = None  # all GPUs together
    kv_tokens: int | None = None
    facts: dict = field(default_factory=dict)

    @property
    def kv_tokens_shown(self) -> str:
        return f"{self.kv_tokens:,}" if self.kv_tokens is not None else ""


# --- what the form offers ----------------------------------------------------------------------
def is_simulated(host: Host) -> bool:
    """A host whose GPUs are the simulator's (the demo fleet's agents run ``--simulate`` and
    report it as their telemetry source): its engines are the simulator too."""
    return host.telemetry_source == "simulator" or (host.labels or {}).get("simulated") == "yes"


def gpu_users(host: Host) -> dict[int, str]:
    """``{GPU index: the deployment using it}`` on this host."""
    used = {}
    for deployment in host.deployments.prefetch_related("gpus"):
        for gpu in deployment.gpus.all():
            used.setdefault(gpu.index, deployment.name)
    return used


def taken_ports(host: Host) -> dict[int, str]:
    """``{port: deployment}`` of the engines on this machine: hosts that share an address
    (the demo fleet's simulated hosts all live on 127.0.0.1) share its ports too."""
    rows = Deployment.objects.filter(host__address=host.address).select_related("host")
    return {d.port: f"{d.host.name}/{d.name}" for d in rows}


def free_port(host: Host, engine: str = "vllm") -> int:
    """The port to offer: the engine's default when no engine there has it, else the next free
    one after the highest in use. A host on the panel's own machine (the demo fleet's agents
    on 127.0.0.1) continues its engines' range instead, skipping ports something already
    listens on: the engine default, 8000, is also where ``make run`` serves the panel."""
    taken = taken_ports(host)
    local = is_loopback(host.address)
    port = FIRST_PORTS.get(engine, 8000)
    if port in taken or (local and taken):
        port = max(taken) + 1
    for _ in range(1000):
        if port > 65535:
            port = 1024
        if port not in taken and not (local and _listening(port)):
            return port
        port += 1
    return port


def _listening(port: int) -> bool:
    """Whether this machine's loopback port is in use (the bind fails)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def catalogue_models() -> list[tuple[str, str]]:
    """``(name, description)`` of every catalogue model, for the form's suggestions: its
    Hugging Face repository where one is known (what a real engine loads), else its key."""
    out = []
    for key, spec in MODELS.items():
        weights = spec.weight_bytes / GIB
        quant = f" · {spec.quantization.upper()}" if spec.quantization else ""
        out.append(
            (
                HF_REPOS.get(key, key),
                f"{spec.params / 1e9:.1f}B params{quant} · {weights:.1f} GiB weights",
            )
        )
    return out


# --- the fit check -----------------------------------------------------------------------------
def fit_check(engine: str, model: str, gpus: list[Gpu], settings: dict) -> Fit:
    """The model's weights against each chosen GPU's memory × the engine's memory fraction
    (``--gpu-memory-utilization``, SGLang's ``--mem-fraction-static``; the engine's default
    when unset), split over the tensor-parallel GPUs; what is left holds the KV cache."""
    if not gpus:
        return Fit(None, "Choose GPUs to check whether the model fits.")
    try:
        spec = resolve_model(model)
    except UnknownModel:
        return Fit(
            None,
            f"The size of {model!r} is unknown (it is not in the catalogue), so whether it fits "
            "the GPUs' memory could not be checked.",
        )
    tp_dest = get_spec(engine).tp_dest if engine in ENGINES else None
    tp = int(settings.get(tp_dest) or len(gpus)) if tp_dest else len(gpus)
    memory = min(g.memory_bytes for g in gpus)  # the smallest GPU bounds every rank
    fraction = _memory_fraction(engine, settings, memory, tp)
    budget = memory * fraction
    weights = spec.weight_bytes / max(tp, 1)
    facts = {
        "model": spec.key,
        "tensor_parallel": tp,
        "memory_fraction": fraction,
        "gpu_memory_gib": round(memory / GIB, 1),
    }
    where = f"{tp} GPU{'s' if tp > 1 else ''}"
    if weights >= budget:
        return Fit(
            False,
            f"The weights of {spec.key} do not fit: {weights / GIB:.1f} GiB per GPU on {where} "
            f"against {budget / GIB:.1f} GiB usable ({memory / GIB:.1f} GiB × {fraction:g}). "
            "Choose more GPUs, a quantized variant (FP8, AWQ) or a larger GPU.",
            round(weights / GIB, 1),
            round(budget / GIB, 1),
            facts=facts,
        )
    kv_dtype = str(settings.get("kv_cache_dtype") or "")
    kv_per_token = spec.kv_bytes_per_token(1 if kv_dtype.startswith("fp8") else 2)
    kv_total = (budget - weights) * tp
    tokens = int(kv_total / kv_per_token)
    return Fit(
        True,
        f"The weights of {spec.key} fit: {weights / GIB:.1f} GiB per GPU on {where} of "
        f"{budget / GIB:.1f} GiB usable ({memory / GIB:.1f} GiB × {fraction:g}), leaving about "
        f"{kv_total / GIB:.1f} GiB for the KV cache, roughly {tokens:,} tokens "
        "(less what activations and CUDA graphs take).",
        round(weights / GIB, 1),
        round(budget / GIB, 1),
        round(kv_total / GIB, 1),
        tokens,
        facts=facts,
    )


def _memory_fraction(engine: str, settings: dict, memory: int, tp: int) -> float:
    if engine == "sglang":
        given = settings.get("mem_fraction_static")
        return float(given) if given else sglang.auto_defaults(memory, tp)["mem_fraction_static"]
    given = settings.get("gpu_memory_utilization")
    if given:
        return float(given)
    flag = get_spec("vllm").by_dest.get("gpu_memory_utilization")
    return float(flag.default if flag and flag.default else 0.9)


# --- reading the engine flags text -------------------------------------------------------------
def settings_from_flags(engine: str, version: str | None, text: str) -> dict:
    """``--flag value`` lines as settings, read by the engine's own argument parser (the
    simulator parses with the same one), so a typo is refused in the engine's words;
    EngineArgError otherwise."""
    try:
        argv = shlex.split(text or "", comments=True)
    except ValueError as exc:
        raise EngineArgError(f"cannot read the flags: {exc}") from None
    if not argv:
        return {}
    if {"-h", "--help"} & set(argv):
        raise EngineArgError("--help is not a setting")
    spec = get_spec(engine)
    head = ["MODEL"] if spec.model_option is None else [spec.model_option, "MODEL"]
    _, settings = spec.parse_argv(head + argv, version or None)
    return settings


# --- validating and creating -------------------------------------------------------------------
def check(host: Host, data: dict) -> tuple[LaunchConfig | None, list[Gpu], Fit, dict]:
    """Everything a new deployment must meet, without writing: ``(launch, gpus, fit, errors by
    field)``; ``launch`` is the validated launch of config v1 (None when refused)."""
    errors: dict[str, list[str]] = {}

    def refuse(name: str, message: str) -> None:
        errors.setdefault(name, []).append(message)

    name, engine = data.get("name") or "", data.get("engine") or ""
    if not ENGINE_NAME.fullmatch(name):
        # It becomes a unit, container and directory name on the host.
        refuse("name", "Lower-case letters, digits and '-' (a unit/container name).")
    elif host.deployments.filter(name=name).exists():
        refuse("name", f"{host.name} already has a deployment named {name!r}.")
    if engine not in ENGINES:
        refuse("engine", f"Unknown engine {engine!r} (choose from {', '.join(ENGINES)}).")
    if data.get("launch_style") not in LaunchStyle.values:
        refuse("launch_style", f"Choose one of: {', '.join(LaunchStyle.values)}.")
    port = data.get("port")
    taken = taken_ports(host).get(port)
    if taken:
        refuse("port", f"Port {port} is taken by {taken} on this machine.")
    gpus = _gpus(host, list(data.get("gpus") or []), refuse)
    settings = dict(data.get("settings") or {})
    tp_dest = get_spec(engine).tp_dest if engine in ENGINES else None
    if tp_dest and len(gpus) > 1:
        # The GPUs chosen are the ones the engine shards the model over.
        settings.setdefault(tp_dest, len(gpus))
    launch = None
    try:
        launch = _launch(host, data, settings, gpus).validated(gpu_count=len(gpus) or None)
    except LaunchError as exc:
        for key, message in exc.errors.items():
            refuse(_field(key), message)
    fit = fit_check(engine, data.get("model") or "", gpus, launch.settings if launch else settings)
    if fit.fits is False:
        refuse("gpus", fit.message)
    return (None if errors else launch), gpus, fit, errors


def _gpus(host: Host, indexes: list, refuse) -> list[Gpu]:
    known = {g.index: g for g in host.gpus.all()}
    if not known:
        refuse("gpus", f"The GPUs of {host.name} are not known yet: test its connection first.")
        return []
    if not indexes:
        refuse("gpus", "Choose at least one GPU.")
        return []
    users = gpu_users(host)
    chosen = []
    for index in dict.fromkeys(indexes):
        gpu = known.get(index)
        if gpu is None:
            refuse("gpus", f"{host.name} has no GPU {index}.")
        elif index in users:
            refuse("gpus", f"GPU {index} is used by {users[index]}.")
        else:
            chosen.append(gpu)
    return chosen


def _launch(host: Host, data: dict, settings: dict, gpus: list[Gpu]) -> LaunchConfig:
    runner, simulator = _runner(host, gpus)
    return LaunchConfig(
        engine=data.get("engine") or "",
        model=data.get("model") or "",
        settings=settings,
        engine_version=data.get("engine_version") or "",
        env=_env(gpus),
        port=data.get("port"),
        runner=runner,
        simulator=simulator,
    )


def _env(gpus: list[Gpu]) -> dict:
    # The engine sees exactly the GPUs it was given, in index order.
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(g.index) for g in gpus)} if gpus else {}


def _runner(host: Host, gpus: list[Gpu]) -> tuple[str, dict]:
    """On a simulated host the engine is the simulator, given the chosen GPUs' kind and count
    (as seed_demo gives the demo deployments), and what the host's other simulated engines
    know (the quality probes' knowledge file)."""
    if not is_simulated(host):
        return Runner.ENGINE, {}
    key = (gpu_key(gpus[0].name) if gpus else None) or "h100-sxm"
    options = {"gpu": key if key in GPUS else "h100-sxm", "num_gpus": max(len(gpus), 1)}
    options["startup_seconds"] = 3
    sibling = host.deployments.filter(runner=Runner.SIMULATOR).exclude(simulator={}).first()
    if sibling and sibling.simulator.get("knowledge"):
        options["knowledge"] = sibling.simulator["knowledge"]
    return Runner.SIMULATOR, options


def _field(key: str) -> str:
    """The form field a launch rule's error belongs to (``settings.max_num_seqs`` → settings)."""
    head = key.split(".", 1)[0]
    if head == "simulator":
        return "gpus"
    return head if head in FIELDS else "settings"


def create_deployment(actor, host: Host, data: dict) -> tuple[Deployment, Fit]:
    """Create a deployment on ``host`` from ``data`` (name, engine, engine_version, model,
    gpus: indexes, port, launch_style, settings) with its config v1, audit it, and queue its
    first start (an apply of v1: the host page shows it starting, and it runs once healthy).
    On a production host the first start waits for approvals instead
    (``deployment_review``). DeploymentRefused names every field that must change."""
    launch, gpus, fit, errors = check(host, data)
    if errors:
        raise DeploymentRefused(errors)
    # The rule a change meets for the same options (PermissionDenied: 403 in the API).
    require_code_loading(actor, launch.engine, as_diff(launch.settings))
    needed = first_start_approvals(host)
    try:
        with transaction.atomic():
            deployment = Deployment.objects.create(
                host=host,
                name=data["name"],
                engine=launch.engine,
                engine_version=launch.engine_version,
                model=launch.model,
                port=launch.port,
                launch_style=data["launch_style"],
                runner=launch.runner,
                simulator=dict(launch.simulator),
                status=DeploymentStatus.IN_REVIEW if needed else DeploymentStatus.STARTING,
                status_detail=(
                    f"0 of {needed} approvals: {host.name} is a production host"
                    if needed
                    else "first start queued"
                ),
                created_by=actor if getattr(actor, "pk", None) else None,
                required_approvals=needed,
            )
            deployment.gpus.set(gpus)
            config = EngineConfig.objects.create_next(
                deployment,
                dict(launch.settings),
                env=dict(launch.env),
                created_by=actor,
                note=CREATED_NOTE,
                model=launch.model,
            )
            audit(actor, "deployment.create", deployment, after=_audited(deployment, config, fit))
            if not needed:
                request_operation(
                    actor, deployment, OperationKind.APPLY, config, note="first start"
                )
    except IntegrityError:
        # Another request took the name or the port between our check and our insert.
        raise DeploymentRefused(
            {"name": ["Another deployment just took this name or port: try again."]}
        ) from None
    return deployment, fit


def _audited(deployment: Deployment, config: EngineConfig, fit: Fit) -> dict:
    return {
        "engine": deployment.engine,
        "engine_version": deployment.engine_version,
        "model": deployment.model,
        "port": deployment.port,
        "gpus": [g.index for g in deployment.gpus.order_by("index")],
        "launch_style": deployment.launch_style,
        "runner": deployment.runner,
        "config_version": config.version,
        "settings": config.settings,
        "fit": fit.message,
        "required_approvals": deployment.required_approvals,
    }
