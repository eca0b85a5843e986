"""Where each deployment stands for scaling: live signals, a replica's capacity at the SLO,
the desired replicas for its group, and the policy they were judged by.

``fleet_states()`` runs on every scrape of the panel's ``/metrics``, so it reads the whole
fleet in a fixed number of queries (about ten, whatever its size) and judges in Python.

Capacity evidence is the deployment's own finished benchmarks on the settings it runs NOW:
configs are compared by their settings and pinned model, not by version id (a rollback
creates a new version with equal settings, and the runs of the old one still hold). Only one
load profile's runs count (the policy's, else the newest run's), each stage a load level.
The engine gauges of a stage are the run's per-second points tagged with that stage's name
(the load generator stamps every point with the stage it was in), so the boundaries are the
load generator's own; a stage's first seconds still carry the previous stage's queue, which
the mean over the stage dilutes rather than hides.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.db.models import Max, Q
from django.utils import timezone

from benchmarks.evidence import usable_as_evidence
from benchmarks.models import BenchmarkRun, RunPoint
from changes.choices import TrialState
from changes.models_sweeps import SweepTrial
from controlpanel.choices import OperationStatus
from hosts.choices import DeploymentStatus
from hosts.models import Deployment, EngineConfig
from scaling.models import EngineSample
from scaling.planning.capacity import capacity_at_slo
from scaling.planning.policy import decide, hold_seconds, raw_desired
from scaling.planning.types import SLO, Capacity, Decision, LoadPoint, PolicyConfig, Signals
from scaling.services.startup import GUESS_SECONDS, engine_starts

# Signals older than this are not the engine's present: the poller stopped or cannot reach it.
STALE_S = 15.0
# The hold window's history (policy.hold_seconds) is judged at this spacing, not every sample.
HISTORY_STEP_S = 15.0
# The newest runs of the chosen profile that count as evidence (older ones add little and
# cost a scrape their points).
MAX_RUNS = 20
# Engine starts read for the whole fleet at once (the newest first).


@dataclass
class ScalingState:
    """One deployment's scaling picture, as the API, the pages and ``/metrics`` show it."""

    deployment_id: int
    deployment: str
    host_id: int
    host: str
    model: str
    engine: str
    status: str
    signals: Signals | None
    signals_age_s: float | None
    signals_note: str
    capacity: Capacity
    decision: Decision
    policy: PolicyConfig
    slo: SLO
    policy_saved: bool
    group: list[int] = field(default_factory=list)
    profile_id: int | None = None
    profile: str = ""
    engine_start_s: float = GUESS_SECONDS
    engine_start_basis: str = ""
    evidence_points: int = 0
    # Runs left out of the capacity evidence, in words ("run #12 is client-limited: …").
    # Runs of the chosen profile refused as evidence: (run id, why), newest first.
    refused_runs: list[tuple[int, str]] = field(default_factory=list)

    @property
    def thresholds(self):
        return self.decision.thresholds

    def as_dict(self) -> dict:
        return {
            "deployment_id": self.deployment_id,
            "deployment": self.deployment,
            "host_id": self.host_id,
            "host": self.host,
            "model": self.model,
            "engine": self.engine,
            "status": self.status,
            "signals": self.signals.as_dict() if self.signals else None,
            "signals_age_s": self.signals_age_s,
            "signals_note": self.signals_note,
            "capacity": self.capacity.as_dict(),
            "decision": self.decision.as_dict(),
            "policy": self.policy.as_dict(),
            "slo": self.slo.as_dict(),
            "policy_saved": self.policy_saved,
            "group": list(self.group),
            "profile_id": self.profile_id,
            "profile": self.profile,
            "engine_start_s": self.engine_start_s,
            "engine_start_basis": self.engine_start_basis,
            "evidence_points": self.evidence_points,
            "refused_runs": [{"run_id": pk, "reason": why} for pk, why in self.refused_runs],
        }


def scaling_state(deployment: Deployment) -> ScalingState:
    """``deployment``'s state (its replica group read along with it)."""
    scope = Q(pk=deployment.pk) | Q(model=deployment.model, engine=deployment.engine)
    states = _states(Deployment.objects.filter(scope))
    return next(s for s in states if s.deployment_id == deployment.pk)


def fleet_states() -> list[ScalingState]:
    """Every deployment's state, in a bounded number of queries."""
    return _states(Deployment.objects.all())


