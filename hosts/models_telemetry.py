"""Telemetry rows: 1-second GPU samples and their 1-minute and 1-hour aggregates.

A module of its own so ``hosts.models`` stays readable; ``hosts.models`` re-exports them
so ``from hosts.models import GpuSample`` keeps working everywhere."""

from __future__ import annotations

import time

from django.db import models
from django.db.models.signals import post_delete, post_save

# NVML's clock-event (throttle) reasons that slow a busy GPU, by the bit NVML sets for each
# (nvmlClocksEventReason*; REFERENCE.md). Idle (0x1) is left out: a GPU with no work
# clocking down is no throttle. Each has a per-minute sample count on ``GpuSampleMinute``,
# so the long-range charts can show the share of time each was active.
THROTTLE_REASONS = (
    # (field suffix, NVML bit, words for people)
    ("sw_power_cap", 0x4, "SW power cap"),
    ("hw_slowdown", 0x8, "HW slowdown"),
    ("sync_boost", 0x10, "Sync boost"),
    ("sw_thermal", 0x20, "SW thermal slowdown"),
    ("hw_thermal", 0x40, "HW thermal slowdown"),
    ("power_brake", 0x80, "HW power brake"),
)


class GpuSample(models.Model):
    """One telemetry reading of one GPU (about every second); kept for an hour, then folded
    into ``GpuSampleMinute``."""

    gpu = models.ForeignKey("hosts.Gpu", on_delete=models.CASCADE, related_name="samples")
    time = models.DateTimeField()
    utilization_pct = models.FloatField(null=True)
    memory_used_bytes = models.PositiveBigIntegerField(null=True)
    power_w = models.FloatField(null=True)
    power_limit_w = models.FloatField(null=True)
    temperature_c = models.FloatField(null=True)
    sm_clock_mhz = models.PositiveIntegerField(null=True)
    mem_clock_mhz = models.PositiveIntegerField(null=True)
    clocks_event_reasons = models.BigIntegerField(null=True)
    pcie_tx_kbps = models.FloatField(null=True)
    pcie_rx_kbps = models.FloatField(null=True)

    class Meta:
        app_label = "hosts"
        ordering = ["gpu", "time"]
        indexes = [models.Index(fields=["gpu", "time"]), models.Index(fields=["time"])]

    def __str__(self) -> str:
        return f"{self.gpu} @ {self.time:%H:%M:%S}"


class GpuAggregate(models.Model):
    """What a minute or an hour of a GPU's telemetry keeps: averages, extremes and counts of
    its 1-second samples (the columns ``GpuSampleMinute`` and ``GpuSampleHour`` share)."""

    samples = models.PositiveIntegerField()
    utilization_avg = models.FloatField(null=True)
    utilization_max = models.FloatField(null=True)
    memory_used_max = models.PositiveBigIntegerField(null=True)
    power_avg = models.FloatField(null=True)
    power_max = models.FloatField(null=True)
    power_limit_max = models.FloatField(null=True)
    temperature_max = models.FloatField(null=True)
    sm_clock_avg = models.FloatField(null=True)
    sm_clock_min = models.PositiveIntegerField(null=True)
    sm_clock_max = models.PositiveIntegerField(null=True)
    mem_clock_avg = models.FloatField(null=True)
    pcie_tx_avg = models.FloatField(null=True, help_text="kB/s")
    pcie_tx_max = models.FloatField(null=True, help_text="kB/s")
    pcie_rx_avg = models.FloatField(null=True, help_text="kB/s")
    pcie_rx_max = models.FloatField(null=True, help_text="kB/s")
    throttled_samples = models.PositiveIntegerField(
        default=0, help_text="Samples with a clock-event reason other than idle."
    )
    # The denominator of the per-reason shares: a driver that does not report reasons
    # leaves samples without a mask, which are neither throttled nor not.
    reason_samples = models.PositiveIntegerField(
        default=0, help_text="Samples that reported their clock-event reasons."
    )
    throttle_sw_power_cap = models.PositiveIntegerField(default=0)
    throttle_hw_slowdown = models.PositiveIntegerField(default=0)
    throttle_sync_boost = models.PositiveIntegerField(default=0)
    throttle_sw_thermal = models.PositiveIntegerField(default=0)
    throttle_hw_thermal = models.PositiveIntegerField(default=0)
    throttle_power_brake = models.PositiveIntegerField(default=0)

    class Meta:
        abstract = True


class GpuSampleMinute(GpuAggregate):
    """One minute of a GPU's telemetry, aggregated from the 1-second samples; kept
    ``TELEMETRY_MINUTE_RETENTION_DAYS`` (30 by default), the source of the 24 h and 7 d
    charts."""

    gpu = models.ForeignKey("hosts.Gpu", on_delete=models.CASCADE, related_name="minutes")
    minute = models.DateTimeField()

    class Meta:
        app_label = "hosts"
        ordering = ["gpu", "minute"]
        constraints = [
            models.UniqueConstraint(fields=["gpu", "minute"], name="gpusampleminute_unique")
        ]
        indexes = [models.Index(fields=["minute"])]

    def __str__(self) -> str:
        return f"{self.gpu} @ {self.minute:%Y-%m-%d %H:%M}"


class GpuSampleHour(GpuAggregate):
    """One hour of a GPU's telemetry, folded from its minutes (averages weighted by each
    minute's samples); kept ``TELEMETRY_HOUR_RETENTION_DAYS`` (400 by default), the source
    of the 30 d and 1 y charts. 24 rows a GPU a day where the minutes are 1,440."""

    gpu = models.ForeignKey("hosts.Gpu", on_delete=models.CASCADE, related_name="hours")
    hour = models.DateTimeField()

    class Meta:
        app_label = "hosts"
        ordering = ["gpu", "hour"]
        constraints = [models.UniqueConstraint(fields=["gpu", "hour"], name="gpusamplehour_unique")]
        indexes = [models.Index(fields=["hour"])]

    def __str__(self) -> str:
        return f"{self.gpu} @ {self.hour:%Y-%m-%d %H:00}"


# --- the pollers' GPU maps -------------------------------------------------------------------
# Every worker process keeps a map of GPU UUIDs and indexes to rows (hosts.services.
# telemetry_fleet) instead of loading 4,000 GPUs a second. Saving or deleting a GPU (inventory
# refreshes, a host deleted with its GPUs) changes this version in the shared cache, which
# every poller reads once a batch and rebuilds its map on a change.
GPU_MAP_VERSION_KEY = "telemetry:gpu-map-version"


def gpus_changed(**_kwargs) -> None:
    from django.core.cache import cache

    cache.set(GPU_MAP_VERSION_KEY, time.time_ns(), None)


post_save.connect(gpus_changed, sender="hosts.Gpu", dispatch_uid="gpu-map-saved")
post_delete.connect(gpus_changed, sender="hosts.Gpu", dispatch_uid="gpu-map-deleted")
