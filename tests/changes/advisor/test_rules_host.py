"""The rules on the machine (changes/advisor/rules_host.py), each both ways."""

from __future__ import annotations

from dataclasses import replace

import pytest

from changes.advisor.findings import CRITICAL, WARNING
from tests.changes.advisor import builders as b
from tests.changes.advisor.builders import none, one


# --- gpu-throttled -----------------------------------------------------------------------------
def throttled(events, util=95.0):
    s = b.with_gpus(b.healthy(), utilization_pct=util, clock_events=events)
    return b.with_gpus(s, sm_clock_mhz=1410.0, power_w=699.0, temperature_c=71.0)


def test_gpu_throttled_by_power():
    f = one(throttled({"SwPowerCap": 0.4, "Idle": 0.05}), "gpu-throttled")
    assert f.severity == WARNING and not f.suggestion.settings
    assert "GPU 0 at 95 % busy: software power cap 40 % of the time" in f.seen
    assert "SM clock 1410 of 1980 MHz" in f.seen and "power 699 of 700 W" in f.seen
    assert "over the last 5 min of telemetry" in f.seen
    assert "power limit" in f.suggestion.action
    assert f.evidence["gpus"][0]["reasons"] == {"swpowercap": 0.4}


def test_gpu_throttled_by_heat_names_cooling():
    f = one(throttled({"hw_thermal_slowdown": 0.2}), "gpu-throttled")
    assert "hardware thermal slowdown 20 %" in f.seen and "cooling" in f.suggestion.action
    assert "(heat)" in f.title


@pytest.mark.parametrize(
    "s",
    [
        throttled({"SwPowerCap": 0.09}),  # a blip
        throttled({"SwPowerCap": 0.5}, util=49.0),  # idle-ish: costs nothing
        throttled({"Idle": 0.9, "ApplicationsClocksSetting": 1.0}),  # not throttling
        throttled({"SwPowerCap": 0.5}, util=None),  # utilisation unknown
        throttled({}),
        b.with_gpus(throttled({"SwPowerCap": 0.5}), sm_clock_mhz=1790.0),  # 90.4 % of max
    ],
)
def test_gpu_throttled_near_misses_and_missing(s):
    assert none(s, "gpu-throttled")


# --- cpu-bound ---------------------------------------------------------------------------------
def starved(load=96.0, util=65.0, waiting=8.0, queue_ms=400.0, cpu_pct=60.0):
    s = b.with_gpus(b.healthy(), utilization_pct=util)
    s = b.with_live(s, waiting_mean=0.7, waiting_max=waiting, queue_ms=queue_ms)
    return b.with_host(s, load_1m=load, cpu_util_pct=cpu_pct)


def test_cpu_bound():
    f = one(starved(), "cpu-bound")
    assert f.severity == WARNING and "dedicated" in f.suggestion.action
    assert "GPU utilisation averaged 65 % while up to 8 requests waited" in f.seen
    assert "over the last 60 s (live)" in f.seen
    assert "load 96.0 on 64 CPUs (1.5 per CPU)" in f.seen and "16 CPUs" in f.seen


def test_cpu_bound_by_utilisation_and_critical_queue():
    f = one(starved(load=10.0, cpu_pct=95.0, queue_ms=1500.0), "cpu-bound")
    assert f.severity == CRITICAL and "CPU 95 % busy" in f.seen


@pytest.mark.parametrize(
    "s",
    [
        starved(load=63.0),  # under one task per CPU
        starved(util=75.0),  # the GPU is working
        starved(waiting=0),  # nothing waited
        replace(starved(), host=None),
        b.with_live(starved(), source="run 12"),  # a run's window, not now
        b.with_gpus(starved(), utilization_pct=None),
    ],
)
def test_cpu_bound_near_misses_and_missing(s):
    assert none(s, "cpu-bound")


# --- numa-mismatch -----------------------------------------------------------------------------
def off_node(cpus=tuple(range(32, 48))):
    return b.with_config(b.healthy(), cpus=cpus, numa_node=1)


def test_numa_mismatch_by_cpus():
    f = one(off_node(), "numa-mismatch")
    assert f.severity == WARNING and not f.suggestion.settings
    assert "NUMA node 0; 0 % of the engine's 16 CPUs are on that node" in f.seen
    assert "node 0 (CPUs 0-31)" in f.suggestion.action
    assert f.evidence["local_share"] == 0.0


def test_numa_mismatch_by_node_and_with_the_load_it_causes():
    s = b.with_host(b.with_config(b.healthy(), cpus=None, numa_node=1), numa_cpus={})
    s = b.with_live(b.with_gpus(s, utilization_pct=25.0), waiting_max=5)
    f = one(s, "numa-mismatch")
    assert "pinned to node 1, not that node" in f.seen
    assert (
        "GPU utilisation averaged 25 % while up to 5 requests waited over the last 60 s" in f.seen
    )


@pytest.mark.parametrize(
    "s",
    [
        off_node(tuple(range(0, 8)) + tuple(range(32, 40))),  # half local
        b.with_gpus(off_node(), numa_node=None),  # where the GPU hangs unknown
        b.with_config(b.with_host(off_node(), numa_cpus={}), cpus=None, numa_node=None),
    ],
)
def test_numa_mismatch_near_misses_and_missing(s):
    assert none(s, "numa-mismatch")
