"""Load for sweeps: a load profile turned into simulator workloads, and a profile or a workload
set to one load (a request rate or a concurrency).

``workloads()`` is what the change advisor predicts a profile with (``changes.advice``
re-exports it); ``sweep_workload``/``with_load`` give the predict phase of a tuning sweep one
template load to move up and down; ``apply_load`` gives the panel the profile document to run a
real benchmark of at one load.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import replace

from benchmarks.loadgen.profile import length_mean, normalize, prompt_tokens
from benchmarks.loadgen.spec import SpecError
from hosts.simulator.predict import Workload

# Requests a prediction simulates per stage: enough for stable p95s, a fraction of a second.
PREDICTION_REQUESTS = 300
# Requests one probe of a sweep simulates. A probe runs ~8 times per point and a sweep has
# hundreds of points, so it is smaller than PREDICTION_REQUESTS: 120 requests still put six
# samples above the p95 (nearest rank) and keep one probe at ~15-25 ms of CPU.
SWEEP_REQUESTS = 120
MODES = ("rate", "concurrency")


def _mean(dist: Mapping) -> int:
    return max(1, round(length_mean(dict(dist))))


def _jitter(dist: Mapping) -> float:
    if dist.get("kind") == "fixed":
        return 0.0
    if dist.get("kind") == "uniform" and dist.get("low") is not None:
        mean = _mean(dist)
        return min(1.0, (dist.get("high", mean) - dist["low"]) / 2 / mean)
    return 0.5  # skewed distributions: a ±50 % spread around the mean stands in for the tail


def workloads(profile: Mapping) -> list[tuple[str, Workload]]:
    """One simulator workload per stage of a load profile (replays use their mean sizes)."""
    doc = normalize(dict(profile))
    # The whole prompt a request sends and its shared part: the profile's prefix comes on
    # top of its input length (vLLM's --random-prefix-len), as the load generator sends it.
    prompt, shared = prompt_tokens(doc)
    replay = doc.get("replay")
    if replay:
        rows = replay.get("rows") or []
        if not rows:
            raise SpecError("the replay has no rows")
        span = (rows[-1][0] - rows[0][0]) or 1.0
        inputs = [r[1] for r in rows]
        outputs = [r[2] for r in rows]
        stage = {
            "name": "replay",
            "request_rate": len(rows) / span,
            "num_requests": len(rows),
        }
        input_dist = {"kind": "empirical", "values": inputs}
        output_dist = {"kind": "empirical", "values": outputs}
        stages = [stage]
    else:
        stages = doc["stages"]
        input_dist, output_dist = doc["input_len"], doc["output_len"]
    out = []
    for stage in stages:
        rate = stage.get("request_rate")
        concurrency = stage.get("concurrency") or stage.get("max_concurrency")
        count = stage.get("num_requests")
        if count is None and stage.get("duration_s"):
            count = (rate or concurrency or 1) * stage["duration_s"]
        count = int(min(PREDICTION_REQUESTS, max(20, count or PREDICTION_REQUESTS)))
        out.append(
            (
                stage["name"],
                Workload(
                    num_requests=count,
                    input_tokens=max(1, round(prompt)),
                    output_tokens=_mean(output_dist),
                    # The spread is the own part's; the shared prefix has none.
                    input_jitter=_jitter(input_dist) * _mean(input_dist) / max(1, round(prompt)),
                    output_jitter=_jitter(output_dist),
                    concurrency=None if rate else int(concurrency or 1),
                    request_rate=float(rate) if rate else None,
                    burstiness=float(stage.get("burstiness") or 1.0),
                    # The simulator gives every request the shared part: the mean per
                    # request keeps the profile's share of prompt tokens that is shared.
                    shared_prefix_tokens=round(shared),
                    num_prefixes=int(doc.get("prefix_groups") or 1),
                    seed=int(doc.get("seed") or 0),
                ),
            )
        )
    return out


def sweep_workload(profile: Mapping, mode: str) -> Workload:
    """The template workload a sweep moves up and down: the profile's main stage.

    The main stage is the one with the most requests (the first of those on a tie): it is
    where a run spends most of its time, so it is the traffic the SLO has to hold under.
    Its own arrival is replaced by the sweep's load; sizes, prefixes and seed are kept, and
    it simulates at most ``SWEEP_REQUESTS`` requests (no warm-up: the simulator has no cold
    caches or graphs to warm, so warm-up requests would only cost time).
    """
    _check_mode(mode)
    stages = [w for _, w in workloads(profile)]
    # max() keeps the first of equals: the earliest stage wins a tie.
    workload = max(stages, key=lambda w: w.num_requests)
    workload = replace(
        workload,
        num_requests=min(workload.num_requests, SWEEP_REQUESTS),
        warmup_requests=0,
    )
    start = workload.request_rate if mode == "rate" else workload.concurrency
    return with_load(workload, mode, start or 1)


def with_load(workload: Workload, mode: str, value: float) -> Workload:
    """``workload`` at one load: open loop at ``value`` requests/s, or ``value`` clients."""
    _check_mode(mode)
    if mode == "rate":
        return replace(workload, request_rate=float(value), concurrency=None)
    return replace(workload, concurrency=max(1, int(value)), request_rate=None)


def apply_load(profile_doc: Mapping, mode: str, value: float) -> dict:
    """The profile document with every stage's arrival set to one load, so a real benchmark
    of the same traffic runs at it (sizes, prefixes, warm-up and request counts kept)."""
    _check_mode(mode)
    doc = copy.deepcopy(dict(profile_doc))
    if doc.get("replay"):
        # A replay's arrivals are the recording: a chosen load would no longer be it.
        raise SpecError("a replay profile plays its recorded arrivals; it cannot run at a set load")
    stages = doc.get("stages") or normalize({})["stages"]
    out = []
    for stage in stages:
        stage = dict(stage)
        if mode == "rate":
            stage["request_rate"] = float(value)
            stage.pop("concurrency", None)
            stage.pop("max_concurrency", None)
        else:
            stage["concurrency"] = max(1, int(value))
            stage.pop("request_rate", None)
            stage.pop("burstiness", None)
        out.append(stage)
    doc["stages"] = out
    return doc


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown load mode {mode!r} (choose from {', '.join(MODES)})")
