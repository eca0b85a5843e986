"""Engine operations: apply a config version or restart an engine through the host's
transport, one at a time per deployment, rolling back on failure; the deployment's status and
every step are recorded on the rows and published to the host's live page."""

from __future__ import annotations

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from controlpanel.choices import OperationStatus
from controlpanel.jobs import enqueue_on_commit
from controlpanel.realtime import group_name, publish
from controlpanel.services import audit
from hosts.choices import DeploymentStatus, OperationKind, OperationOutcome
from hosts.engines.launch import LaunchConfig
from hosts.engines.redaction import scrub, secret_values
from hosts.models import ACTIVE_STATUSES, Deployment, EngineConfig, EngineOperation
from hosts.services import occupancy
from hosts.services.telemetry import ENGINE_STATES
from hosts.services.transports import transport_for
from hosts.transport.base import ApplyOutcome, TransportError


class OperationRefused(Exception):
    """An operation that cannot start (another one runs, nothing to apply, bad config)."""


# --- requesting --------------------------------------------------------------------------------
def request_operation(
    actor,
    deployment: Deployment,
    kind: str,
    config: EngineConfig | None = None,
    *,
    enqueue: bool = True,
    owner=None,
    note: str = "",
) -> EngineOperation:
    """Queue an apply or restart when nothing else uses the engine (``occupancy``: another
    operation, a benchmark measuring it, a change holding its lock), under a row lock on the
    deployment, the table's partial unique constraint behind it; the worker picks it up once
    this transaction commits. ``owner``: the holder asking for it (a change's pipeline
    restarting its own deployment). ``enqueue=False`` only records the row, for a caller
    already on a worker that runs it itself (``run_operation``), such as that pipeline.
    ``note``: why it runs, shown as its label (a rollback names itself and its reason)."""
    purpose = occupancy.Purpose.APPLY if kind == OperationKind.APPLY else occupancy.Purpose.RESTART
    try:
        with transaction.atomic():
            deployment = Deployment.objects.select_for_update().get(pk=deployment.pk)
            try:
                occupancy.require_free(deployment, purpose, owner=owner)
            except occupancy.DeploymentBusy as busy:
                raise OperationRefused(str(busy)) from None
            config = _config_for(deployment, kind, config)
            operation = EngineOperation.objects.create(
                deployment=deployment,
                kind=kind,
                config=config,
                previous_config=deployment.active_config,
                requested_by=actor,
                note=note[:200],
            )
            audit(
                actor,
                f"deployment.{kind}",
                deployment,
                after={"operation": operation.pk, "config_version": config.version},
            )
            if enqueue:
                task = "apply_config" if kind == OperationKind.APPLY else "restart_engine"
                enqueue_on_commit(f"hosts.tasks.{task}", operation.pk)
    except IntegrityError:
        # Another request won the race between our check and our insert.
        active = deployment.operations.filter(status__in=ACTIVE_STATUSES).first()
        raise OperationRefused(
            _busy(active) if active else "Another operation just started."
        ) from None
    _publish_operation(operation)
    return operation


def _config_for(deployment: Deployment, kind: str, config: EngineConfig | None) -> EngineConfig:
    # An apply names a version of this deployment; a restart runs the active one again.
    if kind == OperationKind.APPLY:
        if config is None or config.deployment_id != deployment.pk:
            raise OperationRefused("Choose a config version of this deployment.")
        return config
    if deployment.active_config is None:
        raise OperationRefused("The deployment has no config to restart with.")
    return deployment.active_config


def _busy(active: EngineOperation) -> str:
    who = active.requested_by or "the system"
    state = active.get_status_display().lower()
    return (
        f"{active.get_kind_display()} #{active.pk} by {who} is {state}: one operation at a "
        "time per deployment, try again once the engine has settled."
    )


def occupants(deployment: Deployment) -> list[occupancy.Occupant]:
    """The ``occupancy`` holder of this module: an apply or restart queued or running."""
    active = (
        deployment.operations.filter(status__in=ACTIVE_STATUSES)
        .select_related("requested_by")
        .first()
    )
    return [] if active is None else [occupancy.Occupant(active, _busy(active))]


