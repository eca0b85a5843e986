"""Celery tasks of the hosts app. Each takes a primary key and records its outcome on the row."""

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded

from hosts import services
from hosts.models import HostCheck


@shared_task(time_limit=60, soft_time_limit=50)
def check_host(check_pk: int) -> None:
    check = HostCheck.objects.select_related("host").filter(pk=check_pk).first()
    if check is None or check.is_finished:
        return  # deleted or already handled (a redelivery after acks_late)
    try:
        services.run_host_check(check)
    except SoftTimeLimitExceeded:
        services.fail_host_check(check, "the check ran out of time")
    except Exception as exc:
        services.fail_host_check(check, f"{type(exc).__name__}: {exc}")
        raise


@shared_task(time_limit=120, soft_time_limit=110)
def check_all_hosts() -> int:
    return len(services.check_all_hosts())
