"""Workflows of the hosts app: verbs that change the fleet, each writing the audit log.

Reaching a host goes through ``transport_for(host)`` (agent or SSH, hosts/transport/); what a
host reports lands on its rows here: status, inventory (``Gpu`` rows), telemetry samples, and
the engine operations that apply configs and restart engines.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Avg, Count, Max, Min, Q
from django.db.models.functions import TruncMinute
from django.utils import timezone

from controlpanel.choices import OperationStatus
from controlpanel.crypto import DecryptionError, reveal
from controlpanel.realtime import group_name, publish
from controlpanel.services import audit, snapshot
from hosts.choices import (
    DeploymentStatus,
    HostStatus,
    OperationKind,
    OperationOutcome,
    TransportKind,
)
from hosts.models import (
    ACTIVE_STATUSES,
    Deployment,
    EngineConfig,
    EngineOperation,
    Gpu,
    GpuSample,
    GpuSampleMinute,
    Host,
    HostCheck,
    clock_events,
)
from hosts.transport.base import (
    GPU_READING_FIELDS,
    AuthError,
    HostKeyMismatch,
    HostKeyUnknown,
    Transport,
    TransportError,
)

log = logging.getLogger(__name__)

HOST_FIELDS = [
    "name",
    "address",
    "transport",
    "port",
    "labels",
    "hourly_price",
    "description",
    "agent_tls",
    "ssh_username",
    "ssh_python",
    "ssh_host_key_fingerprint",
]
# Secrets are audited as "changed", never with their values.
SECRET_FIELDS = ["agent_token", "ssh_private_key", "ssh_key_passphrase"]


def _stored(host: Host) -> dict:
    # Read back from the database so both sides of a diff have the stored precision
    # (a form's Decimal("2.5") is stored as 2.5000).
    return snapshot(Host.objects.get(pk=host.pk), HOST_FIELDS)


def create_host(actor, form) -> Host:
    with transaction.atomic():
        host = form.save()
        audit(actor, "host.create", host, after=_stored(host))
    return host


def update_host(actor, host: Host, form) -> Host:
    with transaction.atomic():
        before = _stored(host)
        secrets_before = _secret_marks(host.pk)
        host = form.save(commit=False)
        if any(before[f] != getattr(host, f) for f in ("address", "port", "transport")):
            # Another address may be another machine: its key must be accepted again.
            host.ssh_host_key_fingerprint = ""
            host.status = HostStatus.UNKNOWN
        host.save()
        form.save_m2m()
        after = _stored(host)
        changed = [k for k, v in _secret_marks(host.pk).items() if v != secrets_before[k]]
        if changed:
            after["secrets_changed"] = changed
        if after != before:
            audit(actor, "host.update", host, before=before, after=after)
    _forget_transport(host.pk)
    return host


def _secret_marks(pk) -> dict:
    # The stored ciphertexts: they differ exactly when a secret was replaced.
    return dict(
        zip(
            SECRET_FIELDS,
            Host.objects.filter(pk=pk).values_list(*SECRET_FIELDS).first() or [None] * 3,
            strict=True,
        )
    )


def accept_host_key(actor, host: Host) -> Host:
    """An admin trusts the key the host offered (first contact, or a reinstalled server)."""
    with transaction.atomic():
        host = Host.objects.select_for_update().get(pk=host.pk)
        if not host.ssh_offered_fingerprint:
            raise ValueError("The host has not offered a key: test the connection first.")
        before = {"ssh_host_key_fingerprint": host.ssh_host_key_fingerprint}
        host.ssh_host_key_fingerprint = host.ssh_offered_fingerprint
        host.ssh_offered_fingerprint = ""
        host.status = HostStatus.UNKNOWN
        host.last_error = ""
        host.save(
            update_fields=[
                "ssh_host_key_fingerprint",
                "ssh_offered_fingerprint",
                "status",
                "last_error",
            ]
        )
        audit(
            actor,
            "host.accept_host_key",
            host,
            before=before,
            after={"ssh_host_key_fingerprint": host.ssh_host_key_fingerprint},
        )
    _forget_transport(host.pk)
    return host


# --- transports -------------------------------------------------------------------------------
def transport_for(host: Host, deployment: Deployment | None = None) -> Transport:
    """A transport to ``host`` built from its stored settings (secrets decrypted here only).
    Over SSH, how engines are launched is the deployment's choice: operations pass theirs."""
    timeout = settings.TRANSPORT_TIMEOUT
    try:
        if host.transport == TransportKind.SSH:
            from hosts.transport.ssh import SshTransport

            key = reveal(host.ssh_private_key)
            if key.startswith("file:"):
                key = _read_key_file(key[5:])
            return SshTransport(
                host.address.strip("[]"),
                host.port,
                host.ssh_username,
                private_key=key,
                passphrase=reveal(host.ssh_key_passphrase) or None,
                host_key_fingerprint=host.ssh_host_key_fingerprint or None,
                launch_style=deployment.launch_style if deployment else _ssh_launch_style(host),
                docker_image=(deployment.docker_image or None) if deployment else None,
                python=host.ssh_python or "python3",
                remote_dir=settings.SSH_REMOTE_DIR,
                connect_timeout=timeout,
                command_timeout=max(timeout, 30.0),
            )
        from hosts.transport.agent import AgentTransport

        return AgentTransport(
            host.address.strip("[]"),
            host.port,
            reveal(host.agent_token),
            tls=host.agent_tls,
            ca_cert=host.agent_ca_cert or None,
            timeout=timeout,
        )
    except DecryptionError as exc:
        raise TransportError(str(exc)) from None


