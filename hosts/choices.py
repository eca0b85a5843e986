"""Choices of the hosts app, each with a badge colour."""

from django.db import models


class TransportKind(models.TextChoices):
    AGENT = "agent", "Host agent"
    SSH = "ssh", "SSH"

    @property
    def default_port(self) -> int:
        return {TransportKind.AGENT: 9100, TransportKind.SSH: 22}[self]


class EngineKind(models.TextChoices):
    VLLM = "vllm", "vLLM"
    SGLANG = "sglang", "SGLang"


class DeploymentStatus(models.TextChoices):
    UNKNOWN = "unknown", "Unknown"
    STOPPED = "stopped", "Stopped"
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    DEGRADED = "degraded", "Degraded"
    FAILED = "failed", "Failed"

    @property
    def colour(self) -> str:
        return {
            DeploymentStatus.UNKNOWN: "grey",
            DeploymentStatus.STOPPED: "grey",
            DeploymentStatus.STARTING: "blue",
            DeploymentStatus.RUNNING: "green",
            DeploymentStatus.DEGRADED: "amber",
            DeploymentStatus.FAILED: "red",
        }[self]


class HostStatus(models.TextChoices):
    UNKNOWN = "unknown", "Not contacted yet"
    ONLINE = "online", "Online"
    UNREACHABLE = "unreachable", "Unreachable"
    AUTH_FAILED = "auth_failed", "Credentials refused"
    HOST_KEY = "host_key", "Host key to accept"
    HOST_KEY_CHANGED = "host_key_changed", "Host key changed"
    ERROR = "error", "Error"

    @property
    def colour(self) -> str:
        return {
            HostStatus.UNKNOWN: "grey",
            HostStatus.ONLINE: "green",
            HostStatus.UNREACHABLE: "red",
            HostStatus.AUTH_FAILED: "red",
            HostStatus.HOST_KEY: "amber",
            HostStatus.HOST_KEY_CHANGED: "red",
            HostStatus.ERROR: "red",
        }[self]


class LaunchStyle(models.TextChoices):
    PROCESS = "process", "Process (agent-supervised, or detached over SSH)"
    DOCKER = "docker", "docker run"
    SYSTEMD = "systemd", "systemd unit"


class Runner(models.TextChoices):
    ENGINE = "engine", "The real engine"
    SIMULATOR = "simulator", "The simulator (demo, tests)"


class OperationKind(models.TextChoices):
    APPLY = "apply", "Apply config"
    RESTART = "restart", "Restart engine"


class OperationOutcome(models.TextChoices):
    READY = "ready", "Ready"
    ROLLED_BACK = "rolled_back", "Rolled back"
    FAILED = "failed", "Failed"

    @property
    def colour(self) -> str:
        return {
            OperationOutcome.READY: "green",
            OperationOutcome.ROLLED_BACK: "amber",
            OperationOutcome.FAILED: "red",
        }[self]
