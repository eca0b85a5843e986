"""What reviewers see of a proposal before anyone approves it: the settings as the engine's
flag spec accepts them, the flag-level diff against the running config, domain warnings, the
simulator's predicted impact under the chosen profile, and how many approvals it needs."""

from __future__ import annotations

from django.conf import settings as conf

from benchmarks import records as request_records
from benchmarks.models import BenchmarkRun, LoadProfile, RunRequestLog
from benchmarks.services import probes
from changes import advice
from changes.models import ChangeRequest
from changes.rules import ChangeRefused
from changes.services import config_history
from changes.services.quality import PROBE_CONCURRENCY, needs_probe
from controlpanel.choices import OperationStatus
from hosts.engines import get_spec
from hosts.engines.launch import LaunchError
from hosts.engines.redaction import masked
from hosts.models import Deployment, EngineConfig
from hosts.services.gpus import gpu_count, gpu_facts  # noqa: F401 - used here and by forms


def validate_proposal(
    deployment: Deployment, settings: dict, env: dict, placement: dict, model: str = ""
) -> dict:
    """The settings (and another model, when one is proposed) as the engine's flag spec for
    the deployment's version and the launch rules accept them, or ChangeRefused naming every
    refused field (nothing malicious reaches a command line)."""
    model = (model or "").strip()
    try:
        launch = deployment.launch_config(settings, env, placement, model or None).validated(
            gpu_count=gpu_count(deployment)
        )
    except LaunchError as exc:
        raise ChangeRefused(str(exc)) from None
    return {
        "settings": launch.settings,
        "env": launch.env,
        "placement": launch.placement.to_dict() if launch.placement else {},
        # The same model as now is no change of model.
        "model": model if model and model != deployment.model else "",
    }


def shown_diff(diff: dict) -> dict:
    """A config diff (``{key: (old, new)}``) as people may read it: secret values (the flag
    spec's ``api_key``, ``env.HF_TOKEN``) masked on both sides, "unset" left visible."""
    return masked(diff)


def observed_p99_tokens(deployment: Deployment) -> int | None:
    """p99 of prompt + output tokens over the requests of the deployment's latest successful
    benchmark: what the real (or profiled) traffic needs from ``max_model_len``."""
    run = (
        BenchmarkRun.objects.filter(deployment=deployment, status=OperationStatus.SUCCEEDED)
        .order_by("-created_at")
        .only("pk")
        .first()
    )
    if run is None:
        return None
    blob = RunRequestLog.objects.filter(run=run).values_list("data", flat=True).first()
    if not blob:
        return None
    sizes = sorted(
        (row["prompt_tokens"] or row["input_len"] or 0) + (row["output_tokens"] or 0)
        for row in request_records.iter_rows(bytes(blob))
        if row["error_class"] is None
    )
    if not sizes:
        return None
    return sizes[max(0, -(-99 * len(sizes) // 100) - 1)]


def review_facts(
    deployment: Deployment,
    base: EngineConfig | None,
    proposal: dict,
    profile: LoadProfile | None = None,
) -> dict:
    """Diff, warnings and (when the simulator models it) the predicted impact of a proposal."""
    change = ChangeRequest(deployment=deployment, base_config=base, **proposal)
    diff = change.diff()
    gpu, num_gpus, gpu_memory = gpu_facts(deployment)
    warnings = advice.warnings_for(
        deployment.engine,
        diff,
        proposal["settings"],
        engine_version=deployment.engine_version or None,
        model=proposal.get("model") or deployment.model,
        gpu_memory_bytes=gpu_memory,
        observed_p99_tokens=observed_p99_tokens(deployment),
    )
    prediction: dict = {}
    if profile is not None:
        if gpu is None:
            prediction = {"available": False, "reason": "The host's GPUs are not known yet."}
        else:
            prediction = advice.predicted_impact(
                deployment.engine,
                deployment.model,
                base.settings if base else {},
                proposal["settings"],
                gpu,
                num_gpus,
                profile.spec,
                model_after=proposal.get("model") or None,
            )
        prediction["profile"] = str(profile)
    return {
        "diff": diff,
        # The prediction's harm (a config that would not start, a regression past
        # advice.PREDICTED_HARM) is a warning too, listed first.
        "warnings": advice.with_prediction_warnings([w.to_dict() for w in warnings], prediction),
        "prediction": prediction,
        "quality": quality_facts(deployment, diff),
    }


def quality_facts(deployment: Deployment, diff: dict) -> dict:
    """Whether the change gets a quality probe (it touches what the model answers), with
    which set and about how long each of its two runs takes; empty when it does not."""
    why = needs_probe(deployment.engine, diff)
    if not why:
        return {}
    probe_set = probes.default_set()
    if probe_set is None:
        return {"why": why, "problem": "No probe set is available: the change cannot be probed."}
    seconds, basis = probes.estimate_seconds(probe_set, deployment, PROBE_CONCURRENCY)
    return {
        "why": why,
        "set": probe_set.pk,
        "set_name": str(probe_set),
        "items": probe_set.item_count,
        "estimate_s": seconds,
        "estimate_basis": basis,
    }


def required_approvals(deployment: Deployment) -> int:
    """CHANGE_PRODUCTION_APPROVALS for a production host (``Host.is_production``), else one."""
    return conf.CHANGE_PRODUCTION_APPROVALS if deployment.host.is_production else 1


def spec_flags(deployment: Deployment):
    """The flags of the deployment's engine version, performance flags first."""
    spec = get_spec(deployment.engine)
    flags = spec.flags_for(deployment.engine_version or None)
    return sorted(flags, key=lambda f: (not f.performance, spec.flags.index(f)))


def configs_with_diffs(configs: list[EngineConfig]) -> list[dict]:
    """Each config with what it changed from the version it was made from (its parent;
    ``config_history.parents``), for the API's history: the same diff as the pages."""
    return config_history.rows(configs, with_endings=False)
