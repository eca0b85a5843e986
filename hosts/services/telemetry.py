"""Telemetry: poll every host (in parallel, each through its cached transport), store what a
reading says (GPU samples, the newest reading on each GPU, host readings, engine states), tell
the host's live page, and fold 1-second samples into 1-minute aggregates.

A deployment's status is never left "unknown" once its host answers: each successful poll sets
it to the state the host reports (with the host's reason as the detail), an engine the host
does not know is stopped, and an operation whose host agent was restarted under it (the agent
reports the operation it found interrupted) is closed with that explanation instead of being
waited for.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone

from controlpanel.choices import OperationStatus
from controlpanel.realtime import group_name, publish
from hosts.choices import DeploymentStatus, HostStatus, OperationOutcome
from hosts.models import (
    ACTIVE_STATUSES,
    Deployment,
    EngineOperation,
    Gpu,
    GpuSample,
    GpuSampleHour,
    GpuSampleMinute,
    Host,
    clock_events,
)
from hosts.services import telemetry_hours, telemetry_sql
from hosts.services.hosts import offer_host_key, set_status
from hosts.services.inventory import refresh_inventory
from hosts.services.transports import forget_transport, poll_transport, transport_for
from hosts.transport.base import GPU_READING_FIELDS, AuthError, HostKeyMismatch, TransportError

log = logging.getLogger(__name__)

SAMPLE_FIELDS = {
    # GpuSample field: telemetry key
    "utilization_pct": "utilization_gpu_pct",
    "memory_used_bytes": "memory_used_bytes",
    "power_w": "power_w",
    "power_limit_w": "power_limit_w",
    "temperature_c": "temperature_c",
    "sm_clock_mhz": "sm_clock_mhz",
    "mem_clock_mhz": "mem_clock_mhz",
    "clocks_event_reasons": "clocks_event_reasons",
    "pcie_tx_kbps": "pcie_tx_kbps",
    "pcie_rx_kbps": "pcie_rx_kbps",
}
# What the Gpu row keeps of the newest reading: the measurements (identity and placement
# are columns of their own), and which metrics the driver left out.
LAST_SAMPLE_KEYS = (
    *(
        f
        for f in GPU_READING_FIELDS
        if f not in ("index", "uuid", "name", "numa_node", "cpu_affinity")
    ),
    "missing",
)
ENGINE_STATES = {
    "ready": DeploymentStatus.RUNNING,
    "starting": DeploymentStatus.STARTING,
    "stopped": DeploymentStatus.STOPPED,
    "failed": DeploymentStatus.FAILED,
    # The agent found the engine's port held by another process, or a process it did not
    # trust to be the engine: it does not serve as the deployment, so it is failed, and the
    # detail names the holder.
    "conflict": DeploymentStatus.FAILED,
}
UNKNOWN_ENGINE = "the host does not know this engine: nothing runs under its name"
POLL_BACKOFF = timedelta(seconds=15)  # how often a host that is down is tried again


# --- polling -----------------------------------------------------------------------------------
def poll_telemetry() -> int:
    """The beat task's body: one reading from every host that can be asked, in parallel."""
    now = timezone.now()
    hosts = [
        host
        for host in Host.objects.prefetch_related("gpus", "deployments__gpus")
        if host.has_credentials
        and host.status not in (HostStatus.HOST_KEY, HostStatus.HOST_KEY_CHANGED)
        and (
            host.status == HostStatus.ONLINE
            or host.last_poll_at is None
            or now - host.last_poll_at >= POLL_BACKOFF
        )
    ]
    if len(hosts) <= 1:
        return sum(_poll_one(host) for host in hosts)
    # Hosts answer at their own pace: one slow or unreachable host must not delay the rest.
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        return sum(pool.map(_poll_in_thread, hosts))


def poll_host(host: Host) -> int:
    """One telemetry reading from ``host`` now (a benchmark that finds the samples stale
    because no beat is polling); the same path as beat's, recorded the same way."""
    return _poll_one(host)


def _poll_in_thread(host: Host) -> int:
    try:
        return _poll_one(host)
    finally:
        connection.close()  # the pool thread's own connection


def _poll_one(host: Host) -> int:
    try:
        try:
            with poll_transport(host) as transport:
                reading = transport.telemetry()
        except HostKeyMismatch as exc:
            forget_transport(host.pk)
            offer_host_key(host, exc)
            return 0
        except AuthError as exc:
            forget_transport(host.pk)
            set_status(host, HostStatus.AUTH_FAILED, str(exc))
            return 0
        except TransportError as exc:
            forget_transport(host.pk)
            set_status(host, HostStatus.UNREACHABLE, str(exc))
            return 0
        return record_telemetry(host, reading)
    except Exception:
        log.exception("telemetry of %s failed", host.name)
        return 0


