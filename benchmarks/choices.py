"""Choices of the benchmarks app."""

from django.db import models


class ProfileSource(models.TextChoices):
    BUILTIN = "builtin", "Built-in starter"
    MANUAL = "manual", "Written by hand"
    TRAFFIC = "traffic", "Fitted to a traffic sample"
    REPLAY = "replay", "Replays a traffic sample"
    IMPORTED = "imported", "Imported"


class RunSource(models.TextChoices):
    PANEL = "panel", "Run by the panel"
    LOADGEN = "loadgen", "Imported: load generator CLI"
    VLLM_BENCH = "vllm-bench", "Imported: vllm bench serve"


class Pricing(models.TextChoices):
    ON_DEMAND = "on_demand", "On-demand"
    RESERVED = "reserved", "Reserved / committed"
    SPOT = "spot", "Spot / preemptible"
