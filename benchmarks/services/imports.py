"""Importing a result produced elsewhere (the load generator's CLI, another panel's export,
``vllm bench serve``, GuideLLM, AIPerf) as a finished run of one of our deployments, so it
sits in the history and the compare view next to the runs the panel made itself.

An uploaded file is read in the background (``start_import`` → the task
``benchmarks.tasks.import_result`` → ``execute_import``): it is saved owner-only under
``VAR_DIR/imports``, an ``ImportJob`` row records how far the reading got, and the file is
read as a stream (``benchmarks.importers.read``) so memory does not grow with its size. The
file is deleted when the job ends, succeeded or not.
"""

from __future__ import annotations

import logging
import os
import secrets
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from benchmarks import importers, importers_aiperf, importers_guidellm
from benchmarks.choices import RunSource
from benchmarks.loadgen.profile import build_spec
from benchmarks.loadgen.spec import SpecError
from benchmarks.models import GPU_SEPARATOR, BenchmarkRun, ImportJob, LoadProfile, RunRequestLog
from benchmarks.services.results import store_results
from controlpanel import timelimits, userjson
from controlpanel.choices import OperationStatus
from controlpanel.jobs import enqueue_on_commit
from controlpanel.services import audit
from hosts.models import Deployment, EngineConfig

log = logging.getLogger(__name__)

SOURCES = {
    importers.LOADGEN: RunSource.LOADGEN,
    importers.VLLM_BENCH: RunSource.VLLM_BENCH,
    importers_guidellm.GUIDELLM: RunSource.GUIDELLM,
    importers_aiperf.AIPERF: RunSource.AIPERF,
}
UPLOAD_DIR = "imports"  # under VAR_DIR
# The job row is written when the reading has moved on by this share of the work (or its
# phase changed): a hundred small updates for any file, however large.
PROGRESS_STEP = 0.01


def start_import(
    actor,
    upload,
    deployment: Deployment,
    engine_config: EngineConfig | None = None,
    label: str = "",
    benchmark: int | None = None,
) -> ImportJob:
    """Save the uploaded file (a Django ``UploadedFile``) owner-only under VAR_DIR, record an
    ``ImportJob`` and queue the task that reads it. The page follows the job. ``benchmark``
    picks one benchmark of a GuideLLM sweep (1-based; None: the first)."""
    if engine_config is not None and engine_config.deployment_id != deployment.pk:
        raise ValueError(f"config v{engine_config.version} belongs to another deployment")
    path = _save_upload(upload)
    try:
        with transaction.atomic():
            job = ImportJob.objects.create(
                requested_by=actor if getattr(actor, "is_authenticated", False) else None,
                deployment=deployment,
                engine_config=engine_config,
                label=label[:100],
                benchmark=benchmark,
                filename=os.path.basename(upload.name or "upload.json")[:255],
                path=str(path),
                bytes_total=path.stat().st_size,
                phase="waiting for a worker",
            )
            enqueue_on_commit(
                "benchmarks.tasks.import_result", job.pk, **timelimits.IMPORT_RESULT.options()
            )
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return job


def execute_import(job: ImportJob) -> BenchmarkRun | None:
    """The task's work: read the job's file as a stream, reporting progress on the row, and
    record the run. A file the panel cannot read fails the job with the reason."""
    if job.status == OperationStatus.QUEUED:
        job.transition_to(OperationStatus.RUNNING)
    try:
        imported = importers.read(job.path, progress=_Reporter(job), benchmark=job.benchmark)
        _report(job, phase="saving the run", progress=1.0)
        with transaction.atomic():
            run = record_import(
                job.requested_by, job.deployment, imported, job.engine_config, job.label
            )
            job.run = run
            job.save(update_fields=["run"])
            job.transition_to(OperationStatus.SUCCEEDED)
        _report(job, phase="done")
        return run
    except FileNotFoundError:
        job.transition_to(
            OperationStatus.FAILED,
            error="The uploaded file is gone (it is kept only while its import runs): "
            "upload it again.",
        )
    except ValueError as exc:  # what is wrong with the file, said for the person who sent it
        job.transition_to(OperationStatus.FAILED, error=f"The file was not imported: {exc}")
    finally:
        _delete_upload(job)
    return None


def fail_import(job: ImportJob, reason: str) -> None:
    """Record a failure the task did not expect (an exception, a time limit)."""
    job.refresh_from_db()
    if not job.is_finished:
        job.transition_to(OperationStatus.FAILED, error=reason)
    _delete_upload(job)