def _read_key_file(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise TransportError(f"cannot read the SSH key file {path}: {exc.strerror}") from None


def _ssh_launch_style(host: Host) -> str:
    # Reading telemetry and engine states: the style the host's engines share (only how
    # engines are found differs between styles, not what is read).
    styles = {d.launch_style for d in host.deployments.all()}
    return styles.pop() if len(styles) == 1 else "process"


# The poller keeps one transport per host per worker process (an SSH handshake a second
# would cost more than the reading); operations open their own.
_poll_transports: dict[int, tuple[datetime, Transport]] = {}
_poll_lock = threading.Lock()


def _poll_transport(host: Host) -> Transport:
    with _poll_lock:
        cached = _poll_transports.get(host.pk)
        if cached and cached[0] == host.updated_at:
            return cached[1]
    transport = transport_for(host)
    with _poll_lock:
        old = _poll_transports.pop(host.pk, None)
        _poll_transports[host.pk] = (host.updated_at, transport)
    if old:
        old[1].close()
    return transport


def _forget_transport(pk: int) -> None:
    with _poll_lock:
        old = _poll_transports.pop(pk, None)
    if old:
        old[1].close()


def request_host_check(actor, host: Host) -> HostCheck:
    """Queue a reachability check; the worker picks it up once this transaction commits."""
    from hosts.tasks import check_host

    with transaction.atomic():
        check = HostCheck.objects.create(host=host, requested_by=actor)
        if actor is not None:
            audit(actor, "host.check", host)
        transaction.on_commit(lambda: check_host.delay(check.pk))
    _publish_check(check)
    return check


def run_host_check(check: HostCheck) -> HostCheck:
    """Open a TCP connection to the host's transport port and record what happened."""
    check.transition_to(OperationStatus.RUNNING)
    _publish_check(check)
    host = check.host
    started = time.perf_counter()
    try:
        with socket.create_connection(
            (host.address.strip("[]"), host.port), timeout=settings.HOST_CHECK_TIMEOUT
        ):
            pass
    except OSError as exc:
        check.reachable = False
        check.detail = _describe(exc, host)[:300]
        _set_status(host, HostStatus.UNREACHABLE, check.detail)
    else:
        check.reachable = True
        check.latency_ms = round((time.perf_counter() - started) * 1000, 3)
        check.detail = f"{host.transport} port {host.port} answered in {check.latency_ms} ms"
        if host.has_credentials or host.transport == TransportKind.SSH:
            check.detail = (check.detail + "; " + _test_transport(host))[:300]
    check.save(update_fields=["reachable", "latency_ms", "detail"])
    check.transition_to(OperationStatus.SUCCEEDED)
    _publish_check(check)
    return check


def _test_transport(host: Host) -> str:
    """Talk to the host for real: identity, then inventory. Says what happened in one line."""
    if host.transport == TransportKind.SSH and not host.ssh_host_key_fingerprint:
        from hosts.transport.ssh import fetch_host_key

        try:
            fingerprint, key_type = fetch_host_key(
                host.address.strip("[]"), host.port, settings.TRANSPORT_TIMEOUT
            )
        except TransportError as exc:
            _set_status(host, HostStatus.ERROR, str(exc))
            return f"SSH handshake failed: {exc}"
        _offer_host_key(host, HostKeyUnknown(fingerprint, key_type))
        return f"first contact: the host key is {key_type} {fingerprint}; an admin must accept it"
    if not host.has_credentials:
        return "no credentials stored"
    try:
        with transport_for(host) as transport:
            info = transport.info()
            refresh_inventory(host, transport.inventory())
    except HostKeyMismatch as exc:
        _offer_host_key(host, exc)
        return str(exc)
    except AuthError as exc:
        _set_status(host, HostStatus.AUTH_FAILED, str(exc))
        return f"credentials refused: {exc}"
    except TransportError as exc:
        _set_status(host, HostStatus.ERROR, str(exc))
        return f"connection failed: {exc}"
    host.agent_version = info.get("agent_version") or ""
    host.libraries = reported_libraries(info.get("libraries"))
    host.save(update_fields=["agent_version", "libraries"])
    source = info.get("telemetry_source") or "none"
    gpus = host.gpus.count()
    where = f"{info.get('kind', host.transport)} on {info.get('hostname', '?')}"
    return f"{where}: {gpus} GPU(s), telemetry from {source}"


def reported_libraries(value) -> dict[str, str]:
    """A host's ``{package: version}`` as stored: strings, bounded, whatever the host sent."""
    if not isinstance(value, dict):
        return {}
    return {str(name)[:100]: str(version)[:60] for name, version in list(value.items())[:50]}


def _offer_host_key(host: Host, exc: HostKeyUnknown | HostKeyMismatch) -> None:
    if isinstance(exc, HostKeyMismatch):
        host.ssh_offered_fingerprint = exc.presented
        status = HostStatus.HOST_KEY_CHANGED
    else:
        host.ssh_offered_fingerprint = exc.fingerprint
        host.ssh_offered_key_type = exc.key_type
        status = HostStatus.HOST_KEY
    host.save(update_fields=["ssh_offered_fingerprint", "ssh_offered_key_type"])
    _set_status(host, status, str(exc))
    if isinstance(exc, HostKeyMismatch):
        log.error("host %s: %s", host.name, exc)
        audit(None, "host.host_key_changed", host, after={"presented": exc.presented})


def _set_status(host: Host, status: HostStatus, error: str = "") -> None:
    now = timezone.now()
    host.status = status
    host.last_error = error[:500]
    fields = ["status", "last_error", "last_poll_at"]
    host.last_poll_at = now
    if status == HostStatus.ONLINE:
        host.last_seen_at = now
        fields.append("last_seen_at")
    Host.objects.filter(pk=host.pk).update(**{f: getattr(host, f) for f in fields})
    publish(
        group_name("host", host.pk),
        "host.status",
        {"status": host.status, "label": host.get_status_display(), "error": host.last_error},
    )


# --- inventory ---------------------------------------------------------------------------------
def refresh_inventory(host: Host, inventory: dict) -> list[Gpu]:
    """Create or update the host's ``Gpu`` rows and facts from what the host reported.
    GPUs are matched by UUID (a GPU moved to another slot keeps its history); GPUs the host
    no longer reports are kept (their samples are history) but lose their index claim."""
    with transaction.atomic():
        host = Host.objects.select_for_update().get(pk=host.pk)
        seen = []
        for item in inventory.get("gpus") or []:
            uuid = str(item.get("uuid") or f"{host.name}-gpu{item['index']}")[:64]
            gpu = Gpu.objects.filter(uuid=uuid).first()
            # The slot may still be held by a GPU that was swapped out: free it.
            Gpu.objects.filter(host=host, index=item["index"]).exclude(uuid=uuid).delete()
            if gpu is None:
                gpu = Gpu(uuid=uuid)
            gpu.host = host
            gpu.index = item["index"]
            gpu.name = (item.get("name") or "unknown GPU")[:100]
            gpu.memory_bytes = int(item.get("memory_total_bytes") or 0)
            gpu.numa_node = item.get("numa_node")
            gpu.cpu_affinity = (item.get("cpu_affinity") or "")[:200]
            gpu.save()
            seen.append(gpu)
        host.hostname = (inventory.get("hostname") or "")[:255]
        host.driver_version = (inventory.get("driver_version") or "")[:40]
        host.cuda_version = (inventory.get("cuda_version") or "")[:40]
        host.cpu_count = inventory.get("cpu_count")
        host.cpu_model = (inventory.get("cpu_model") or "")[:200]
        host.memory_total_bytes = inventory.get("memory_total_bytes")
        host.numa_nodes = inventory.get("numa_nodes") or []
        host.telemetry_source = (inventory.get("source") or "")[:20]
        host.telemetry_note = (inventory.get("note") or "")[:300]
        host.inventory_at = timezone.now()
        host.save(
            update_fields=[
                "hostname",
                "driver_version",
                "cuda_version",
                "cpu_count",
                "cpu_model",
                "memory_total_bytes",
                "numa_nodes",
                "telemetry_source",
                "telemetry_note",
                "inventory_at",
            ]
        )
    _set_status(host, HostStatus.ONLINE)
    return seen


# --- telemetry ---------------------------------------------------------------------------------
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
ENGINE_STATES = {
    "ready": DeploymentStatus.RUNNING,
    "starting": DeploymentStatus.STARTING,
    "stopped": DeploymentStatus.STOPPED,
    "failed": DeploymentStatus.FAILED,
}
POLL_BACKOFF = timedelta(seconds=15)  # how often a host that is down is tried again


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
    from django.db import connection

    try:
        return _poll_one(host)
    finally:
        connection.close()  # the pool thread's own connection


def _poll_one(host: Host) -> int:
    try:
        try:
            reading = _poll_transport(host).telemetry()
        except HostKeyMismatch as exc:
            _forget_transport(host.pk)
            _offer_host_key(host, exc)
            return 0
        except AuthError as exc:
            _forget_transport(host.pk)
            _set_status(host, HostStatus.AUTH_FAILED, str(exc))
            return 0
        except TransportError as exc:
            _forget_transport(host.pk)
            _set_status(host, HostStatus.UNREACHABLE, str(exc))
            return 0
        return record_telemetry(host, reading)
    except Exception:
        log.exception("telemetry of %s failed", host.name)
        return 0


def record_telemetry(host: Host, reading: dict, *, when: datetime | None = None) -> int:
    """Store one telemetry reading: a ``GpuSample`` per GPU, the latest reading on each
    ``Gpu``, host readings and engine states; then tell the host's live page."""
    when = when or (
        datetime.fromtimestamp(reading["time"], tz=UTC) if reading.get("time") else timezone.now()
    )
    gpus = {g.uuid: g for g in host.gpus.all()}
    by_index = {g.index: g for g in gpus.values()}
    if any(
        (item.get("uuid") not in gpus and item.get("index") not in by_index)
        for item in reading.get("gpus") or []
    ):
        # A GPU we have not seen: learn the inventory first (rare: new host, swapped card).
        try:
            with transport_for(host) as transport:
                refresh_inventory(host, transport.inventory())
        except TransportError as exc:
            log.warning("inventory of %s failed: %s", host.name, exc)
        gpus = {g.uuid: g for g in Gpu.objects.filter(host=host)}  # not the prefetched list
        by_index = {g.index: g for g in gpus.values()}
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
        _set_status(host, HostStatus.ONLINE)
    else:
        Host.objects.filter(pk=host.pk).update(last_seen_at=when, last_poll_at=when)
    publish(
        group_name("host", host.pk),
        "telemetry",
        {"t": int(when.timestamp() * 1000), "gpus": live, "host": reading.get("host") or {}},
    )
    return len(samples)


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
        "throttle_reasons": clock_events(item.get("throttle_reasons")),
    }