# --- reading ------------------------------------------------------------------------------------
def _states(deployments) -> list[ScalingState]:
    now = timezone.now()
    rows = list(
        deployments.select_related(
            "host", "active_config", "scaling_policy__load_profile"
        ).order_by("host__name", "name")
    )
    if not rows:
        return []
    ids = [d.pk for d in rows]
    policies = {d.pk: _policy(d) for d in rows}
    groups = _groups(rows)
    starts = engine_starts(rows)
    # The hold window of a scale-down (policy.hold_seconds) reaches back this far at most;
    # samples are not kept longer than their retention anyway.
    hold = max(
        hold_seconds(PolicyConfig(stabilisation_s=p.stabilisation_s, engine_start_s=starts[pk][0]))
        for pk, (p, _) in policies.items()
    )
    window = min(hold, settings.SCALING_SAMPLE_RETENTION_MINUTES * 60) + STALE_S
    newest, history = _samples(ids, now, window)
    points = _evidence(rows, policies)
    states = []
    for d in rows:
        config, slo = policies[d.pk]
        start_s, start_basis = starts[d.pk]
        config = PolicyConfig(**{**config.as_dict(), "engine_start_s": start_s})
        profile_id, profile_name, load_points, refused = points[d.pk]
        capacity = capacity_at_slo(load_points, slo)
        signals, age, note = _fresh(newest.get(d.pk), now)
        group = groups.get((d.model, d.engine), [])
        current = len(group)
        fresh_group = [s for pk in group if (s := _fresh(newest.get(pk), now)[0]) is not None]
        if d.pk not in group and signals is not None:
            fresh_group.append(signals)  # a deployment that is not running counts its own load
        recent = _recent_raw(group, history, capacity, current, config, now)
        decision = decide(fresh_group, capacity, current, config, recent)
        states.append(
            ScalingState(
                deployment_id=d.pk,
                deployment=d.name,
                host_id=d.host_id,
                host=d.host.name,
                model=d.model,
                engine=d.engine,
                status=d.status,
                signals=signals,
                signals_age_s=age,
                signals_note=note,
                capacity=capacity,
                decision=decision,
                policy=config,
                slo=slo,
                policy_saved=_saved_policy(d) is not None,
                group=list(group),
                profile_id=profile_id,
                profile=profile_name,
                engine_start_s=start_s,
                engine_start_basis=start_basis,
                evidence_points=len(load_points),
                refused_runs=refused,
            )
        )
    return states


def _saved_policy(deployment: Deployment):
    try:
        return deployment.scaling_policy
    except Deployment.scaling_policy.RelatedObjectDoesNotExist:
        return None


def _policy(deployment: Deployment) -> tuple[PolicyConfig, SLO]:
    row = _saved_policy(deployment)
    if row is None:
        return PolicyConfig(), SLO(ttft_p95_ms=float(settings.SCALING_SLO_TTFT_P95_MS))
    config = PolicyConfig(
        min_replicas=row.min_replicas,
        max_replicas=row.max_replicas,
        target=row.target,
        stabilisation_s=float(row.stabilisation_s),
        cooldown_s=float(row.cooldown_s),
        polling_interval_s=float(row.polling_interval_s),
    )
    slo = SLO(
        ttft_p95_ms=row.slo_ttft_p95_ms,
        itl_p95_ms=row.slo_itl_p95_ms,
        max_error_rate=row.max_error_rate,
    )
    return config, slo


def _groups(rows: list[Deployment]) -> dict[tuple[str, str], list[int]]:
    """Running deployments by (model, engine): the replica groups."""
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for d in rows:
        if d.status == DeploymentStatus.RUNNING:
            groups[(d.model, d.engine)].append(d.pk)
    return groups