def fail_stale_imports(now=None) -> list[ImportJob]:
    """Fail the jobs no worker finished although their time limit and a wait in the queue
    have passed (the worker was lost, or the embedded worker's in-memory queue with its
    process), deleting their uploads. Run by beat with the sweep of stale runs."""
    now = now or timezone.now()
    limit = timedelta(seconds=timelimits.IMPORT_RESULT.hard + timelimits.QUEUE_WAIT_MARGIN)
    stale = ImportJob.objects.filter(
        status__in=[OperationStatus.QUEUED, OperationStatus.RUNNING], created_at__lt=now - limit
    )
    failed = []
    for job in stale:
        fail_import(
            job,
            f"No worker finished this import within {limit.total_seconds() / 60:.0f} minutes "
            "(the worker was lost): upload the file again.",
        )
        failed.append(job)
    return failed


def import_run(
    actor,
    deployment: Deployment,
    data: dict,
    engine_config: EngineConfig | None = None,
    label: str = "",
) -> BenchmarkRun:
    """Record the result document ``data`` (parsed JSON, small: an uploaded file goes through
    ``start_import``) as a succeeded run of ``deployment``. Raises ``ValueError`` for a
    document that is not a result this panel reads."""
    return record_import(actor, deployment, importers.parse(data), engine_config, label)


def record_import(
    actor,
    deployment: Deployment,
    imported: importers.Imported,
    engine_config: EngineConfig | None = None,
    label: str = "",
) -> BenchmarkRun:
    """Record the read file ``imported`` as a succeeded run of ``deployment``.

    The run links the load profile version whose load is exactly the file's (same stages,
    arrivals, lengths, prefixes, warm-up and SLOs), when one exists; none is created, so
    imports do not fill the profile list with near-copies. A file that measured another
    model than the deployment serves is imported with a note saying so. Raises
    ``ValueError`` for what cannot be stored: a config of another deployment, text
    PostgreSQL refuses (a NUL character) anywhere in what is kept."""
    if engine_config is not None and engine_config.deployment_id != deployment.pk:
        raise ValueError(f"config v{engine_config.version} belongs to another deployment")
    # The request log is binary; everything else lands in text and jsonb columns.
    userjson.check_value(
        {**imported.document, "spec": imported.spec, "panel": imported.panel}, what="The file"
    )
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
        store_results(run, document, None, store_timeline=True)
        if imported.log is not None:
            run.distributions = imported.distributions
            run.save(update_fields=["distributions"])
            RunRequestLog.objects.create(run=run, count=imported.log_count, data=imported.log)
        elif isinstance(imported.panel.get("distributions"), dict):
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


# --- the uploaded file and the job's progress ------------------------------------------------
def upload_dir() -> Path:
    """Where uploads wait for their import: owner-only, like all of VAR_DIR."""
    folder = Path(settings.VAR_DIR) / UPLOAD_DIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def _save_upload(upload) -> Path:
    path = upload_dir() / f"{secrets.token_hex(16)}.json"
    # Created owner-only (0600) and exclusively: never another file's name, never readable
    # by other users of the machine even for a moment.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in upload.chunks():
                out.write(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def _delete_upload(job: ImportJob) -> None:
    if not job.path:
        return
    try:
        Path(job.path).unlink(missing_ok=True)
    except OSError:
        log.warning("could not delete the upload of %s", job, exc_info=True)
        return
    ImportJob.objects.filter(pk=job.pk).update(path="")
    job.path = ""


class _Reporter:
    """The importer's progress callback: writes the job row every ``PROGRESS_STEP`` of the
    work and whenever the phase changes."""

    def __init__(self, job: ImportJob):
        self.job = job
        self.phase = None
        self.written = -1.0

    def __call__(self, phase: str, bytes_read: int, fraction: float) -> None:
        if phase == self.phase and fraction - self.written < PROGRESS_STEP:
            return
        self.phase, self.written = phase, fraction
        _report(self.job, phase=phase, progress=fraction, bytes_read=bytes_read)


def _report(job: ImportJob, **fields) -> None:
    for name, value in fields.items():
        setattr(job, name, value)
    ImportJob.objects.filter(pk=job.pk).update(**fields)


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
    if imported.tool:
        return imported.tool
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
