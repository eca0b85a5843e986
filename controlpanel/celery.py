"""The Celery application. Configured from Django settings (``CELERY_*``)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")

app = Celery("controlpanel")
app.config_from_object("django.conf:settings", namespace="CELERY")
# A sharded benchmark's load generators run on workers of their own queue (compose's
# loadgen service): a shard holds its worker for the whole run and must not queue behind,
# or hold up, the panel's other tasks.
app.conf.task_routes = {"benchmarks.tasks.run_shard": {"queue": "loadgen"}}
app.autodiscover_tasks()