def _samples(ids: list[int], now, window_s: float):
    """The newest sample per deployment (time, signals) and, for the hold window,
    one sample every ``HISTORY_STEP_S`` per deployment: three queries (the times are read
    first, the signals only of the samples picked)."""
    newest_at = dict(
        EngineSample.objects.filter(deployment_id__in=ids)
        .values("deployment_id")
        .annotate(at=Max("time"))
        .values_list("deployment_id", "at")
    )
    since = now - timedelta(seconds=window_s)
    picked: dict[int, tuple[int, object]] = {}
    last: dict[int, object] = {}
    newest_id: dict[int, int] = {}
    for pk, dep, at in (
        EngineSample.objects.filter(deployment_id__in=ids, time__gte=since)
        .order_by("deployment_id", "-time")
        .values_list("pk", "deployment_id", "time")
    ):
        if dep not in newest_id:
            newest_id[dep] = pk
        if dep in last and (last[dep] - at).total_seconds() < HISTORY_STEP_S:
            continue
        last[dep] = at
        picked[pk] = (dep, at)
    signals = dict(
        EngineSample.objects.filter(pk__in=list(picked)).values_list("pk", "signals")
        if picked
        else []
    )
    newest = {}
    for dep, at in newest_at.items():
        pk = newest_id.get(dep)
        newest[dep] = (at, signals.get(pk) if pk is not None else None)
    history: dict[int, list[tuple[object, dict]]] = defaultdict(list)
    for pk, (dep, at) in picked.items():
        history[dep].append((at, signals.get(pk) or {}))
    return newest, history


def _fresh(newest, now) -> tuple[Signals | None, float | None, str]:
    if newest is None:
        return None, None, "no signals yet: the panel has not read this engine's /metrics"
    at, data = newest
    age = max(0.0, (now - at).total_seconds())
    if age > STALE_S or not data:
        return (
            None,
            age,
            f"signals are {age:.0f} s old (over {STALE_S:.0f} s): the engine's /metrics is "
            "not being read, so they are not used",
        )
    return Signals.from_dict(data), age, ""