def _engine_states(host: Host, engines: dict, when: datetime, holders: dict) -> None:
    busy = set(
        EngineOperation.objects.filter(
            deployment__host=host, status__in=ACTIVE_STATUSES
        ).values_list("deployment_id", flat=True)
    )
    for deployment in host.deployments.all():
        state = engines.get(deployment.name)
        if state is None:
            continue  # not known to the host
        # Which GPUs the engine really uses: those whose processes are the engine's.
        pids = set(state.get("pids") or []) - {None}
        used = sorted(pk for pk, procs in holders.items() if pids & procs)
        if used and used != sorted(g.pk for g in deployment.gpus.all()):
            deployment.gpus.set(used)
        if deployment.pk in busy:
            continue  # an operation owns the status right now
        status = ENGINE_STATES.get(state.get("state"), DeploymentStatus.UNKNOWN)
        if status != deployment.status:
            Deployment.objects.filter(pk=deployment.pk).update(status=status, status_at=when)


def downsample_telemetry(now: datetime | None = None) -> dict:
    """Fold 1-second samples into 1-minute aggregates, then forget what is past retention:
    raw samples after ``TELEMETRY_RAW_RETENTION_MINUTES``, minutes after
    ``TELEMETRY_MINUTE_RETENTION_DAYS``. Idempotent: a minute is recomputed, not added twice."""
    now = now or timezone.now()
    this_minute = now.replace(second=0, microsecond=0)
    # Everything since the newest stored minute (inclusive: late samples of that minute) and
    # nothing of the minute still filling. After a pause of the scheduler this picks up the
    # backlog, so raw rows are never deleted unaggregated.
    newest = GpuSampleMinute.objects.aggregate(m=Max("minute"))["m"]
    raw = GpuSample.objects.filter(time__lt=this_minute)
    if newest is not None:
        raw = raw.filter(time__gte=newest)
    rows = (
        raw.annotate(m=TruncMinute("time"))
        .values("gpu_id", "m")
        .annotate(
            n=Count("id"),
            util_avg=Avg("utilization_pct"),
            util_max=Max("utilization_pct"),
            mem_max=Max("memory_used_bytes"),
            power_avg=Avg("power_w"),
            power_max=Max("power_w"),
            temp_max=Max("temperature_c"),
            sm_avg=Avg("sm_clock_mhz"),
            sm_min=Min("sm_clock_mhz"),
            # Idle is bit 0x1: any other reason makes the mask 2 or more.
            throttled=Count("id", filter=Q(clocks_event_reasons__gt=1)),
        )
    )
    minutes = [
        GpuSampleMinute(
            gpu_id=r["gpu_id"],
            minute=r["m"],
            samples=r["n"],
            utilization_avg=r["util_avg"],
            utilization_max=r["util_max"],
            memory_used_max=r["mem_max"],
            power_avg=r["power_avg"],
            power_max=r["power_max"],
            temperature_max=r["temp_max"],
            sm_clock_avg=r["sm_avg"],
            sm_clock_min=r["sm_min"],
            throttled_samples=r["throttled"],
        )
        for r in rows
    ]
    GpuSampleMinute.objects.bulk_create(
        minutes,
        batch_size=500,
        update_conflicts=True,
        unique_fields=["gpu", "minute"],
        update_fields=[
            "samples",
            "utilization_avg",
            "utilization_max",
            "memory_used_max",
            "power_avg",
            "power_max",
            "temperature_max",
            "sm_clock_avg",
            "sm_clock_min",
            "throttled_samples",
        ],
    )
    raw_cutoff = now - timedelta(minutes=settings.TELEMETRY_RAW_RETENTION_MINUTES)
    raw_deleted, _ = GpuSample.objects.filter(time__lt=min(raw_cutoff, this_minute)).delete()
    minute_cutoff = now - timedelta(days=settings.TELEMETRY_MINUTE_RETENTION_DAYS)
    minutes_deleted, _ = GpuSampleMinute.objects.filter(minute__lt=minute_cutoff).delete()
    return {
        "aggregated": len(minutes),
        "raw_deleted": raw_deleted,
        "minutes_deleted": minutes_deleted,
    }


