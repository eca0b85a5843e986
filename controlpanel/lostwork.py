"""Work that outlives a lost worker: one claim per running job, one sweep that ends lost ones.

Every long job runs through ``controlpanel.jobs.run_job``, which holds a ``WorkClaim`` on the
job's row while the task runs and stamps its heartbeat every LOST_WORK_HEARTBEAT_SECONDS from
a thread of its own. A worker that dies (killed, out of memory, its machine gone) stops
stamping; once a claim is older than LOST_WORK_AFTER_SECONDS the job is *lost*:

- ``sweep_lost_work`` (beat, every minute) ends each lost job through its kind's own failure
  path (``ENDINGS``: the one that releases what the job held — a probe's hold on its
  deployment, an operation's, a prediction's sweep), saying when its worker was last heard
  of; and, in the same pass, resumes what resumes (a change's pipeline, a sweep's lanes),
  fails benchmarks that went silent and retries pending restores of sweeps' configs;
- a cancel of a lost job ends it at once (``is_lost``) instead of asking a worker that will
  never read the request.

A job that never had a claim (a benchmark a change's pipeline runs inline, rows from before
claims) is left to its own owner: its pipeline's heartbeat, or a benchmark's silence check.
The claim's heartbeat is filtered by its owner, so a worker thought lost that comes back
writes nothing over the sweep's ending (the row's state machine refuses a second end).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.apps import apps
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from controlpanel.heartbeat import Heartbeat
from controlpanel.models import WorkClaim

log = logging.getLogger(__name__)

# How each kind of job is ended when its worker is lost: its own failure path, called as
# ``end(row, why)``. Fixed here (never read from the database): a kind not listed keeps its
# claim for the record but is not ended by the sweep.
ENDINGS: dict[str, str] = {
    "benchmarks.benchmarkrun": "benchmarks.services.runs.fail_run",
    "benchmarks.proberun": "benchmarks.services.probes.fail_probe",
    "benchmarks.importjob": "benchmarks.services.imports.fail_import",
    "hosts.engineoperation": "hosts.services.operations.fail_operation",
    "hosts.hostcheck": "hosts.services.checks.fail_host_check",
    "scaling.whatifplan": "scaling.services.whatif.fail_plan",
    "changes.sweep": "changes.services.sweep_prediction.fail_lost_prediction",
}


FORGOTTEN_AFTER = timedelta(days=1)


def kind_of(row) -> str:
    return row._meta.label_lower


def owner_name() -> str:
    """This worker: its machine, process and thread (the embedded worker runs jobs in
    threads of one process)."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def stale_after() -> timedelta:
    return timedelta(seconds=float(settings.LOST_WORK_AFTER_SECONDS))


@contextmanager
def claimed(row):
    """Hold a claim on ``row`` while the block runs, its heartbeat stamped from a thread.
    A claim a lost worker left on the row is taken over (the task was redelivered)."""
    kind, owner = kind_of(row), owner_name()
    now = timezone.now()
    try:
        with transaction.atomic():
            WorkClaim.objects.update_or_create(
                kind=kind,
                object_id=row.pk,
                defaults={"owner": owner, "claimed_at": now, "heartbeat_at": now},
            )
    except IntegrityError:  # a claim made at the same instant by a second delivery
        WorkClaim.objects.filter(kind=kind, object_id=row.pk).update(owner=owner, heartbeat_at=now)
    mine = WorkClaim.objects.filter(kind=kind, object_id=row.pk, owner=owner)
    try:
        with Heartbeat(
            mine, "heartbeat_at", float(settings.LOST_WORK_HEARTBEAT_SECONDS), f"claim-{kind}"
        ):
            yield
    finally:
        mine.delete()


def claim_of(row) -> WorkClaim | None:
    return WorkClaim.objects.filter(kind=kind_of(row), object_id=row.pk).first()


def lost_claim(row, now: datetime | None = None) -> WorkClaim | None:
    """``row``'s claim when the worker that holds it stopped answering, else None."""
    claim = claim_of(row)
    if claim is not None and claim.heartbeat_at < (now or timezone.now()) - stale_after():
        return claim
    return None


def is_lost(row, now: datetime | None = None) -> bool:
    """Whether ``row``'s job was claimed by a worker that stopped answering."""
    return lost_claim(row, now) is not None


def release(row) -> None:
    """Drop ``row``'s claim: its job was ended here (a cancel of a lost job)."""
    WorkClaim.objects.filter(kind=kind_of(row), object_id=row.pk).delete()


def lost_text(claim: WorkClaim, now: datetime | None = None) -> str:
    ago = ((now or timezone.now()) - claim.heartbeat_at).total_seconds()
    return (
        f"its worker ({claim.owner}) stopped answering: last heard of at "
        f"{claim.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC, {ago:.0f} s ago; the job was ended, "
        "not finished"
    )


def end_lost(now: datetime | None = None) -> list[str]:
    """End every job whose claim went stale, through its kind's failure path. Returns what
    was ended ("kind #id"), for the beat's result and the tests."""
    now = now or timezone.now()
    ended = []
    for claim in WorkClaim.objects.filter(heartbeat_at__lt=now - stale_after()).order_by("pk"):
        path = ENDINGS.get(claim.kind)
        if path is None:
            continue
        model = apps.get_model(*claim.kind.split(".", 1))
        row = model.objects.filter(pk=claim.object_id).first()
        try:
            if row is not None:
                import_string(path)(row, lost_text(claim, now))
                ended.append(f"{claim.kind} #{claim.object_id}")
        except Exception:  # noqa: BLE001 - one broken ending must not stop the others
            log.exception("lost work: ending %s failed", claim)
            continue
        # Gone only if no worker took it over meanwhile (its heartbeat is fresh again).
        WorkClaim.objects.filter(pk=claim.pk, heartbeat_at__lt=now - stale_after()).delete()
    # The claims of work that resumes on its own (a pipeline, a lane) are replaced when it
    # does; one silent for a day belongs to work that ended another way: only a record.
    WorkClaim.objects.filter(heartbeat_at__lt=now - FORGOTTEN_AFTER).exclude(
        kind__in=list(ENDINGS)
    ).delete()
    return ended


# The other passes of the one sweep, each its app's own (named, not imported: the apps sit
# above this package). Each returns what it did (a list or a count).
PASSES: dict[str, str] = {
    "benchmarks_failed": "benchmarks.services.runs.fail_stale_runs",
    "imports_failed": "benchmarks.services.imports.fail_stale_imports",
    "pipelines_resumed": "changes.services.apply.resume_lost_pipelines",
    "lanes_resumed": "changes.services.sweep_trials.resume_lost_lanes",
    "restores_retried": "changes.services.sweep_trials.retry_pending_restores",
}


def sweep_lost_work() -> dict:
    """The one lost-work sweep (beat, every minute): lost claimed jobs ended; a change's
    pipeline and a sweep's lanes whose worker is gone resumed on another; benchmarks gone
    silent failed; pending restores of sweeps' configs retried when due. Returns a count per
    pass; a pass that raised is logged and counted as None, the others still run."""
    out: dict = {"ended": end_lost()}
    for name, path in PASSES.items():
        try:
            done = import_string(path)()
        except Exception:  # noqa: BLE001 - one broken pass must not stop the others
            log.exception("lost work: %s failed", name)
            out[name] = None
            continue
        out[name] = done if isinstance(done, int) else len(done)
    return out