# --- running -----------------------------------------------------------------------------------
def run_operation(operation: EngineOperation) -> EngineOperation:
    """The worker's part: apply (or restart) through the host's transport, roll back on
    failure (the transport restarts the previous config), record everything on the row."""
    if operation.status == OperationStatus.RUNNING:
        return _resume_after_crash(operation)
    operation.transition_to(OperationStatus.RUNNING)
    _publish_operation(operation)
    config = operation.config
    try:
        launch = config.launch_config().validated()
    except ValueError as exc:  # LaunchError: nothing was sent to the host
        operation.append_log(f"refused before contacting the host: {exc}")
        return _finish(operation, OperationOutcome.FAILED, f"invalid config: {exc}", [])
    rollback = _rollback_launch(config, operation.previous_config)
    deployment = operation.deployment
    _set_deployment(deployment, DeploymentStatus.STARTING, f"{operation} running")
    verb = "applying" if operation.kind == OperationKind.APPLY else "restarting with"
    operation.append_log(f"{verb} v{config.version} on {deployment.host}")
    try:
        outcome = _send(operation, launch, rollback)
    except TransportError as exc:
        operation.append_log(f"transport error: {exc}")
        _set_deployment(
            deployment, DeploymentStatus.UNKNOWN, f"host unreachable mid-operation: {exc}"
        )
        operation.host_unreachable = True
        operation.save(update_fields=["host_unreachable"])
        return _finish(operation, OperationOutcome.FAILED, f"{type(exc).__name__}: {exc}", [])
    hidden = _hidden(operation)
    # Everything after this point (log, deployment status, row) reads the masked outcome.
    outcome.error = scrub(outcome.error or "", hidden)
    outcome.log_lines = [scrub(line, hidden) for line in outcome.log_lines]
    operation.append_log(
        f"engine {outcome.state}" + (f": {outcome.error}" if outcome.error else "")
    )
    return _conclude(operation, outcome)


def _rollback_launch(config: EngineConfig, previous: EngineConfig | None) -> LaunchConfig | None:
    """What the transport falls back to if the new config fails: the previous version, if
    there is another one and the current rules still accept it."""
    if previous is None or previous.pk == config.pk:
        return None
    try:
        return previous.launch_config().validated()
    except ValueError:
        return None  # an old config the current rules refuse cannot be rolled back to


def _send(
    operation: EngineOperation, launch: LaunchConfig, rollback: LaunchConfig | None
) -> ApplyOutcome:
    deployment = operation.deployment
    timeout = settings.ENGINE_READY_TIMEOUT
    with transport_for(deployment.host, deployment) as transport:
        if operation.kind == OperationKind.APPLY:
            return transport.apply_config(
                deployment.name, launch, previous=rollback, ready_timeout_s=timeout
            )
        return transport.restart_engine(deployment.name, ready_timeout_s=timeout)


def _conclude(operation: EngineOperation, outcome: ApplyOutcome) -> EngineOperation:
    """Record what the engine ended as: ready on the new config, back on the previous one,
    or failed."""
    deployment, config, previous = operation.deployment, operation.config, operation.previous_config
    if outcome.ok:
        _activate(operation)
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


def _activate(operation: EngineOperation) -> None:
    # The operation's config is what the deployment runs now; an apply that changed it is
    # audited (a restart runs the same version again).
    deployment, config, previous = operation.deployment, operation.config, operation.previous_config
    with transaction.atomic():
        before = deployment.active_config_id
        model_before = deployment.model
        # The deployment serves the model of the version it runs (a change may switch it).
        model = config.model or deployment.model
        Deployment.objects.filter(pk=deployment.pk).update(active_config=config, model=model)
        deployment.model = model
        if operation.kind == OperationKind.APPLY and before != config.pk:
            audit(
                operation.requested_by,
                "deployment.config_active",
                deployment,
                before={
                    "config_version": previous.version if previous else None,
                    **({"model": model_before} if model != model_before else {}),
                },
                after={
                    "config_version": config.version,
                    **({"model": model} if model != model_before else {}),
                },
            )


def _hidden(operation) -> set[str]:
    """The secret values of both configs of an operation: engines repeat their arguments in
    their output (vLLM logs --api-key's value at start), and that output is shown."""
    values: set[str] = set()
    for config in (operation.config, operation.previous_config):
        if config is not None:
            values |= secret_values(config.settings, config.env)
    return values


def _finish(operation, outcome: OperationOutcome, error: str, lines: list[str]):
    hidden = _hidden(operation)
    error, lines = scrub(error, hidden), [scrub(line, hidden) for line in lines]
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
    """Close an operation whose task failed or ran out of time; the engine's state is unknown."""
    operation.refresh_from_db()
    if not operation.is_finished:
        operation.append_log(error)
        _set_deployment(operation.deployment, DeploymentStatus.UNKNOWN, error)
        _finish(operation, OperationOutcome.FAILED, error, [])


# --- deployment status -------------------------------------------------------------------------
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