# --- engine operations -------------------------------------------------------------------------
class OperationRefused(Exception):
    """An operation that cannot start (another one runs, nothing to apply, bad config)."""


def request_operation(
    actor,
    deployment: Deployment,
    kind: str,
    config: EngineConfig | None = None,
    *,
    enqueue: bool = True,
) -> EngineOperation:
    """Queue an apply or restart: one at a time per deployment (row lock + the table's
    partial unique constraint); the worker picks it up once this transaction commits.
    ``enqueue=False`` only records the row, for a caller already on a worker that runs it
    itself (``run_operation``), such as a change's apply pipeline."""
    from hosts import tasks

    try:
        with transaction.atomic():
            deployment = Deployment.objects.select_for_update().get(pk=deployment.pk)
            active = deployment.operations.filter(status__in=ACTIVE_STATUSES).first()
            if active is not None:
                raise OperationRefused(_busy(active))
            if kind == OperationKind.APPLY:
                if config is None or config.deployment_id != deployment.pk:
                    raise OperationRefused("Choose a config version of this deployment.")
            else:
                config = deployment.active_config
                if config is None:
                    raise OperationRefused("The deployment has no config to restart with.")
            operation = EngineOperation.objects.create(
                deployment=deployment,
                kind=kind,
                config=config,
                previous_config=deployment.active_config,
                requested_by=actor,
            )
            audit(
                actor,
                f"deployment.{kind}",
                deployment,
                after={"operation": operation.pk, "config_version": config.version},
            )
            if enqueue:
                task = tasks.apply_config if kind == OperationKind.APPLY else tasks.restart_engine
                transaction.on_commit(lambda: task.delay(operation.pk))
    except IntegrityError:
        # Another request won the race between our check and our insert.
        active = deployment.operations.filter(status__in=ACTIVE_STATUSES).first()
        raise OperationRefused(
            _busy(active) if active else "Another operation just started."
        ) from None
    _publish_operation(operation)
    return operation


