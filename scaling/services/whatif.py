"""Capacity-planning what-ifs: made from the form (checked, audited, queued), computed by the
worker (the replica curve from the simulator, then the day under four policies, progress as
each finishes), failed with the error on the row. The model is ``scaling.planning.whatif``.
"""

from __future__ import annotations

import math

from django.conf import settings as conf
from django.db import transaction

from benchmarks.loadgen.profile import BUILTINS
from benchmarks.models import BenchmarkRun, LoadProfile
from benchmarks.services.prices import deployment_target
from benchmarks.sweep.load import sweep_workload
from controlpanel.choices import OperationStatus
from controlpanel.jobs import enqueue_on_commit
from controlpanel.services import audit
from hosts.models import Deployment
from scaling.models import ScalingPolicy, WhatIfPlan
from scaling.planning.dayshape import UTC_CLOCK, hour_ranges
from scaling.planning.replica import calibrate
from scaling.planning.whatif import (
    HPA_TOLERANCE,
    LABELS,
    POLICIES,
    DayParams,
    PlanError,
    check_day,
    never_scales_up,
    run_day,
)
from scaling.services.startup import engine_start_seconds

TASK = "scaling.tasks.run_what_if"
DEFAULT_PROFILE = "Interactive chat"
# The default day, as shares of its peak hour: quiet nights, a morning ramp from 07:00, a
# lunch peak at 12:00–13:00, a long afternoon and an evening tail. ``DEFAULT_PEAK_RPS`` puts
# the peak at several replicas of the demo fleet's configs (each carries ~10–20 req/s of
# the chat profile in the simulator), so scaling has something to do.
DEFAULT_SHAPE = (
    0.06, 0.04, 0.03, 0.03, 0.04, 0.06, 0.15, 0.40, 0.65, 0.75, 0.80, 0.85,
    1.00, 0.95, 0.75, 0.72, 0.70, 0.62, 0.45, 0.33, 0.25, 0.18, 0.12, 0.08,
)  # fmt: skip
DEFAULT_PEAK_RPS = 45.0
CALIBRATION_SHARE = 0.6  # of the progress bar: the simulator runs, then the four policies


