"""The predict phase of a tuning sweep: every point of a search space scored with the
simulator's virtual time, then ranked.

For each point the engine's own startup checks run first (a config the engine would refuse is
kept, with the engine's error, so the page can say why it was dropped); the others get the
highest load that still meets the SLO, found by bisection between a light load and a bit above
the config's saturation throughput. The ranking is what the real trials then confirm.

Predictions are deterministic (the workload's seed fixes every arrival and length), so a pool
of processes gives exactly what one process gives, only sooner.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field, fields, replace

from benchmarks.sweep.load import MODES, with_load
from benchmarks.sweep.search import bisect_max_load
from benchmarks.sweep.slo import Slo
from benchmarks.sweep.space import SearchSpace
from hosts.engines import get_spec
from hosts.engines.catalog import GPUS, GpuSpec, UnknownModel, gpu_key, resolve_model
from hosts.simulator.config import StartupError, build_config
from hosts.simulator.predict import Workload, predict

OBJECTIVES = {
    "tps_per_gpu": "max output tokens/s per GPU at SLO",
    "cost_per_million": "min cost per 1M output tokens at SLO",
}
# The bracket of a rate search: the top is the saturation throughput with this headroom (an
# open loop can briefly absorb a little more than a closed one sustains); the bottom is a
# light load, LOW_FRACTION of the top, below which an SLO miss means no load meets it.
SATURATION_HEADROOM = 1.2
LOW_FRACTION = 1 / 16
RATE_REL_TOL = 0.03
MAX_STEPS = 12
# How often, and by how much, the top of a rate bracket grows when it still meets the SLO.
WIDEN_TIMES = 3
WIDEN_FACTOR = 2.0
# A closed-loop probe sends at least this many requests per client (capped below), so it
# measures the steady state rather than one burst of first requests.
REQUESTS_PER_CLIENT = 2
MAX_PROBE_REQUESTS = 1000
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
# Spaces smaller than this are scored in this process.
SERIAL_BELOW = 8
PP_DESTS = ("pipeline_parallel_size", "pp_size")  # none modelled yet; counted when added


class PredictError(ValueError):
    """A sweep the simulator cannot predict (unknown model or GPU, a bad objective)."""


@dataclass
class PointScore:
    """One point of the space as the simulator predicts it (loads, tok/s and latencies in
    wall time of the deployment)."""

    point: dict
    settings: dict
    feasible: bool
    error: str | None = None
    gpus_used: int = 1
    max_load: float | None = None
    numbers: dict = field(default_factory=dict)
    margin: float | None = None
    cost_per_million: float | None = None
    objective: float | None = None
    curve: list[dict] = field(default_factory=list)
    meets_slo: bool = False
    closest: dict | None = None
    # The SLO still held at the highest load tried: the real limit is higher. Typical when the
    # engine admits the probe's requests all at once, so no queue can build.
    limit_above: bool = False
    index: int = 0  # position in the space's order: ties rank by it
    note: str = ""  # how the search ended when it is not a plain limit (missed, unbounded)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> PointScore:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def _error_text(exc: StartupError) -> str:
    return f"{exc.exception}: {exc}"


def _numbers(result: dict, gpus_used: int, time_scale: float) -> dict:
    """The SLO's and the ranking's numbers from a simulator result, in wall time."""
    total = result["completed"] + result["failed"]
    tpot_mean = result["tpot_ms"]["mean"]
    output_tps = result["output_throughput"] / time_scale

    def latency(dist: str, p: str) -> float | None:
        value = result[dist][p]
        return None if value is None else value * time_scale

    return {
        "ttft_p95_ms": latency("ttft_ms", "p95"),
        "ttft_p99_ms": latency("ttft_ms", "p99"),
        "itl_p95_ms": latency("itl_ms", "p95"),
        "tpot_p95_ms": latency("tpot_ms", "p95"),
        "error_rate": result["failed"] / total if total else 1.0,
        "request_rate": result["request_throughput"] / time_scale,
        "output_tps": output_tps,
        "output_tps_per_gpu": output_tps / gpus_used,
        "output_tps_per_user": 1000 / (tpot_mean * time_scale) if tpot_mean else None,
        "kv_capacity_tokens": result["kv_cache_capacity_tokens"],
    }


def _probe_workload(workload: Workload, mode: str, load: float) -> Workload:
    w = with_load(workload, mode, load)
    if mode == "concurrency":
        wanted = min(MAX_PROBE_REQUESTS, REQUESTS_PER_CLIENT * w.concurrency)
        w = replace(w, num_requests=max(w.num_requests, wanted))
    return w


def _resolve_gpu(gpu: str) -> str:
    if gpu in GPUS:
        return gpu
    key = gpu_key(gpu)
    if key is None:
        raise PredictError(
            f"The simulator does not model the GPU {gpu!r} (it models {', '.join(GPUS)})."
        )
    return key


def _check_model(model: str) -> None:
    try:
        resolve_model(model)
    except UnknownModel as exc:
        raise PredictError(f"The simulator does not model this model: {exc}") from None


def score_point(
    engine: str,
    model: str,
    settings: Mapping,
    gpu: str | GpuSpec,
    num_gpus: int,
    workload: Workload,
    mode: str,
    slo: Slo,
    *,
    price_per_gpu_hour: float | None = None,
    time_scale: float = 1.0,
    objective: str = "tps_per_gpu",
    point: Mapping | None = None,
    index: int = 0,
) -> PointScore:
    """The highest load at which ``settings`` meet ``slo``, and the numbers there.

    ``time_scale`` < 1: the deployment is a simulator running that many times real time; the
    search runs in its virtual time against ``slo.scaled(time_scale)`` and everything is
    reported in wall time (rates ÷ time_scale, latencies × time_scale), as it will measure.
    """
    if mode not in MODES:
        raise PredictError(f"unknown load mode {mode!r} (choose from {', '.join(MODES)})")
    gpu_spec = gpu if isinstance(gpu, GpuSpec) else GPUS[_resolve_gpu(gpu)]
    _check_model(model)
    settings = dict(settings)
    score = PointScore(
        point=dict(settings if point is None else point), settings=settings, feasible=True
    )
    score.index = index
    try:
        cfg = build_config(engine, model, settings, gpu_spec, num_gpus)
    except StartupError as exc:
        score.feasible, score.error = False, _error_text(exc)
        return score
    pp = next((cfg.settings[d] for d in PP_DESTS if d in cfg.settings), 1)
    score.gpus_used = cfg.tp * pp
    if score.gpus_used > num_gpus:
        score.feasible = False
        score.error = (
            "ValueError: The number of required GPUs exceeds the total number of available "
            f"GPUs in the placement group: {score.gpus_used} > {num_gpus} GPU(s) on this host."
        )
        return score

    cache: dict[float, dict] = {}

    def measure(load: float) -> dict:
        # Deterministic, so a load searched twice (a widened bracket) is simulated once.
        if load not in cache:
            w = _probe_workload(workload, mode, load)
            result = predict(engine, model, settings, gpu_spec, w, num_gpus)
            # Virtual time throughout: the scaled SLO judges it.
            cache[load] = _numbers(result, score.gpus_used, 1.0)
        return cache[load]

    vslo = slo.scaled(time_scale)
    if mode == "rate":
        saturation = predict(
            engine,
            model,
            settings,
            gpu_spec,
            replace(workload, request_rate=None, concurrency=max(cfg.max_num_seqs, 1)),
            num_gpus,
        )
        high = max(saturation["request_throughput"], 1e-3) * SATURATION_HEADROOM
        low = high * LOW_FRACTION
        search = bisect_max_load(
            measure, vslo, low=low, high=high, rel_tol=RATE_REL_TOL, max_steps=MAX_STEPS
        )
        probes = {p.load: p for p in search.probes}
        # A short closed-loop run drains a tail at low concurrency, so with a large batch it
        # can underrate what an open loop of the same requests absorbs: widen while the top
        # still meets the SLO (the previous top is cached, so it costs no simulation).
        for _ in range(WIDEN_TIMES):
            if search.best is None or search.best.load < high:
                break
            low, high = high, high * WIDEN_FACTOR
            search = bisect_max_load(
                measure, vslo, low=low, high=high, rel_tol=RATE_REL_TOL, max_steps=MAX_STEPS
            )
            probes.update({p.load: p for p in search.probes})
        all_probes = list(probes.values())
    else:
        high = max(2 * cfg.max_num_seqs, 1)
        search = bisect_max_load(
            measure,
            vslo,
            low=1,
            high=high,
            integer=True,
            rel_tol=RATE_REL_TOL,
            max_steps=MAX_STEPS,
        )
        all_probes = search.probes

    def wall_load(load: float) -> float:
        return load / time_scale if mode == "rate" else load

    def wall(numbers: dict) -> dict:
        if time_scale == 1.0:
            return dict(numbers)
        out = dict(numbers)
        for key in ("ttft_p95_ms", "ttft_p99_ms", "itl_p95_ms", "tpot_p95_ms"):
            if out[key] is not None:
                out[key] *= time_scale
        for key in ("request_rate", "output_tps", "output_tps_per_gpu"):
            out[key] /= time_scale
        if out["output_tps_per_user"] is not None:
            out["output_tps_per_user"] /= time_scale
        return out

    score.curve = [
        {
            "load": wall_load(p.load),
            "ttft_p95_ms": n["ttft_p95_ms"],
            "itl_p95_ms": n["itl_p95_ms"],
            "output_tps_per_gpu": n["output_tps_per_gpu"],
            "output_tps_per_user": n["output_tps_per_user"],
            "ok": p.ok,
        }
        for p in sorted(all_probes, key=lambda p: p.load)
        for n in (wall(p.numbers),)
    ]
    best = search.best
    if best is None:
        lowest = min(all_probes, key=lambda p: p.load)
        score.margin = lowest.margin
        score.closest = {
            "load": wall_load(lowest.load),
            "numbers": wall(lowest.numbers),
            "violations": list(lowest.violations),
            "margin": lowest.margin,
        }
        margin = "" if lowest.margin is None else f" (margin {lowest.margin * 100:+.0f} %)"
        score.note = f"predicted to miss the SLO at every load tried{margin}"
        return score
    score.meets_slo = True
    score.limit_above = best.load >= high
    if score.limit_above:
        score.note = "the SLO held at the highest load tried: the limit is above it"
    score.max_load = wall_load(best.load)
    score.numbers = wall(best.numbers)
    score.margin = best.margin
    tps = score.numbers["output_tps"]
    if price_per_gpu_hour is not None and tps > 0:
        score.cost_per_million = price_per_gpu_hour * score.gpus_used / (tps * 3600) * 1e6
    score.objective = (
        score.numbers["output_tps_per_gpu"]
        if objective == "tps_per_gpu"
        else score.cost_per_million
    )
    return score


@dataclass
class Prediction:
    """A scored space: every point, ranked (meeting the SLO by objective, then the other
    feasible points by margin, then the infeasible ones), and what the page summarises."""

    engine: str
    model: str
    gpu: str
    num_gpus: int
    mode: str
    objective: str
    slo: dict
    space: dict
    base_settings: dict
    workload: dict
    time_scale: float
    price_per_gpu_hour: float | None
    points: list[PointScore]
    elapsed_s: float = 0.0
    workers: int = 1

    @property
    def counts(self) -> dict:
        return {
            "total": len(self.points),
            "feasible": sum(p.feasible for p in self.points),
            "meeting": sum(p.meets_slo for p in self.points),
        }

    @property
    def infeasible(self) -> list[dict]:
        """``[{"error", "count", "points"}]``, the most common error first. Errors that
        differ only in their numbers (the memory each config lacks) are one group, shown by
        its first example."""
        groups: dict[str, tuple[str, list[dict]]] = {}
        for p in self.points:
            if not p.feasible:
                error = p.error or ""
                groups.setdefault(_NUMBER.sub("#", error), (error, []))[1].append(p.point)
        return [
            {"error": error, "count": len(points), "points": points}
            for error, points in sorted(groups.values(), key=lambda g: -len(g[1]))
        ]

    @property
    def no_point_meets(self) -> bool:
        return not any(p.meets_slo for p in self.points)

    @property
    def closest(self) -> PointScore | None:
        """When no point meets the SLO, the feasible one that misses it by least."""
        if not self.no_point_meets:
            return None
        return next((p for p in self.points if p.feasible), None)

    def ranked(self) -> list[PointScore]:
        return [p for p in self.points if p.meets_slo]

    @property
    def best(self) -> PointScore | None:
        return next(iter(self.ranked()), None)

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "points"}
        data["points"] = [p.to_dict() for p in self.points]
        data["counts"] = self.counts
        data["infeasible"] = self.infeasible
        data["no_point_meets"] = self.no_point_meets
        closest = self.closest
        data["closest"] = None if closest is None else closest.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> Prediction:
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names and k != "points"}
        return cls(points=[PointScore.from_dict(p) for p in data["points"]], **kwargs)


def rank(points: list[PointScore], objective: str) -> list[PointScore]:
    """Meeting points by objective (best first), then feasible ones by margin, then the
    infeasible; ties by higher max load, then by position in the space."""
    sign = 1 if objective == "cost_per_million" else -1

    def key(p: PointScore) -> tuple:
        if p.meets_slo:
            value = float("inf") if p.objective is None else sign * p.objective
            return (0, value, -(p.max_load or 0), p.index)
        if p.feasible:
            margin = float("-inf") if p.margin is None else p.margin
            return (1, -margin, 0, p.index)
        return (2, 0, 0, p.index)

    return sorted(points, key=key)


def _score_task(kwargs: dict) -> PointScore:
    return score_point(**kwargs)


def predict_space(
    engine: str,
    model: str,
    base_settings: Mapping,
    space: SearchSpace,
    gpu: str,
    num_gpus: int,
    workload: Workload,
    mode: str,
    slo: Slo,
    objective: str,
    *,
    price_per_gpu_hour: float | None = None,
    time_scale: float = 1.0,
    workers: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> Prediction:
    """Score every point of ``space`` (base settings updated with the point) and rank them."""
    started = time.perf_counter()
    try:
        get_spec(engine)
    except ValueError as exc:
        raise PredictError(str(exc)) from None
    _check_model(model)
    gpu = _resolve_gpu(gpu)
    if objective not in OBJECTIVES:
        raise PredictError(f"unknown objective {objective!r} (choose from {', '.join(OBJECTIVES)})")
    if mode not in MODES:
        raise PredictError(f"unknown load mode {mode!r} (choose from {', '.join(MODES)})")
    if objective == "cost_per_million" and price_per_gpu_hour is None:
        raise PredictError(
            "the cost_per_million objective needs a price per GPU-hour (set one for the GPU)"
        )
    if price_per_gpu_hour is not None and not price_per_gpu_hour > 0:
        raise PredictError(f"the price per GPU-hour must be above 0, got {price_per_gpu_hour!r}")
    if not time_scale > 0:
        raise PredictError(f"time_scale must be above 0, got {time_scale!r}")
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        raise PredictError(f"num_gpus must be a positive integer, got {num_gpus!r}")
    tasks = [
        {
            "engine": engine,
            "model": model,
            "settings": {**dict(base_settings), **point},
            "gpu": gpu,
            "num_gpus": num_gpus,
            "workload": workload,
            "mode": mode,
            "slo": slo,
            "price_per_gpu_hour": price_per_gpu_hour,
            "time_scale": time_scale,
            "objective": objective,
            "point": point,
            "index": i,
        }
        for i, point in enumerate(space.points())
    ]
    workers = (os.cpu_count() or 1) if workers is None else max(1, workers)
    workers = min(workers, len(tasks)) or 1
    if len(tasks) < SERIAL_BELOW:
        workers = 1  # starting processes costs more than a few points take
    scores, used = _run(tasks, workers, on_progress)
    return Prediction(
        engine=engine,
        model=model,
        gpu=gpu,
        num_gpus=num_gpus,
        mode=mode,
        objective=objective,
        slo=slo.to_dict(),
        space=space.to_dict(),
        base_settings=dict(base_settings),
        workload=asdict(workload),
        time_scale=time_scale,
        price_per_gpu_hour=price_per_gpu_hour,
        points=rank(scores, objective),
        elapsed_s=time.perf_counter() - started,
        workers=used,
    )


def _run(
    tasks: list[dict], workers: int, on_progress: Callable[[int, int], None] | None
) -> tuple[list[PointScore], int]:
    """Scores in task order, from a process pool when one can start, else in this process."""
    results: dict[int, PointScore] = {}
    total = len(tasks)

    def done(i: int, score: PointScore) -> None:
        results[i] = score
        if on_progress is not None:
            on_progress(len(results), total)

    used = 1
    if workers > 1:
        try:
            # forkserver, not fork: the caller may be a threaded server (the embedded panel
            # runs its worker in threads beside the web server), and a forked child of a
            # threaded process can inherit a lock some other thread held.
            context = multiprocessing.get_context("forkserver")
            with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
                # Submitting starts the processes: inside a daemonic process (a Celery prefork
                # child) that raises AssertionError, elsewhere OSError when none may start.
                futures = {pool.submit(_score_task, t): i for i, t in enumerate(tasks)}
                used = workers
                for future in as_completed(futures):
                    done(futures[future], future.result())
        except (AssertionError, OSError, BrokenProcessPool, NotImplementedError, PermissionError):
            used = 1  # the points the pool did not score are scored here, identically
    for i, task in enumerate(tasks):
        if i not in results:
            done(i, _score_task(task))
    return [results[i] for i in range(total)], used


def candidates(
    prediction: Prediction, k: int, control_settings: Mapping | None = None
) -> list[PointScore]:
    """The ``k`` best distinct points to try for real, without the control (the caller adds
    it). When fewer than ``k`` meet the SLO, the feasible ones that miss it by least fill
    in: their ``meets_slo`` is False and their ``note`` says so. The items are the
    prediction's own PointScore objects, not copies."""
    spec = get_spec(prediction.engine)

    def clean(settings: Mapping) -> tuple:
        values, _ = spec.validate(dict(settings))
        return tuple(sorted(values.items()))

    seen = set()
    if control_settings is not None:
        seen.add(clean(control_settings))
    picked: list[PointScore] = []
    for p in prediction.points:
        if len(picked) >= k or not p.feasible:
            break
        key = clean(p.settings)
        if key in seen:
            continue
        seen.add(key)
        picked.append(p)
    return picked


def pareto_front(items: list, x: str, y: str) -> list[int]:
    """Indices of the items no other item beats on both ``x`` and ``y`` (both maximised);
    items are mappings or objects, and those missing a number are left out."""

    def get(item, key):
        value = item.get(key) if isinstance(item, Mapping) else getattr(item, key, None)
        return None if value is None or isinstance(value, bool) else float(value)

    pairs = [(i, get(item, x), get(item, y)) for i, item in enumerate(items)]
    pairs = [(i, a, b) for i, a, b in pairs if a is not None and b is not None]
    front = []
    for i, a, b in pairs:
        dominated = any(
            (a2 >= a and b2 >= b) and (a2 > a or b2 > b) for j, a2, b2 in pairs if j != i
        )
        if not dominated:
            front.append(i)
    return front