def _busy(active: EngineOperation) -> str:
    who = active.requested_by or "the system"
    state = active.get_status_display().lower()
    return (
        f"{active.get_kind_display()} #{active.pk} by {who} is {state} on "
        f"{active.deployment}: one operation at a time per deployment."
    )


def run_operation(operation: EngineOperation) -> EngineOperation:
    """The worker's part: apply (or restart) through the host's transport, roll back on
    failure (the transport restarts the previous config), record everything on the row."""
    deployment = operation.deployment
    if operation.status == OperationStatus.RUNNING:
        return _resume_after_crash(operation)
    operation.transition_to(OperationStatus.RUNNING)
    _publish_operation(operation)
    config = operation.config
    previous = operation.previous_config
    try:
        launch = config.launch_config().validated()
    except ValueError as exc:  # LaunchError: nothing was sent to the host
        operation.append_log(f"refused before contacting the host: {exc}")
        return _finish(operation, OperationOutcome.FAILED, f"invalid config: {exc}", [])
    rollback = None
    if previous is not None and previous.pk != config.pk:
        try:
            rollback = previous.launch_config().validated()
        except ValueError:
            rollback = None  # an old config the current rules refuse cannot be rolled back to
    _set_deployment(deployment, DeploymentStatus.STARTING, f"{operation} running")
    verb = "applying" if operation.kind == OperationKind.APPLY else "restarting with"
    operation.append_log(f"{verb} v{config.version} on {deployment.host}")
    timeout = settings.ENGINE_READY_TIMEOUT
    try:
        with transport_for(deployment.host, deployment) as transport:
            if operation.kind == OperationKind.APPLY:
                outcome = transport.apply_config(
                    deployment.name, launch, previous=rollback, ready_timeout_s=timeout
                )
            else:
                outcome = transport.restart_engine(deployment.name, ready_timeout_s=timeout)
    except TransportError as exc:
        operation.append_log(f"transport error: {exc}")
        _set_deployment(
            deployment, DeploymentStatus.UNKNOWN, f"host unreachable mid-operation: {exc}"
        )
        return _finish(operation, OperationOutcome.FAILED, f"{type(exc).__name__}: {exc}", [])
    operation.append_log(
        f"engine {outcome.state}" + (f": {outcome.error}" if outcome.error else "")
    )
    if outcome.ok:
        with transaction.atomic():
            before = deployment.active_config_id
            Deployment.objects.filter(pk=deployment.pk).update(active_config=config)
            if operation.kind == OperationKind.APPLY and before != config.pk:
                audit(
                    operation.requested_by,
                    "deployment.config_active",
                    deployment,
                    before={"config_version": previous.version if previous else None},
                    after={"config_version": config.version},
                )
        _set_deployment(deployment, DeploymentStatus.RUNNING, f"v{config.version} ready")
        return _finish(operation, OperationOutcome.READY, "", outcome.log_lines)
    if outcome.state == "rolled_back":
        back = f"back on v{previous.version}" if previous else "rolled back"
        _set_deployment(deployment, DeploymentStatus.RUNNING, f"v{config.version} failed; {back}")
        return _finish(
            operation, OperationOutcome.ROLLED_BACK, outcome.error or "not ready", outcome.log_lines
        )
    _set_deployment(deployment, DeploymentStatus.FAILED, outcome.error or "engine failed")
    return _finish(operation, OperationOutcome.FAILED, outcome.error or "failed", outcome.log_lines)


