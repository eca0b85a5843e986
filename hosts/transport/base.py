"""How the panel reaches a host: one interface, two implementations (agent, SSH).

Every method is synchronous (Celery tasks call them) and raises ``TransportError`` (or one of
its subclasses) with a message an operator can act on; nothing else escapes. Dictionaries
returned follow the shapes documented on each method, whichever implementation produced them,
so the Django side never asks which transport it talks to.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from hosts.engines.launch import LaunchConfig


class TransportError(Exception):
    """The host could not be reached or refused what was asked; ``str()`` says why."""


class AuthError(TransportError):
    """Wrong or missing credentials (agent token, SSH key)."""


class HostKeyUnknown(TransportError):
    """First contact over SSH: no fingerprint stored yet. An admin must accept ``fingerprint``
    (``SHA256:…``, as ``ssh-keygen -lf`` prints it) before the panel talks to the host."""

    def __init__(self, fingerprint: str, key_type: str = ""):
        self.fingerprint, self.key_type = fingerprint, key_type
        super().__init__(
            f"the host presented an unknown {key_type} key {fingerprint}: "
            "an admin must accept it first"
        )


class HostKeyMismatch(TransportError):
    """The host's key is not the stored one: possibly a man in the middle. Refused."""

    def __init__(self, expected: str, presented: str):
        self.expected, self.presented = expected, presented
        super().__init__(
            f"HOST KEY CHANGED: expected {expected}, the host presented {presented}. "
            "Refusing to connect; if the server was reinstalled, an admin must accept the new key."
        )


# The fields of one GPU in ``Transport.telemetry()``, in order: every reader (NVML on the
# agent, nvidia-smi over SSH) fills these, None for what the driver does not report (and
# then names it in the reading's "missing" list).
GPU_READING_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "name",
    "memory_total_bytes",
    "memory_used_bytes",
    "utilization_gpu_pct",
    "utilization_memory_pct",
    "temperature_c",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "max_sm_clock_mhz",
    "mem_clock_mhz",
    "max_mem_clock_mhz",
    "clocks_event_reasons",
    "throttle_reasons",
    "pcie_tx_kbps",
    "pcie_rx_kbps",
    "numa_node",
    "cpu_affinity",
    "ecc_corrected",
    "ecc_uncorrected",
    "processes",
)

# An engine's name becomes part of remote paths, unit and container names and URLs: nothing
# else may get through (the agent checks the same pattern on its side).
ENGINE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


def check_engine_name(name: str) -> str:
    """``name`` if it is a valid engine name, else ``TransportError`` (before anything is sent)."""
    if not isinstance(name, str) or not ENGINE_NAME.fullmatch(name):
        raise TransportError(
            f"invalid engine name {name!r}: use 1-63 of a-z, 0-9 and '-', not starting with '-'"
        )
    return name


@dataclass
class ApplyOutcome:
    """What an apply or restart ended with.

    ``state``: ``ready`` (the new config runs and answers), ``rolled_back`` (the new config
    failed; the previous one runs again), ``failed`` (nothing healthy runs now). ``error`` is a
    one-line reason; ``log_lines`` are the engine's own last output lines (its error)."""

    state: str
    error: str = ""
    log_lines: list[str] = field(default_factory=list)
    detail: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.state == "ready"


class Transport(ABC):
    """One host. Engines on it are named (the deployment's name: ``[a-z0-9][a-z0-9-]*``)."""

    @abstractmethod
    def info(self) -> dict:
        """Cheap identity check for "test connection":
        ``{"kind": "agent"|"ssh", "hostname": str, "agent_version": str|None,
        "libraries": {package: version} (vllm, torch, … in the host's Python; {} unknown),
        "telemetry_source": "nvml"|"nvidia-smi"|"simulator"|"none", "detail": str}``."""

    @abstractmethod
    def inventory(self) -> dict:
        """``{"hostname", "driver_version", "cuda_version", "cpu_count", "cpu_model",
        "memory_total_bytes", "numa_nodes": [{"node": 0, "cpus": "0-15"}],
        "source": "nvml"|"nvidia-smi"|"simulator"|"none", "note": str,
        "gpus": [{"index", "uuid", "name", "memory_total_bytes", "numa_node", "cpu_affinity"}]}``
        (``numa_node``/``cpu_affinity`` None when unknown)."""

    @abstractmethod
    def telemetry(self) -> dict:
        """One sample: ``{"time": unix seconds, "source": …, "note": str,
        "gpus": [{"index", "uuid", "name", "memory_total_bytes", "memory_used_bytes",
        "utilization_gpu_pct", "utilization_memory_pct", "temperature_c", "power_w",
        "power_limit_w", "sm_clock_mhz", "max_sm_clock_mhz", "mem_clock_mhz",
        "max_mem_clock_mhz", "clocks_event_reasons" (int bitmask), "throttle_reasons"
        ([words]), "pcie_tx_kbps", "pcie_rx_kbps", "numa_node", "cpu_affinity",
        "ecc_corrected", "ecc_uncorrected", "processes": [{"pid", "used_memory_bytes"}],
        "missing": [names of the fields above the driver did not report]}],
        "host": {"cpu_percent", "load_avg": [1, 5, 15], "memory_total_bytes",
        "memory_used_bytes"},
        "engines": {name: {"state", "pid", "pids": [the engine's process tree],
        "cpu_affinity": [ints] | None}}}`` (``pids`` lets the panel see which GPUs an engine
        holds: those whose ``processes`` include one of them).
        A metric the driver does not support is None and listed in ``missing``."""

    @abstractmethod
    def engine_status(self, name: str) -> dict:
        """``{"name", "state": "stopped"|"starting"|"ready"|"failed", "pid": int|None,
        "exit_code": int|None, "started_at": unix|None, "ready_at": unix|None,
        "error": str, "last_lines": [str], "config": LaunchConfig.to_dict()|None}``."""

    @abstractmethod
    def apply_config(
        self,
        name: str,
        launch: LaunchConfig,
        *,
        previous: LaunchConfig | None,
        ready_timeout_s: float,
    ) -> ApplyOutcome:
        """Store ``launch`` as the engine's config, restart it, wait until ``/health`` and then
        ``/v1/models`` answer. If it is not ready within ``ready_timeout_s``, start
        ``previous`` again (when given) and report ``rolled_back`` with the engine's error
        lines; ``failed`` when the previous one does not come back either."""

    @abstractmethod
    def restart_engine(self, name: str, *, ready_timeout_s: float) -> ApplyOutcome:
        """Restart with the stored config and wait until ready."""

    @abstractmethod
    def stop_engine(self, name: str) -> None:
        """Stop the engine (no error when it is not running)."""

    @abstractmethod
    def logs(self, name: str, lines: int = 200) -> list[str]:
        """The engine's last output lines."""

    def close(self) -> None:  # noqa: B027 - optional for implementations without resources
        """Release connections."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
