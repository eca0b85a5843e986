"""Choices of the hosts app; statuses declare their badge colour (``ColouredChoices``)."""

from django.db import models

from controlpanel.choices import ColouredChoices


class TransportKind(models.TextChoices):
    AGENT = "agent", "Host agent"
    SSH = "ssh", "SSH"

    @property
    def default_port(self) -> int:
        return {TransportKind.AGENT: 9100, TransportKind.SSH: 22}[self]


class EngineKind(models.TextChoices):
    VLLM = "vllm", "vLLM"
    SGLANG = "sglang", "SGLang"


class DeploymentStatus(ColouredChoices):
    # A new deployment on a production host: its first start waits for approvals.
    IN_REVIEW = "in_review", "Awaiting approval", "amber"
    UNKNOWN = "unknown", "Unknown", "grey"
    STOPPED = "stopped", "Stopped", "grey"
    STARTING = "starting", "Starting", "blue"
    RUNNING = "running", "Running", "green"
    DEGRADED = "degraded", "Degraded", "amber"
    FAILED = "failed", "Failed", "red"


class HostStatus(ColouredChoices):
    UNKNOWN = "unknown", "Not contacted yet", "grey"
    ONLINE = "online", "Online", "green"
    UNREACHABLE = "unreachable", "Unreachable", "red"
    AUTH_FAILED = "auth_failed", "Credentials refused", "red"
    HOST_KEY = "host_key", "Host key to accept", "amber"
    HOST_KEY_CHANGED = "host_key_changed", "Host key changed", "red"
    ERROR = "error", "Error", "red"


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


class OperationOutcome(ColouredChoices):
    READY = "ready", "Ready", "green"
    ROLLED_BACK = "rolled_back", "Rolled back", "amber"
    FAILED = "failed", "Failed", "red"


class CheckOutcome(ColouredChoices):
    """What a host check found. The check's own status only says whether it ran: a refused
    connection is a finished check with a red outcome, never a "Succeeded" one."""

    CONNECTED = "connected", "Connected", "green"
    PORT_OPEN = "port_open", "Port answers (no credentials to log in)", "amber"
    HOST_KEY = "host_key", "Host key to accept", "amber"
    UNREACHABLE = "unreachable", "Unreachable", "red"
    AUTH_FAILED = "auth_failed", "Credentials refused", "red"
    FAILED = "failed", "Connection failed", "red"
