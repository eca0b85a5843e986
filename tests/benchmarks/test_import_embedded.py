"""In embedded mode (no Redis), the in-process Celery worker reads an uploaded result file:
the import is queued, taken by the worker thread, and ends with the run (issue 14, item 14)."""

import json
import time

import pytest
from celery.worker import state as worker_state
from django.core.files.uploadedfile import SimpleUploadedFile

from benchmarks.models import ImportJob
from benchmarks.services.imports import start_import
from controlpanel.celery import app
from controlpanel.embedded import EmbeddedRuntime
from tests.benchmarks.test_import_streaming import vllm_file
from tests.factories import make_deployment


@pytest.fixture
def runtime():
    assert app.conf.task_always_eager is False
    app.control.purge()  # what earlier tests queued with no worker to take it
    rt = EmbeddedRuntime(app, concurrency=2, beat=False)
    rt.start()
    yield rt
    rt.stop()


@pytest.mark.django_db(transaction=True)
def test_the_embedded_worker_imports_an_uploaded_file(runtime, operator, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    before = worker_state.total_count["benchmarks.tasks.import_result"]
    upload = SimpleUploadedFile("bench.json", json.dumps(vllm_file(200, 20)).encode())
    job = start_import(operator, upload, make_deployment())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        job.refresh_from_db()
        if job.is_finished:
            break
        time.sleep(0.05)
    assert job.status == "succeeded", job.error
    assert job.run.completed == 184 and job.run.requested_by == operator
    assert job.path == "" and list(tmp_path.joinpath("imports").iterdir()) == []
    assert worker_state.total_count["benchmarks.tasks.import_result"] == before + 1
    assert ImportJob.objects.count() == 1
