"""Choices of the hosts app, each with a badge colour."""

from django.db import models


class TransportKind(models.TextChoices):
    AGENT = "agent", "Host agent"
    SSH = "ssh", "SSH"

    @property
    def default_port(self) -> int:
        return {TransportKind.AGENT: 8421, TransportKind.SSH: 22}[self]


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
