"""Importing a result produced elsewhere (the load generator's CLI, another panel's export,
``vllm bench serve``) as a finished run of one of our deployments, so it sits in the history
and the compare view next to the runs the panel made itself."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from benchmarks import importers
from benchmarks.choices import RunSource
from benchmarks.loadgen.profile import build_spec
from benchmarks.loadgen.spec import SpecError
from benchmarks.models import GPU_SEPARATOR, BenchmarkRun, LoadProfile
from benchmarks.services.results import store_results
from controlpanel.choices import OperationStatus
from controlpanel.services import audit
from hosts.models import Deployment, EngineConfig

SOURCES = {importers.LOADGEN: RunSource.LOADGEN, importers.VLLM_BENCH: RunSource.VLLM_BENCH}


def import_run(
    actor,
    deployment: Deployment,
    data: dict,
    engine_config: EngineConfig | None = None,
    label: str = "",
) -> BenchmarkRun:
    """Record the result file ``data`` (parsed JSON) as a succeeded run of ``deployment``.

    The run links the load profile version whose load is exactly the file's (same stages,
    arrivals, lengths, prefixes, warm-up and SLOs), when one exists; none is created, so
    imports do not fill the profile list with near-copies. A file that measured another
    model than the deployment serves is imported with a note saying so. Raises ``ValueError``
    for a file that is not a result this panel reads."""
    imported = importers.parse(data)
    if engine_config is not None and engine_config.deployment_id != deployment.pk:
        raise ValueError(f"config v{engine_config.version} belongs to another deployment")
    notes = list(imported.document.get("notes") or []) + imported.notes
    if imported.model and imported.model != deployment.model:
        notes.append(f"the file measured {imported.model}; {deployment} serves {deployment.model}")
    if imported.document.get("cancelled"):
        notes.append("the file says the run was cancelled before it finished")
    profile = matching_profile(imported.spec, imported.panel.get("profile"))
    if imported.spec is not None and profile is None:
        notes.append("no load profile here has exactly this load: the run has none")
    document = dict(imported.document, notes=notes)
    with transaction.atomic():
        run = _create_run(actor, deployment, engine_config, profile, imported, label)
        store_results(run, document, imported.records, store_timeline=True)
        if not imported.records and isinstance(imported.panel.get("distributions"), dict):
            # A panel export carries the exporting panel's CDFs instead of raw records.
            run.distributions = imported.panel["distributions"]
            run.save(update_fields=["distributions"])
        audit(
            actor,
            "run.import",
            run,
            after={
                "source": run.source,
                "deployment": str(deployment),
                "config_version": engine_config.version if engine_config else None,
                "profile": str(profile) if profile else None,
                "model": imported.model,
                "requests": (run.completed or 0) + (run.failed or 0),
            },
        )
    return run


def _create_run(actor, deployment, engine_config, profile, imported, label) -> BenchmarkRun:
    """The finished run row of an imported file: when it ran, on what, measured by what."""
    panel = imported.panel
    started = _started(imported)
    duration = imported.document.get("duration")
    finished = started
    if isinstance(duration, int | float) and duration > 0:
        finished = started + timedelta(seconds=float(duration))
    gpus = list(deployment.gpus.all()) or list(deployment.host.gpus.all())
    gpu_model = panel.get("gpu_model") or GPU_SEPARATOR.join(sorted({g.name for g in gpus}))
    return BenchmarkRun.objects.create(
        deployment=deployment,
        engine_config=engine_config,
        load_profile=profile,
        label=(label or imported.label or "")[:100],
        source=SOURCES[imported.kind],
        requested_by=actor if getattr(actor, "is_authenticated", False) else None,
        status=OperationStatus.SUCCEEDED,
        created_at=started,
        started_at=started,
        finished_at=finished,
        progress=1.0,
        engine=str(panel.get("engine") or deployment.engine)[:16],
        engine_version=str(panel.get("engine_version") or deployment.engine_version)[:40],
        model_name=(imported.model or deployment.model)[:200],
        gpu_model=str(gpu_model)[:100],
        gpu_count=panel.get("gpu_count") or (len(gpus) or None),
        loadgen_version=_tool_version(imported)[:40],
        environment=_environment(imported),
    )


def matching_profile(spec: dict | None, named: dict | None = None) -> LoadProfile | None:
    """The profile version whose load equals ``spec``'s: the one the file names (an export of
    a panel) when its load still matches, else any version with the same load, newest first."""
    wanted = importers.comparable_spec(spec)
    if wanted is None:
        return None
    candidates = list(LoadProfile.objects.order_by("-created_at", "-pk"))
    if isinstance(named, dict):
        first = [
            p
            for p in candidates
            if p.name == named.get("name") and p.version == named.get("version")
        ]
        candidates = first + [p for p in candidates if p not in first]
    for profile in candidates:
        if profile.spec.get("replay"):
            continue
        try:
            theirs = build_spec(profile.spec, "http://import.invalid", "model").to_dict()
        except SpecError:
            continue
        if importers.comparable_spec(theirs) == wanted:
            return profile
    return None


def _started(imported: importers.Imported):
    now = timezone.now()
    if imported.date is None or imported.date > now:
        return now
    return imported.date


def _tool_version(imported: importers.Imported) -> str:
    if imported.kind == importers.VLLM_BENCH:
        return "vllm bench serve"
    return str(imported.panel.get("loadgen_version") or "cli")


def _environment(imported: importers.Imported) -> dict:
    exported = imported.panel.get("environment")
    environment = dict(exported) if isinstance(exported, dict) else {}
    if "config" not in environment and isinstance(imported.panel.get("config"), dict):
        environment["config"] = imported.panel["config"]
    environment["imported"] = {
        "kind": imported.kind,
        "at": timezone.now().isoformat(timespec="seconds"),
        "model": imported.model,
        "from_panel_run": imported.panel.get("run_id"),
    }
    if imported.spec is not None:
        environment["spec"] = imported.spec
    return environment