def _finish(operation, outcome: OperationOutcome, error: str, lines: list[str]):
    operation.outcome = outcome
    operation.engine_log = "\n".join(lines)[-20000:]
    operation.save(update_fields=["outcome", "engine_log"])
    if outcome == OperationOutcome.READY:
        operation.transition_to(OperationStatus.SUCCEEDED)
    else:
        operation.transition_to(OperationStatus.FAILED, error=error[:2000] or outcome.label)
    _publish_operation(operation)
    return operation


def _resume_after_crash(operation: EngineOperation) -> EngineOperation:
    """A redelivered task finds its row running: the worker died mid-operation. Ask the host
    what runs now and close the record with that, so nothing is left unexplained."""
    deployment = operation.deployment
    try:
        with transport_for(deployment.host, deployment) as transport:
            status = transport.engine_status(deployment.name)
    except TransportError as exc:
        state, detail = "unknown", f"host unreachable: {exc}"
    else:
        state, detail = status.get("state", "unknown"), status.get("error") or ""
    operation.append_log(f"the worker stopped mid-operation; the engine is {state} {detail}")
    _set_deployment(
        deployment,
        ENGINE_STATES.get(state, DeploymentStatus.UNKNOWN),
        f"interrupted {operation}; engine {state}",
    )
    return _finish(
        operation,
        OperationOutcome.FAILED,
        f"the worker stopped during the operation; the engine was found {state}",
        status.get("last_lines", []) if state != "unknown" else [],
    )