# --- recording ---------------------------------------------------------------------------------
def record_telemetry(host: Host, reading: dict, *, when: datetime | None = None) -> int:
    """Store one telemetry reading: a ``GpuSample`` per GPU, the latest reading on each
    ``Gpu``, host readings and engine states; then tell the host's live page."""
    when = when or (
        datetime.fromtimestamp(reading["time"], tz=UTC) if reading.get("time") else timezone.now()
    )
    gpus, by_index = _known_gpus(host, reading)
    samples, live = [], []
    holders: dict[int, set[int]] = {}  # GPU pk → pids of the processes using it
    for item in reading.get("gpus") or []:
        gpu = gpus.get(item.get("uuid")) or by_index.get(item.get("index"))
        if gpu is None:
            continue
        holders[gpu.pk] = {p.get("pid") for p in item.get("processes") or []}
        samples.append(
            GpuSample(gpu=gpu, time=when, **{f: item.get(k) for f, k in SAMPLE_FIELDS.items()})
        )
        gpu.last_sample = {k: item.get(k) for k in LAST_SAMPLE_KEYS}
        gpu.last_sample_at = when
        live.append(_live_point(gpu, item))
    with transaction.atomic():
        GpuSample.objects.bulk_create(samples)
        Gpu.objects.bulk_update(
            [s.gpu for s in samples], ["last_sample", "last_sample_at"], batch_size=100
        )
        Host.objects.filter(pk=host.pk).update(
            host_readings=reading.get("host") or {},
            telemetry_source=(reading.get("source") or "")[:20],
            telemetry_note=(reading.get("note") or "")[:300],
        )
        _engine_states(host, reading.get("engines") or {}, when, holders)
    if host.status != HostStatus.ONLINE:
        set_status(host, HostStatus.ONLINE)
    else:
        Host.objects.filter(pk=host.pk).update(last_seen_at=when, last_poll_at=when)
    publish(
        group_name("host", host.pk),
        "telemetry",
        {"t": int(when.timestamp() * 1000), "gpus": live, "host": reading.get("host") or {}},
    )
    return len(samples)


def _known_gpus(host: Host, reading: dict) -> tuple[dict[str, Gpu], dict[int, Gpu]]:
    """The host's GPUs by UUID and by index, learning the inventory first when the reading
    names a GPU we have not seen (rare: a new host, a swapped card)."""
    gpus = {g.uuid: g for g in host.gpus.all()}
    by_index = {g.index: g for g in gpus.values()}
    if any(
        (item.get("uuid") not in gpus and item.get("index") not in by_index)
        for item in reading.get("gpus") or []
    ):
        try:
            with transport_for(host) as transport:
                refresh_inventory(host, transport.inventory())
        except TransportError as exc:
            log.warning("inventory of %s failed: %s", host.name, exc)
        gpus = {g.uuid: g for g in Gpu.objects.filter(host=host)}  # not the prefetched list
        by_index = {g.index: g for g in gpus.values()}
    return gpus, by_index


def _live_point(gpu: Gpu, item: dict) -> dict:
    used = item.get("memory_used_bytes")
    return {
        "gpu": gpu.pk,
        "index": gpu.index,
        "utilization_pct": item.get("utilization_gpu_pct"),
        "memory_used_gib": None if used is None else round(used / 2**30, 2),
        "memory_total_gib": round(gpu.memory_bytes / 2**30, 1),
        "power_w": item.get("power_w"),
        "power_limit_w": item.get("power_limit_w"),
        "temperature_c": item.get("temperature_c"),
        "sm_clock_mhz": item.get("sm_clock_mhz"),
        "mem_clock_mhz": item.get("mem_clock_mhz"),
        "pcie_tx_kbps": item.get("pcie_tx_kbps"),
        "pcie_rx_kbps": item.get("pcie_rx_kbps"),
        "clocks_event_reasons": item.get("clocks_event_reasons"),
        "throttle_reasons": clock_events(item.get("throttle_reasons")),
    }


def _engine_states(host: Host, engines: dict, when: datetime, holders: dict) -> None:
    active = {
        op.deployment_id: op
        for op in EngineOperation.objects.filter(deployment__host=host, status__in=ACTIVE_STATUSES)
    }
    for deployment in host.deployments.all():
        if deployment.status == DeploymentStatus.IN_REVIEW:
            continue  # not started yet: its status is its review's until approved
        state = engines.get(deployment.name)
        if state is None:
            # Never deployed there, or its state was lost with the agent's: nothing runs
            # (what the transports answer for such an engine). "Unknown" does not stay.
            if deployment.pk not in active and deployment.status == DeploymentStatus.UNKNOWN:
                _set_status(deployment, DeploymentStatus.STOPPED, UNKNOWN_ENGINE, when)
            continue
        # Which GPUs the engine really uses: those whose processes are the engine's.
        pids = set(state.get("pids") or []) - {None}
        used = sorted(pk for pk, procs in holders.items() if pids & procs)
        if used and used != sorted(g.pk for g in deployment.gpus.all()):
            deployment.gpus.set(used)
        operation = active.get(deployment.pk)
        if operation is not None and not _close_interrupted(operation, state, host.pk):
            continue  # an operation owns the status right now
        status = ENGINE_STATES.get(state.get("state"), DeploymentStatus.UNKNOWN)
        if status != deployment.status or operation is not None:
            _set_status(deployment, status, engine_detail(state), when)


