"""What environment a launch config may give an engine (pure: no Django): a named list of
variables known to tune an engine without naming a file, directory or library to load, each
with the values it may take, and why the ones people reach for most are refused. The panel
(``LaunchConfig.validated``) and the host agent (``hosts.agent.policy``) both ask
``env_problem``: the agent does not trust the panel to have asked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from hosts.engines.flags import SAFE_TEXT

ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# Integer indices, or GPU/MIG UUIDs as nvidia-smi -L prints them.
_DEVICE = r"(\d+|GPU-[0-9a-fA-F-]+|MIG-[0-9A-Za-z/-]+)"
CUDA_DEVICES = re.compile(rf"^{_DEVICE}(,{_DEVICE})*$")


@dataclass(frozen=True)
class EnvVar:
    """An environment variable a launch config may set: one known to tune the engine without
    naming a file, a directory or a library to load. ``values`` is what its value must match
    (beyond the plain-text rule every value meets); ``secret`` values are masked wherever the
    panel shows, logs, exports or sends a config (hosts.engines.redaction)."""

    name: str
    values: str | None = None  # a regular expression the whole value must match
    hint: str = ""  # what the values are, in words (plain alternatives say it themselves)
    secret: bool = False

    def problem(self, value: str) -> str | None:
        if self.values is None or re.fullmatch(self.values, value):
            return None
        hint = self.hint
        if not hint and re.fullmatch(r"\w+(\|\w+)*", self.values):
            hint = "one of " + ", ".join(self.values.split("|"))
        return f"invalid value {value!r} for {self.name}: expected {hint or self.values}"


_SWITCH = r"0|1"
_BOOL = r"0|1|true|false|True|False|TRUE|FALSE"
_COUNT = r"\d{1,4}"
_WORDS = r"[A-Za-z0-9_]+(,[A-Za-z0-9_]+)*"
_IFACES = r"=?[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*"
# Named one by one: what each does is known and none of them names a path to load code or
# configuration from. A prefix (VLLM_*, NCCL_*, HF_*) would have let in CUDA_INJECTION64_PATH,
# VLLM_LOGGING_CONFIG_PATH (a logging config names classes to import), NCCL_NET_PLUGIN (a
# library NCCL loads) and HF_HOME (where remote code is cached and imported from).
SAFE_ENV: dict[str, EnvVar] = {
    var.name: var
    for var in (
        EnvVar(
            "CUDA_VISIBLE_DEVICES",
            CUDA_DEVICES.pattern.strip("^$"),
            "GPU indices or UUIDs like 0,1",
        ),
        # Read by the NVIDIA container runtime: which GPUs a container sees.
        EnvVar(
            "NVIDIA_VISIBLE_DEVICES",
            r"all|none|void|" + CUDA_DEVICES.pattern.strip("^$"),
            "all, none or GPU indices/UUIDs",
        ),
        EnvVar("CUDA_DEVICE_ORDER", r"FASTEST_FIRST|PCI_BUS_ID"),
        EnvVar("CUDA_LAUNCH_BLOCKING", _SWITCH),
        EnvVar("CUDA_DEVICE_MAX_CONNECTIONS", _COUNT, "a number"),
        EnvVar("CUDA_MODULE_LOADING", r"LAZY|EAGER"),
        EnvVar("NCCL_DEBUG", r"VERSION|WARN|INFO|TRACE|ABORT"),
        EnvVar("NCCL_DEBUG_SUBSYS", _WORDS, "names like INIT,COLL"),
        EnvVar("NCCL_P2P_DISABLE", _SWITCH),
        EnvVar(
            "NCCL_P2P_LEVEL", r"LOC|NVL|PIX|PXB|PHB|SYS|\d", "LOC, NVL, PIX, PXB, PHB, SYS or 0-9"
        ),
        EnvVar("NCCL_IB_DISABLE", _SWITCH),
        EnvVar("NCCL_SHM_DISABLE", _SWITCH),
        EnvVar("NCCL_NVLS_ENABLE", _SWITCH),
        EnvVar("NCCL_CUMEM_ENABLE", _SWITCH),
        EnvVar("NCCL_SOCKET_IFNAME", _IFACES, "interface names like eth0,ens5"),
        EnvVar("NCCL_IB_HCA", _IFACES, "device names like mlx5_0,mlx5_1"),
        EnvVar("NCCL_ALGO", _WORDS, "names like Ring,Tree"),
        EnvVar("NCCL_PROTO", _WORDS, "names like LL,LL128,Simple"),
        EnvVar("NCCL_MIN_NCHANNELS", _COUNT, "a number"),
        EnvVar("NCCL_MAX_NCHANNELS", _COUNT, "a number"),
        EnvVar("OMP_NUM_THREADS", _COUNT, "a number"),
        EnvVar("MKL_NUM_THREADS", _COUNT, "a number"),
        EnvVar("TOKENIZERS_PARALLELISM", r"true|false"),
        EnvVar("HF_HUB_OFFLINE", _BOOL),
        EnvVar("TRANSFORMERS_OFFLINE", _BOOL),
        EnvVar("HF_HUB_DISABLE_TELEMETRY", _BOOL),
        EnvVar("HF_HUB_ENABLE_HF_TRANSFER", _BOOL),
        # Gated models need a token to download; it is a credential, shown nowhere.
        EnvVar("HF_TOKEN", secret=True),
        EnvVar("HUGGING_FACE_HUB_TOKEN", secret=True),
        EnvVar(
            "PYTORCH_CUDA_ALLOC_CONF",
            r"[a-z_]+:[A-Za-z0-9_.]+(,[a-z_]+:[A-Za-z0-9_.]+)*",
            "option:value pairs like expandable_segments:True",
        ),
        EnvVar("TORCH_CUDA_ARCH_LIST", r"\d+\.\d(\+PTX)?", "one architecture like 9.0"),
        EnvVar("VLLM_API_KEY", secret=True),
        EnvVar("VLLM_ATTENTION_BACKEND", r"[A-Z0-9_]+", "a backend name like FLASHINFER"),
        EnvVar("VLLM_USE_V1", _SWITCH),
        EnvVar("VLLM_LOGGING_LEVEL", r"DEBUG|INFO|WARNING|ERROR|CRITICAL"),
        EnvVar("VLLM_CONFIGURE_LOGGING", _SWITCH),
        EnvVar("VLLM_WORKER_MULTIPROC_METHOD", r"spawn|fork"),
        EnvVar("VLLM_ENABLE_V1_MULTIPROCESSING", _SWITCH),
        EnvVar("VLLM_USE_FLASHINFER_SAMPLER", _SWITCH),
        EnvVar("VLLM_FLASH_ATTN_VERSION", r"2|3"),
        EnvVar("VLLM_ALLOW_LONG_MAX_MODEL_LEN", _SWITCH),
        EnvVar("VLLM_NO_USAGE_STATS", _SWITCH),
        EnvVar("VLLM_DO_NOT_TRACK", _SWITCH),
        EnvVar("SGLANG_ENABLE_TORCH_COMPILE", _BOOL),
        EnvVar("SGLANG_SET_CPU_AFFINITY", _BOOL),
    )
}
# Why the variables people reach for most are refused (anything not in SAFE_ENV is refused
# too, with the list of what is allowed).
ENV_REFUSED = {
    "CUDA_INJECTION64_PATH": "it names a library CUDA loads into the engine",
    "VLLM_LOGGING_CONFIG_PATH": "it names a logging config file vLLM loads, and a logging "
    "config can name Python classes to import",
    "VLLM_PLUGINS": "it chooses plugin packages vLLM imports",
    "VLLM_CACHE_ROOT": "it names a directory vLLM loads compiled code from",
    "VLLM_CONFIG_ROOT": "it names a directory vLLM reads configuration from",
    "NCCL_NET_PLUGIN": "it names a network plugin library NCCL loads",
    "NCCL_TUNER_PLUGIN": "it names a tuner plugin library NCCL loads",
    "NCCL_PROFILER_PLUGIN": "it names a profiler plugin library NCCL loads",
    "NCCL_CONF_FILE": "it names a configuration file NCCL reads",
    "NCCL_TOPO_FILE": "it names a topology file NCCL reads",
    "NCCL_DEBUG_FILE": "it names a file NCCL writes to",
    "HF_HOME": "it names the directory models, tokenizers and remote code are loaded from",
    "HF_HUB_CACHE": "it names the directory models and remote code are loaded from",
    "HF_MODULES_CACHE": "it names the directory remote code is imported from",
    "TRANSFORMERS_CACHE": "it names the directory models and remote code are loaded from",
    "HF_ENDPOINT": "it changes where models (and their code) are downloaded from",
    "TRITON_CACHE_DIR": "it names a directory compiled GPU code is loaded from",
    "TORCHINDUCTOR_CACHE_DIR": "it names a directory compiled code is loaded from",
    "PATH": "it changes which programs run",
    "BASH_ENV": "it names a file a shell runs at start",
}
ENV_REFUSED_PREFIXES = {
    "LD_": "the dynamic linker reads it: it changes which libraries the engine loads",
    "DYLD_": "the dynamic linker reads it: it changes which libraries the engine loads",
    "PYTHON": "it changes which Python code the engine runs or imports",
}


def env_problem(name: Any, value: Any) -> str | None:
    """Why a launch config may not set variable ``name`` to ``value``, or None. The panel
    (LaunchConfig.validated) and the agent (hosts.agent.policy) both ask this."""
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        return f"invalid variable name {name!r}: upper-case letters, digits and _"
    reason = ENV_REFUSED.get(name) or next(
        (why for prefix, why in ENV_REFUSED_PREFIXES.items() if name.startswith(prefix)), None
    )
    if reason:
        return f"{name} is not allowed: {reason}"
    var = SAFE_ENV.get(name)
    if var is None:
        return (
            f"{name} is not on the list of variables known to be safe for an engine "
            f"({', '.join(sorted(SAFE_ENV))}); variables that name a file, directory or "
            "library to load are never allowed"
        )
    if var.secret and not isinstance(value, str):
        return f"invalid value for {name} (hidden): expected text"
    if var.secret and not SAFE_TEXT.match(value):
        return (
            f"invalid value for {name} (hidden): only letters, digits and _ . : / @ + = , - "
            "are allowed"
        )
    return text_problem(value) or var.problem(value)


def text_problem(value: Any) -> str | None:
    """Why ``value`` may not reach a command line or an environment as text, or None."""
    if not isinstance(value, str) or not SAFE_TEXT.match(value):
        return f"invalid value {value!r}: only letters, digits and _ . : / @ + = , - are allowed"
    if value.startswith("-"):
        return f"invalid value {value!r}: may not start with '-' (it would read as an option)"
    return None
