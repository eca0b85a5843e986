"""Choices of the benchmarks app."""

from django.db import models

from controlpanel.choices import ColouredChoices


class ProfileSource(ColouredChoices):
    BUILTIN = "builtin", "Built-in starter", "blue"
    MANUAL = "manual", "Written by hand", "grey"
    TRAFFIC = "traffic", "Fitted to a traffic sample", "green"
    REPLAY = "replay", "Replays a traffic sample", "green"
    IMPORTED = "imported", "Imported", "amber"


class RunSource(models.TextChoices):
    PANEL = "panel", "Run by the panel"
    LOADGEN = "loadgen", "Imported: load generator CLI"
    VLLM_BENCH = "vllm-bench", "Imported: vllm bench serve"
    GUIDELLM = "guidellm", "Imported: GuideLLM"
    AIPERF = "aiperf", "Imported: AIPerf"


class Pricing(models.TextChoices):
    ON_DEMAND = "on_demand", "On-demand"
    RESERVED = "reserved", "Reserved / committed"
    SPOT = "spot", "Spot / preemptible"