def engine_detail(state: dict) -> str:
    """The deployment's status detail from what the host says of its engine: the error of a
    failed engine or a conflict, else what the agent did with it when it restarted."""
    name = state.get("state") or "unknown"
    if name == "conflict":
        return f"conflict: {state.get('error') or 'the engine cannot be trusted'}"
    if name == "failed" and state.get("error"):
        return f"failed: {state['error']}"
    if name not in ENGINE_STATES:
        return f"the host reports the engine as {name!r}, which the panel does not know"
    recovery = (state.get("recovery") or {}).get("message")
    return f"engine {name} (agent restarted: {recovery})" if recovery else f"engine {name}"


def _set_status(deployment: Deployment, status: str, detail: str, when: datetime) -> None:
    detail = detail[:500]
    Deployment.objects.filter(pk=deployment.pk).update(
        status=status, status_detail=detail, status_at=when
    )
    deployment.status, deployment.status_detail = status, detail
    publish(
        group_name("host", deployment.host_id),
        "deployment.updated",
        {"id": deployment.pk, "status": status, "detail": detail},
    )


def _close_interrupted(operation: EngineOperation, state: dict, host_pk: int) -> bool:
    """Close ``operation`` when the host agent reports that the operation it ran for it died
    with the agent (killed or restarted mid-operation): nothing will ever finish it, and the
    deployment's status is the engine's again. True when it was closed.

    The agent's operation is this one's when it began after this one did (the agent's clock
    against the panel's; hosts keep time with NTP). One that began earlier is an older
    incident and never closes a newer operation; a lagging agent clock only means the
    worker's own error path (or its redelivery) closes the operation instead."""
    interrupted = state.get("interrupted") or {}
    began = interrupted.get("started_at")
    if operation.status != OperationStatus.RUNNING or operation.started_at is None:
        return False
    if not isinstance(began, (int, float)) or began < operation.started_at.timestamp():
        return False  # no agent operation died since this one started
    engine = state.get("state") or "unknown"
    outcome = interrupted.get("outcome") or "the agent is still recovering the engine"
    error = (
        f"the host agent was restarted during this operation (its {interrupted.get('kind')} "
        f"{interrupted.get('operation')} was interrupted): {outcome}; the engine is {engine}"
    )
    with transaction.atomic():
        row = EngineOperation.objects.select_for_update().filter(pk=operation.pk).first()
        if row is None or row.status != OperationStatus.RUNNING:
            return False  # the worker finished it meanwhile: the next poll takes over
        row.append_log(error)
        row.outcome = OperationOutcome.FAILED
        row.save(update_fields=["outcome"])
        row.transition_to(OperationStatus.FAILED, error=error[:2000])
    publish(group_name("host", host_pk), "operation.updated", row.as_event())
    return True


# --- downsampling ------------------------------------------------------------------------------
def downsample_telemetry(now: datetime | None = None) -> dict:
    """Fold 1-second samples into 1-minute aggregates and whole hours of minutes into 1-hour
    ones (``hosts.services.telemetry_hours``), then forget what is past retention: raw
    samples after ``TELEMETRY_RAW_RETENTION_MINUTES``, minutes after
    ``TELEMETRY_MINUTE_RETENTION_DAYS`` (once in an hour), hours after
    ``TELEMETRY_HOUR_RETENTION_DAYS``. Idempotent: a minute is recomputed, not added twice.

    What is folded: everything since the newest stored minute (inclusive: late samples of
    that minute) and nothing of the minute still filling. After a pause of the scheduler
    this picks up the backlog, so raw rows are never deleted unaggregated. On PostgreSQL the
    roll-up is one ``INSERT … SELECT … GROUP BY`` and the deletes go in bounded chunks
    (``hosts.services.telemetry_sql``)."""
    now = now or timezone.now()
    this_minute = now.replace(second=0, microsecond=0)
    newest = GpuSampleMinute.objects.aggregate(m=Max("minute"))["m"]
    aggregated = telemetry_sql.roll_up(newest, this_minute)
    raw_cutoff = now - timedelta(minutes=settings.TELEMETRY_RAW_RETENTION_MINUTES)
    raw_deleted = telemetry_sql.delete_before(GpuSample, "time", min(raw_cutoff, this_minute))
    hours = telemetry_hours.roll_up_hours(now)
    minute_cutoff = now - timedelta(days=settings.TELEMETRY_MINUTE_RETENTION_DAYS)
    folded = telemetry_hours.folded_until()  # never a minute that is in no hour yet
    minutes_deleted = telemetry_sql.delete_before(
        GpuSampleMinute, "minute", minute_cutoff if folded is None else min(minute_cutoff, folded)
    )
    hour_cutoff = now - timedelta(days=settings.TELEMETRY_HOUR_RETENTION_DAYS)
    hours_deleted = telemetry_sql.delete_before(GpuSampleHour, "hour", hour_cutoff)
    return {
        "aggregated": aggregated,
        "hours": hours,
        "raw_deleted": raw_deleted,
        "minutes_deleted": minutes_deleted,
        "hours_deleted": hours_deleted,
    }