def _recent_raw(group, history, capacity, current, config, now) -> list[int]:
    """Raw desired replicas at every ``HISTORY_STEP_S`` of the hold window, from
    each group member's sample nearest before that moment."""
    if not group or not capacity.rps:
        return []
    out = []
    steps = int(hold_seconds(config) // HISTORY_STEP_S)
    for k in range(1, steps + 1):
        moment = now - timedelta(seconds=k * HISTORY_STEP_S)
        signals = []
        for pk in group:
            for at, data in history.get(pk, []):  # newest first
                if at <= moment and (moment - at).total_seconds() <= STALE_S:
                    signals.append(Signals.from_dict(data))
                    break
        raw = raw_desired(signals, capacity, current, config) if signals else None
        if raw is not None:
            out.append(raw)
    return out


# --- capacity evidence --------------------------------------------------------------------------
def _config_key(settings_: dict, model: str) -> str:
    return json.dumps([settings_ or {}, model], sort_keys=True, default=str)


def _evidence(rows: list[Deployment], policies) -> dict[int, tuple[int | None, str, list, list]]:
    """Per deployment: (profile id, profile name, load points, refused runs in words) from its
    runs and sweep trials on the running config; a client-limited run
    (``benchmarks.evidence``) is no load point."""
    out: dict[int, tuple[int | None, str, list, list]] = {d.pk: (None, "", [], []) for d in rows}
    running = {
        d.pk: _config_key(d.active_config.settings, d.active_config.model or d.model)
        for d in rows
        if d.active_config is not None
    }
    if not running:
        return out
    models = {d.pk: d.model for d in rows}
    same = [
        pk
        for pk, dep, settings_, model in EngineConfig.objects.filter(
            deployment_id__in=list(running)
        ).values_list("pk", "deployment_id", "settings", "model")
        if _config_key(settings_, model or models[dep]) == running[dep]
    ]
    # Every succeeded run on the running configs, newest first, as (pk, deployment,
    # profile) only: the history grows without bound, and only MAX_RUNS per deployment are
    # read whole below (their stages and profile spec are JSON worth decoding once).
    runs = list(
        BenchmarkRun.objects.filter(
            deployment_id__in=list(running),
            engine_config_id__in=same,
            status=OperationStatus.SUCCEEDED,
            load_profile__isnull=False,
        )
        .order_by("-finished_at", "-pk")
        .values_list(
            "pk",
            "deployment_id",
            "load_profile_id",
            "load_profile__name",
            "load_profile__version",
            "client_health",
        )
    )
    refusals = {r[0]: usable_as_evidence(r[5]).refusal for r in runs}
    trials = _trials(list(running), running, models)
    profiles: dict[int, tuple[int, str]] = {}
    for d in rows:
        if d.pk not in running:
            continue
        saved = _saved_policy(d)
        mine = [r for r in runs if r[1] == d.pk]
        # The policy's profile, else the newest run's, else the newest sweep trial's.
        profile = saved.load_profile if saved is not None and saved.load_profile_id else None
        if profile is None and not mine and trials.get(d.pk):
            profile = trials[d.pk][0].sweep.load_profile
        if profile is not None:
            profiles[d.pk] = (profile.pk, f"{profile.name} v{profile.version}")
        elif mine:
            profiles[d.pk] = (mine[0][2], f"{mine[0][3]} v{mine[0][4]}")
    chosen_ids = {
        pk: [r[0] for r in runs if r[1] == pk and r[2] == profile_id and not refusals[r[0]]][
            :MAX_RUNS
        ]
        for pk, (profile_id, _) in profiles.items()
    }
    refused = {
        pk: [
            (r[0], refusals[r[0]])
            for r in runs
            if r[1] == pk and r[2] == profile_id and refusals[r[0]]
        ][:MAX_RUNS]
        for pk, (profile_id, _) in profiles.items()
    }
    whole = BenchmarkRun.objects.select_related("load_profile").only(
        "pk",
        "label",
        "deployment",
        "engine_config",
        "load_profile",
        "load_override",
        "stages",
        "finished_at",
        "created_at",
        "load_profile__name",
        "load_profile__version",
        "load_profile__spec",
    )
    by_pk = whole.in_bulk([pk for ids in chosen_ids.values() for pk in ids])
    chosen = {pk: [by_pk[i] for i in ids if i in by_pk] for pk, ids in chosen_ids.items()}
    gauges = _stage_gauges([r for rs in chosen.values() for r in rs])
    for pk, (profile_id, name) in profiles.items():
        points = []
        for run in chosen.get(pk, []):
            points.extend(_run_points(run, gauges.get(run.pk, {})))
        used = {r.pk for r in chosen.get(pk, [])}
        for trial in trials.get(pk, []):
            if trial.sweep.load_profile_id == profile_id:
                point = _trial_point(trial, used)
                if point is not None:
                    points.append(point)
        out[pk] = (profile_id, name, points, refused.get(pk, []))
    return out


def _trials(dep_ids, running, models) -> dict[int, list[SweepTrial]]:
    """Measured sweep trials on each deployment (its lane's, else the sweep's) whose settings
    are the running ones. The sweep's own SLO is not required to equal the policy's: the
    trial's numbers at its max load are judged against the policy's SLO like any level (a
    looser sweep's limit then counts as a breaking level, not as capacity)."""
    found = (
        SweepTrial.objects.filter(
            Q(lane__deployment_id__in=dep_ids)
            | Q(lane__isnull=True, sweep__deployment_id__in=dep_ids),
            state=TrialState.SUCCEEDED,
            max_load__isnull=False,
        )
        .select_related("sweep__load_profile", "config", "lane")
        .order_by("-finished_at", "-pk")
    )
    out: dict[int, list[SweepTrial]] = defaultdict(list)
    for trial in found:
        dep = trial.lane.deployment_id if trial.lane is not None else trial.sweep.deployment_id
        model = (trial.config.model if trial.config is not None else "") or models[dep]
        if _config_key(trial.settings, model) == running.get(dep):
            out[dep].append(trial)
    return out


# A finished run's points never change, so its gauges are worked out once and kept; the page
# then reads a few cached dicts instead of decoding every second of up to MAX_RUNS runs per
# deployment on each request. The key holds the run's finish time beside its pk, so a
# database rebuilt under a kept cache (pks reused) cannot read another run's gauges.
GAUGES_TTL_S = 24 * 3600


def _gauges_key(run: BenchmarkRun) -> str:
    finished = run.finished_at.timestamp() if run.finished_at else ""
    return f"scaling:stage-gauges:v1:{run.pk}:{finished}"


def _stage_gauges(runs: list[BenchmarkRun]) -> dict[int, dict[str, dict]]:
    """Per run and stage: mean/max requests waiting, mean running, max KV use over the
    run's per-second points (succeeded runs only: from the cache, else one query)."""
    keys = {run.pk: _gauges_key(run) for run in runs}
    cached = cache.get_many(list(keys.values()))
    out = {pk: cached[key] for pk, key in keys.items() if key in cached}
    missing = [pk for pk in keys if pk not in out]
    if missing:
        fresh = _gauges_from_points(missing)
        out.update({pk: fresh.get(pk, {}) for pk in missing})
        cache.set_many({keys[pk]: out[pk] for pk in missing}, timeout=GAUGES_TTL_S)
    return {pk: gauges for pk, gauges in out.items() if gauges}


def _gauges_from_points(run_ids: list[int]) -> dict[int, dict[str, dict]]:
    raw: dict[int, dict[str, dict[str, list]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for run_id, data in RunPoint.objects.filter(run_id__in=run_ids).values_list("run_id", "data"):
        stage = (data or {}).get("stage")
        if not stage:
            continue
        for key in ("server_waiting", "server_running", "kv_cache_usage"):
            value = data.get(key)
            if isinstance(value, int | float) and math.isfinite(value):
                raw[run_id][stage][key].append(float(value))
    out: dict[int, dict[str, dict]] = {}
    for run_id, stages in raw.items():
        out[run_id] = {}
        for stage, values in stages.items():
            waiting = values.get("server_waiting") or []
            running = values.get("server_running") or []
            kv = values.get("kv_cache_usage") or []
            out[run_id][stage] = {
                "waiting_mean": statistics.fmean(waiting) if waiting else None,
                "waiting_max": max(waiting) if waiting else None,
                "running_mean": statistics.fmean(running) if running else None,
                "kv_usage_max": max(kv) if kv else None,
            }
    return out


def _num(data: dict, key: str) -> float | None:
    value = data.get(key)
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def _run_points(run: BenchmarkRun, gauges: dict[str, dict]) -> list[LoadPoint]:
    """One load level per measured stage of ``run``; its offered load from the profile as
    run (at the sweep's overridden load, if any)."""
    spec_stages = {
        s.get("name"): s for s in (run.profile_spec.get("stages") or []) if isinstance(s, dict)
    }
    out = []
    for name, summary in (run.stages or {}).items():
        if name == "warmup" or not isinstance(summary, dict):
            continue
        spec = spec_stages.get(name, {})
        achieved = _num(summary, "request_throughput")
        rate = _num(spec, "request_rate")
        if rate is not None or name == "trace":
            mode, offered = "rate", rate if rate is not None else (achieved or 0.0)
        else:
            mode, offered = "concurrency", float(spec.get("concurrency") or 0)
        completed = summary.get("completed") or 0
        at = run.finished_at.timestamp() if run.finished_at else None
        out.append(
            LoadPoint(
                source="run",
                run_id=run.pk,
                run_name=f"run #{run.pk}",
                stage=name,
                mode=mode,
                offered=offered,
                achieved_rps=achieved,
                ttft_p95_ms=_num(summary, "p95_ttft_ms"),
                itl_p95_ms=_num(summary, "p95_itl_ms"),
                error_rate=_num(summary, "error_rate") or 0.0,
                output_tokens_per_s=_num(summary, "output_throughput"),
                mean_prompt_tokens=(
                    summary["total_input_tokens"] / completed
                    if completed and _num(summary, "total_input_tokens") is not None
                    else None
                ),
                mean_output_tokens=(
                    summary["total_output_tokens"] / completed
                    if completed and _num(summary, "total_output_tokens") is not None
                    else None
                ),
                finished_at=at,
                **gauges.get(name, {}),
            )
        )
    return out


def _trial_point(trial: SweepTrial, used_runs: set[int]) -> LoadPoint | None:
    """A sweep trial's measured max load as a load level, unless the run that measured it
    is already counted stage by stage."""
    numbers = trial.numbers or {}
    measured_by = [
        p.get("run")
        for p in (trial.probes or [])
        if p.get("load") == trial.max_load and p.get("ok")
    ]
    if any(run in used_runs for run in measured_by):
        return None
    return LoadPoint(
        source="sweep",
        run_id=measured_by[0] if measured_by else None,
        run_name=f"sweep #{trial.sweep_id} trial {trial.index}",
        sweep_id=trial.sweep_id,
        mode=trial.sweep.load_mode,
        offered=float(trial.max_load),
        achieved_rps=_num(numbers, "request_rate"),
        ttft_p95_ms=_num(numbers, "ttft_p95_ms"),
        itl_p95_ms=_num(numbers, "itl_p95_ms"),
        error_rate=_num(numbers, "error_rate") or 0.0,
        output_tokens_per_s=_num(numbers, "output_tps"),
        finished_at=trial.finished_at.timestamp() if trial.finished_at else None,
    )


# --- engine start ---------------------------------------------------------------------------------
