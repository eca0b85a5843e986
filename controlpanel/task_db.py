"""Database connections of Celery tasks, kept by Django's own rules.

Celery's Django fixup closes every database connection before and after each task unless
``CELERY_DB_REUSE_MAX`` is set, whatever ``CONN_MAX_AGE`` says: with 4 telemetry shards a
second every worker process opened (and PostgreSQL forked a backend for) several new
connections a second, and compose's ``DATABASE_CONN_MAX_AGE`` did nothing for workers.
Settings set ``CELERY_DB_REUSE_MAX`` so the fixup stays out of the way, and these handlers
do what Django does around a request instead: ``close_old_connections`` closes a connection
past its ``CONN_MAX_AGE`` (0: after every task, as before) or one left unusable by an error.
Tasks run eagerly (inside a caller's transaction) are left alone, as the fixup leaves them.
"""

from celery import signals
from django.db import close_old_connections


def _recycle(sender=None, **_kwargs) -> None:
    if not getattr(getattr(sender, "request", None), "is_eager", False):
        close_old_connections()


signals.task_prerun.connect(_recycle, weak=False, dispatch_uid="controlpanel.task_db.prerun")
signals.task_postrun.connect(_recycle, weak=False, dispatch_uid="controlpanel.task_db.postrun")