class WhatIfInvalid(ValueError):
    """A what-if that cannot be made, with the problem per form field ("" for the whole)."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{k}: {v}" if k else v for k, v in errors.items()))
        self.errors = errors


def default_hourly() -> list[float]:
    return [round(share * DEFAULT_PEAK_RPS, 2) for share in DEFAULT_SHAPE]


def form_initial(deployment: Deployment) -> dict:
    """The form's starting values: the default day, and the SLO and replica bounds of the
    deployment's scaling policy when it has one (the settings' defaults otherwise)."""
    policy = ScalingPolicy.objects.filter(deployment=deployment).first()
    initial = {
        "hourly_rates": ", ".join(f"{r:g}" for r in default_hourly()),
        "slo_ttft_p95_ms": conf.SCALING_SLO_TTFT_P95_MS,
        "min_replicas": 1,
        "max_replicas": 8,
        "target_utilisation": 70,
        "target_utilisation_high": 95,
        "stabilisation_s": 300,
        "polling_interval_s": 15,
    }
    if policy is not None:
        initial.update(
            slo_ttft_p95_ms=policy.slo_ttft_p95_ms,
            min_replicas=policy.min_replicas,
            max_replicas=policy.max_replicas,
            stabilisation_s=policy.stabilisation_s,
            polling_interval_s=policy.polling_interval_s,
        )
    return initial


def create_plan(deployment: Deployment, user, data: dict) -> WhatIfPlan:
    """Check ``data`` (the form's cleaned data), store the plan and queue its computation."""
    errors: dict[str, str] = {}
    try:
        hourly = check_day(list(data.get("hourly_rates") or []))
    except (PlanError, TypeError, ValueError) as exc:
        errors["hourly_rates"] = str(exc)
    low, high = data.get("min_replicas"), data.get("max_replicas")
    if low is None or high is None or low < 0 or high < 1 or high > 1000:
        errors["max_replicas"] = "Replicas: a minimum of 0 or more and a maximum of 1 to 1000."
    elif low > high:
        errors["min_replicas"] = f"The minimum ({low}) is more than the maximum ({high})."
    slo = data.get("slo_ttft_p95_ms")
    if slo is None or not math.isfinite(slo) or not 1 <= slo <= 600_000:
        errors["slo_ttft_p95_ms"] = "The p95 TTFT SLO is 1 to 600,000 ms."
    fixed = data.get("fixed_replicas")
    if fixed is not None and high is not None and not 1 <= fixed <= max(high, 1):
        errors["fixed_replicas"] = f"Fixed replicas: 1 to the maximum ({high})."
    if deployment.active_config_id is None:
        errors[""] = f"{deployment} has no running config to model."
    if errors:
        raise WhatIfInvalid(errors)
    policy = ScalingPolicy.objects.filter(deployment=deployment).first()
    params = {
        "slo_ttft_p95_ms": float(slo),
        "min_replicas": int(low),
        "max_replicas": int(high),
        "fixed_replicas": fixed,
        "target_utilisation": float(data.get("target_utilisation") or 70) / 100,
        "target_utilisation_high": float(data.get("target_utilisation_high") or 95) / 100,
        "stabilisation_s": float(data.get("stabilisation_s") or 0),
        "polling_interval_s": float(data.get("polling_interval_s") or 15),
        "start_delay_s": data.get("start_delay_s"),
        "target": policy.target if policy else 0.8,
        "load_profile_id": policy.load_profile_id if policy else None,
    }
    with transaction.atomic():
        plan = WhatIfPlan.objects.create(
            deployment=deployment,
            requested_by=user,
            traffic=_traffic(hourly, data.get("sample")),
            params=params,
        )
        audit(user, "whatif.created", plan, after={"traffic": plan.traffic, "params": params})
        enqueue_on_commit(TASK, plan.pk)
    return plan


def _traffic(hourly: list[float], sample: dict | None) -> dict:
    """The plan's day: its 24 rates and where they came from (a sample's summary, as
    ``forms_whatif.sample_summary`` makes it, when it gave them)."""
    if not sample:
        return {"hourly": hourly, "source": "form"}
    return {"hourly": hourly, "source": "sample", "sample": sample}


def traffic_words(traffic: dict) -> str:
    """Where the day came from, in one sentence for the plan's page."""
    sample = (traffic or {}).get("sample")
    if (traffic or {}).get("source") != "sample" or not sample:
        return "The day's 24 hourly rates as entered."
    clock = "UTC" if sample["placement"] == UTC_CLOCK else "its times placed from 00:00"
    covered, rest = sample["covered_hours"], sample["fallback_hours"]
    hours = "All 24 hours" if not rest else f"Hour{'s' * (len(covered) > 1)} {hour_ranges(covered)}"
    words = f"{hours} from {sample['filename']} ({sample['requests']:,} requests, {clock})"
    words += "; the rest as entered." if rest else "."
    return words + (
        f" Its mean request: {sample['mean_input_tokens']:g} input and "
        f"{sample['mean_output_tokens']:g} output tokens (the replica is measured with the "
        "profile's sizes, named in the basis below)."
    )


def _profile(deployment: Deployment, profile_id: int | None) -> LoadProfile | None:
    """The request sizes to calibrate with: the policy's profile, else that of the newest
    finished run of the running config, else the built-in chat profile."""
    if profile_id:
        found = LoadProfile.objects.filter(pk=profile_id).first()
        if found:
            return found
    run = (
        BenchmarkRun.objects.filter(
            deployment=deployment,
            engine_config=deployment.active_config,
            status=OperationStatus.SUCCEEDED,
        )
        .select_related("load_profile")
        .order_by("-created_at")
        .first()
    )
    if run is not None and run.load_profile is not None:
        return run.load_profile
    return LoadProfile.objects.filter(name=DEFAULT_PROFILE).order_by("-version").first()


def _progress(plan: WhatIfPlan, value: float) -> None:
    plan.progress = round(min(1.0, value), 3)
    WhatIfPlan.objects.filter(pk=plan.pk).update(progress=plan.progress)


def execute_plan(plan: WhatIfPlan) -> WhatIfPlan:
    """Calibrate the replica curve in the simulator, run the day under every policy and
    store the result (progress saved as the simulator runs and as each policy finishes)."""
    plan.transition_to(OperationStatus.RUNNING)
    deployment = plan.deployment
    p = plan.params
    facts = deployment_target(deployment)
    if not facts.get("gpu"):
        raise PlanError(f"the panel does not know the GPU of {deployment}")
    profile = _profile(deployment, p.get("load_profile_id"))
    spec = profile.spec if profile else BUILTINS[DEFAULT_PROFILE]["spec"]
    workload = sweep_workload(spec, "rate")
    if p.get("start_delay_s") is not None:
        delay, delay_basis = float(p["start_delay_s"]), "entered on the form"
    else:
        delay, delay_basis = engine_start_seconds(deployment)
    plan.append_log(f"calibrating a replica of {deployment} in the simulator")
    curve = calibrate(
        deployment.engine,
        deployment.model,
        deployment.active_config.settings if deployment.active_config else {},
        facts["gpu"],
        workload,
        facts["num_gpus"],
        time_scale=facts["time_scale"],
        on_point=lambda n, total: _progress(plan, CALIBRATION_SHARE * n / total),
    )
    params = DayParams(
        slo_ttft_p95_ms=p["slo_ttft_p95_ms"],
        min_replicas=p["min_replicas"],
        max_replicas=p["max_replicas"],
        fixed_replicas=p.get("fixed_replicas"),
        start_delay_s=delay,
        target_utilisation=p["target_utilisation"],
        target_utilisation_high=p.get("target_utilisation_high", 0.95),
        stabilisation_s=p["stabilisation_s"],
        polling_interval_s=p["polling_interval_s"],
        target=p.get("target") or 0.8,
        price_per_gpu_hour=facts.get("price_per_gpu_hour"),
        currency=facts.get("currency") or "USD",
    )
    day = run_day(
        plan.traffic["hourly"],
        curve,
        params,
        on_policy=lambda _name, n, total: _progress(
            plan, CALIBRATION_SHARE + (1 - CALIBRATION_SHARE) * n / total
        ),
    )
    config = deployment.active_config
    plan.result = {
        **day,
        "curve": curve.as_dict(),
        "params": params.as_dict(),
        "profile": f"{profile.name} v{profile.version}" if profile else DEFAULT_PROFILE,
        "config": f"config v{config.version}" if config else "no config",
        "gpu": facts["gpu"],
        "num_gpus": facts["num_gpus"],
        "price_source": facts.get("price_source") or "",
        "start_delay_basis": delay_basis,
    }
    plan.result["words"] = result_words(plan.result)
    plan.progress = 1.0
    plan.save(update_fields=["result", "progress"])
    plan.append_log("done")
    plan.transition_to(OperationStatus.SUCCEEDED)
    return plan


def fail_plan(plan: WhatIfPlan, error: str) -> None:
    """Record the failure on the row (a plan already finished keeps its outcome)."""
    plan.refresh_from_db()
    if not plan.is_finished:
        plan.transition_to(OperationStatus.FAILED, error=error[:2000])


def rows(result: dict) -> list[dict]:
    """The summary table: one row per policy, in the order of ``POLICIES``."""
    out = []
    for key in POLICIES:
        day = (result.get("policies") or {}).get(key)
        if day:
            out.append({"key": key, "label": day.get("label") or LABELS[key], **day["summary"]})
    return out


def result_words(result: dict) -> dict:
    """The result in words and the model's basis, for the sentence under the table."""
    params, curve = result["params"], result["curve"]
    slo = params["slo_ttft_p95_ms"]
    table = rows(result)
    parts = []
    for row in table:
        label = row["label"]
        if row["key"] == "fixed":
            label = f"{label} ({result['fixed_replicas']})"
        parts.append(
            f"{label}: {row['minutes_out_of_slo']} min out of SLO, {row['gpu_hours']:g} GPU-h"
        )
    best = min(table, key=lambda r: (r["minutes_out_of_slo"], r["gpu_hours"]))
    summary = (
        f"Against a p95 TTFT SLO of {slo:g} ms: " + "; ".join(parts) + f". {best['label']} "
        "did best (fewest minutes out of SLO, then fewest GPU-hours)."
    )
    summary += _behaviour(result, best)
    price = params.get("price_per_gpu_hour")
    cost = (
        f"Priced at {price:.2f} {params['currency']} per GPU-hour ({result['price_source']})."
        if price is not None
        else "No price is known for this host: GPU-hours only."
    )
    basis = (
        f"{curve['basis']} ({result['config']}, request sizes of {result['profile']}); "
        f"start-up delay {params['start_delay_s']:.0f} s, {result['start_delay_basis']}; "
        "the day at one-minute steps, each minute's load spread over the replicas ready in it, "
        "load above their saturation carried as a backlog, requests waiting past "
        f"{params.get('timeout_s', 600):.0f} s given up as timed out."
    )
    return {"summary": summary, "cost": cost, "basis": basis}


def _behaviour(result: dict, best: dict) -> str:
    """Why the scaling policies did what they did, in the day's own numbers."""
    policies, params = result["policies"], result["params"]
    words = ""
    for key, target_key in (
        ("utilisation", "target_utilisation"),
        ("utilisation_high", "target_utilisation_high"),
    ):
        util = policies.get(key)
        if not util or not util["utilisation"] or target_key not in params:
            continue
        target = params[target_key]
        summary = util["summary"]
        if never_scales_up(target):
            words += (
                f" At a {target:.0%} target the HPA never scales up (utilisation cannot read "
                f"above 100 %, within its {HPA_TOLERANCE:.0%} tolerance of the target): it "
                f"shrank in quiet hours and missed the SLO for {summary['minutes_out_of_slo']} "
                "minutes."
            )
            continue
        high = sum(1 for u in util["utilisation"] if u >= target) / len(util["utilisation"])
        words += (
            f" GPU utilisation read at or above its {target:.0%} target in {high:.0%} of the "
            f"day's minutes, so the HPA held {summary['mean_replicas']:g} replicas on "
            f"average (against {best['mean_replicas']:g} for {best['label']})."
        )
    queue = policies.get("queue")
    if queue:
        totals = [r + b for r, b in zip(queue["ready"], queue["booting"], strict=True)]
        downs = sum(1 for a, b in zip(totals, totals[1:], strict=False) if b < a)
        if downs:
            words += (
                f" Queue depth alone scaled down {downs} times: below saturation a replica "
                "queues almost nothing, so the group shrinks until a queue (and the SLO miss) "
                "appears."
            )
    return words


# --- the page's charts ---------------------------------------------------------------------------
COLOURS = {
    "fixed": "#7f7f7f",
    "utilisation": "#d62728",
    "utilisation_high": "#9467bd",
    "queue": "#ff7f0e",
    "tokens": "#2ca02c",
}
LAYOUT = {
    "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
    "height": 340,
    "legend": {"orientation": "h", "y": -0.2},
    "hovermode": "x unified",
}


def _clock(minutes: int) -> list[str]:
    return [f"{m // 60:02d}:{m % 60:02d}" for m in range(minutes)]


def figures(result: dict) -> dict:
    """Plotly figures (plain dicts for ``static/controlpanel/charts.js``): the day's traffic,
    the replicas of each policy (ready solid, ready + booting dotted) and each policy's p95
    TTFT against the SLO (log scale: a backlog's wait dwarfs a served request's)."""
    rates = result.get("rates") or []
    x = _clock(len(rates))
    policies = result.get("policies") or {}
    slo = result["params"]["slo_ttft_p95_ms"]
    traffic = {
        "data": [{"type": "scatter", "mode": "lines", "name": "req/s", "x": x, "y": rates}],
        "layout": {**LAYOUT, "title": {"text": "Traffic (requests/s)"}, "showlegend": False},
    }
    replicas, ttft = [], []
    for key in POLICIES:
        day = policies.get(key)
        if not day:
            continue
        colour, label = COLOURS[key], day.get("label") or LABELS[key]
        total = [r + b for r, b in zip(day["ready"], day["booting"], strict=True)]
        replicas.append(
            {"type": "scatter", "mode": "lines", "name": f"{label}: ready", "x": x,
             "y": day["ready"], "line": {"color": colour, "shape": "hv"}}
        )  # fmt: skip
        replicas.append(
            {"type": "scatter", "mode": "lines", "name": f"{label}: ready + booting", "x": x,
             "y": total, "line": {"color": colour, "dash": "dot", "shape": "hv"},
             "showlegend": False}
        )  # fmt: skip
        ttft.append(
            {"type": "scatter", "mode": "lines", "name": label, "x": x,
             "y": day["ttft_p95_ms"], "line": {"color": colour}}
        )  # fmt: skip
    ttft.append(
        {"type": "scatter", "mode": "lines", "name": f"SLO {slo:g} ms", "x": [x[0], x[-1]],
         "y": [slo, slo], "line": {"color": "#000", "dash": "dash"}}
    )  # fmt: skip
    return {
        "traffic": traffic,
        "replicas": {
            "data": replicas,
            "layout": {**LAYOUT, "title": {"text": "Replicas (dotted: with booting ones)"}},
        },
        "ttft": {
            "data": ttft,
            "layout": {
                **LAYOUT,
                "title": {"text": "p95 TTFT per minute (ms)"},
                "yaxis": {"type": "log"},
            },
        },
    }
