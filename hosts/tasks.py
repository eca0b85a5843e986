"""Celery tasks of the hosts app. Each takes a primary key; ``controlpanel.jobs.run_job``
loads the row and records a failure or a time limit on it. Limits: ``controlpanel.timelimits``."""

from celery import shared_task
from django.conf import settings

from controlpanel import timelimits
from controlpanel.jobs import run_job
from hosts.models import EngineOperation, HostCheck
from hosts.services import checks, operations, telemetry, telemetry_fleet

OPERATION_LIMIT = timelimits.operation(settings.ENGINE_READY_TIMEOUT)


@shared_task(**timelimits.HOST_CHECK.options())
def check_host(check_pk: int) -> None:
    run_job(
        HostCheck.objects.select_related("host"),
        check_pk,
        checks.run_host_check,
        checks.fail_host_check,
        what="the check",
    )


@shared_task(**timelimits.CHECK_ALL_HOSTS.options())
def check_all_hosts() -> int:
    return len(checks.check_all_hosts())


def _operation(operation_pk: int) -> None:
    run_job(
        EngineOperation.objects.select_related(
            "deployment__host", "config", "previous_config", "requested_by"
        ),
        operation_pk,
        operations.run_operation,
        operations.fail_operation,
        what="the operation",
    )


@shared_task(**OPERATION_LIMIT.options())
def apply_config(operation_pk: int) -> None:
    _operation(operation_pk)


@shared_task(**OPERATION_LIMIT.options())
def restart_engine(operation_pk: int) -> None:
    _operation(operation_pk)


@shared_task(ignore_result=True, **timelimits.POLL_TELEMETRY.options())
def poll_telemetry() -> int:
    shards = settings.TELEMETRY_SHARDS
    if not shards:
        return telemetry.poll_telemetry()
    # Fleet scale: one task a shard, for whichever workers are free. A busy worker starts them
    # late: they run one at a time per shard (a lock) and skip the hosts read within the last
    # half interval (telemetry_fleet.not_just_polled), so a late one still polls what is due
    # and the poll slows down under load rather than stopping. After a few intervals a task
    # is dropped: a worker back from an outage does not work off a backlog of them.
    expires = max(3 * settings.TELEMETRY_INTERVAL, 3.0)
    for shard in range(shards):
        poll_telemetry_shard.apply_async((shard, shards), expires=expires)
    return shards


@shared_task(ignore_result=True, **timelimits.POLL_TELEMETRY.options())
def poll_telemetry_shard(shard: int, shards: int) -> int:
    return telemetry_fleet.poll_shard(shard, shards).samples


@shared_task(**timelimits.DOWNSAMPLE_TELEMETRY.options())
def downsample_telemetry() -> dict:
    return telemetry.downsample_telemetry()
