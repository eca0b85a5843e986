"""Choices of the benchmarks app."""

from django.db import models


class LoadMode(models.TextChoices):
    CLOSED = "closed", "Closed loop (fixed concurrency)"
    OPEN = "open", "Open loop (request rate)"


class Dataset(models.TextChoices):
    RANDOM = "random", "Random tokens of set lengths"
    SHARED_PREFIX = "shared-prefix", "Shared system prompt + random suffix"
