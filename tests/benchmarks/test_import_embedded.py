"""In embedded mode (no Redis), the in-process Celery worker reads an uploaded result file:
the import is queued, taken by the worker thread, and ends with the run (issue 14, item 14)."""

import json
import threading

import pytest
from celery.signals import task_postrun
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
    # Wait for the task to end on the worker thread, not by polling the row: the test database
    # is SQLite in memory with a shared cache, whose table locks fail a read at once (no busy
    # wait) while the worker writes progress.
    done = threading.Event()

    def finished(sender=None, **kwargs):
        if sender is not None and sender.name == "benchmarks.tasks.import_result":
            done.set()

    task_postrun.connect(finished, weak=False)
    try:
        upload = SimpleUploadedFile("bench.json", json.dumps(vllm_file(200, 20)).encode())
        job = start_import(operator, upload, make_deployment())
        assert done.wait(timeout=60), "the worker did not finish the import"
    finally:
        task_postrun.disconnect(finished)
    job.refresh_from_db()
    assert job.status == "succeeded", job.error
    assert job.run.completed == 184 and job.run.requested_by == operator
    assert job.path == "" and list(tmp_path.joinpath("imports").iterdir()) == []
    assert worker_state.total_count["benchmarks.tasks.import_result"] == before + 1
    assert ImportJob.objects.count() == 1