def fail_operation(operation: EngineOperation, error: str) -> None:
    operation.refresh_from_db()
    if not operation.is_finished:
        operation.append_log(error)
        _set_deployment(operation.deployment, DeploymentStatus.UNKNOWN, error)
        _finish(operation, OperationOutcome.FAILED, error, [])


def _set_deployment(deployment: Deployment, status: DeploymentStatus, detail: str) -> None:
    Deployment.objects.filter(pk=deployment.pk).update(
        status=status, status_detail=detail[:500], status_at=timezone.now()
    )
    deployment.status, deployment.status_detail = status, detail[:500]
    publish(
        group_name("host", deployment.host_id),
        "deployment.updated",
        {"id": deployment.pk, "status": status, "detail": detail[:500]},
    )


def _publish_operation(operation: EngineOperation) -> None:
    publish(
        group_name("host", operation.deployment.host_id), "operation.updated", operation.as_event()
    )


def fail_host_check(check: HostCheck, error: str) -> None:
    """Record an unexpected failure of the check itself (not an unreachable host)."""
    check.refresh_from_db()
    if not check.is_finished:
        check.transition_to(OperationStatus.FAILED, error=error[:2000])
        _publish_check(check)


def check_all_hosts() -> list[HostCheck]:
    """The scheduler's periodic sweep: one check per host, and forget old checks."""
    cutoff = timezone.now() - timedelta(days=settings.HOST_CHECK_RETENTION_DAYS)
    HostCheck.objects.filter(created_at__lt=cutoff).delete()
    return [request_host_check(None, host) for host in Host.objects.all()]


def _describe(exc: OSError, host: Host) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer from {host.address}:{host.port} within {settings.HOST_CHECK_TIMEOUT} s"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve {host.address}: {exc.strerror}"
    return f"{host.address}:{host.port}: {exc.strerror or exc}"


def _publish_check(check: HostCheck) -> None:
    publish(group_name("host", check.host_id), "check.updated", check.as_event())
