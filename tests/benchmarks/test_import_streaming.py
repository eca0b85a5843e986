"""Imports stream (issue 14, item 14): an uploaded result file is saved owner-only, read by a
background task as a stream (ijson) in bounded pieces, with progress on its ``ImportJob``,
and gives the run a whole-file read would; a broken file fails the job cleanly, saving
nothing, and the upload is deleted either way. The honest memory measurement is
``scripts/measure_import_memory.py``; these tests check the behaviour that keeps it bounded."""

from __future__ import annotations

import io
import json
import math
import os
import random
import stat
import tracemalloc
from datetime import timedelta
from pathlib import Path
from unittest import mock

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import TestCase
from django.urls import reverse
from django.utils import timezone

from benchmarks import importers, records, resultstream, tasks
from benchmarks.loadgen.stats import describe
from benchmarks.models import BenchmarkRun, ImportJob, RunRequestLog
from benchmarks.services import imports
from tests.factories import make_deployment

pytestmark = pytest.mark.django_db

IMPORT = reverse("benchmarks:import")


def run_inline(args, **options):
    """Stand-in for ``apply_async``: the task runs here and now, as a worker would run it."""
    tasks.import_result(*args)


def post_import(client, data: dict):
    """POST the import form; the queued task runs when the request's transaction commits."""
    with (
        mock.patch.object(tasks.import_result, "apply_async", side_effect=run_inline),
        TestCase.captureOnCommitCallbacks(execute=True),
    ):
        return client.post(IMPORT, data)


def vllm_file(n: int, tokens: int, *, seed: int = 7, **extra) -> dict:
    """A ``vllm bench serve --save-detailed`` document of ``n`` requests, every 13th failed,
    about ``tokens`` gaps each."""
    rnd = random.Random(seed)
    errors = ["" if i % 13 else "ClientConnectorError: connection refused" for i in range(n)]
    itls = [
        [] if errors[i] else [rnd.random() / 40 for _ in range(rnd.randint(1, tokens))]
        for i in range(n)
    ]
    data = {
        "date": "20250612-150000",
        "backend": "vllm",
        "label": "streamed",
        "model_id": "Qwen/Qwen2.5-7B-Instruct",
        "num_prompts": n,
        "request_rate": "inf",
        "duration": 60.0,
        "completed": sum(1 for e in errors if not e),
        "failed": sum(1 for e in errors if e),
        "mean_ttft_ms": 123.0,
        "p99_ttft_ms": 456.0,
        "input_lens": [rnd.randint(50, 500) for _ in range(n)],
        "output_lens": [len(gaps) + 1 if gaps else 0 for gaps in itls],
        "ttfts": [0.0 if errors[i] else rnd.random() / 5 for i in range(n)],
        "itls": itls,
        "start_times": [1000.0 + i * 0.01 for i in range(n)],
        "generated_texts": ["word " * len(gaps) for gaps in itls],
        "errors": errors,
    }
    data.update(extra)
    return data


def expected_from_whole(data: dict):
    """The request log, distributions and computed percentiles from the whole document held
    in memory as lists: what a non-streamed import of the same file gives."""
    t0 = min(data["start_times"])
    rows = [
        importers._vllm_record(
            i,
            data["errors"][i],
            data["ttfts"][i],
            data["itls"][i],
            data["start_times"][i] - t0,
            None,
            data["input_lens"][i],
            data["output_lens"][i],
            False,
        )
        for i in range(len(data["ttfts"]))
    ]
    ok = [r for r in rows if r["error_class"] is None]
    ttfts = [r["first_token"] - r["sent"] for r in ok]
    itls = [b - a for r in ok for a, b in zip(r["chunk_times"], r["chunk_times"][1:], strict=False)]
    return rows, records.distributions(rows), describe(ttfts, "ttft"), describe(itls, "itl")


def write(tmp_path: Path, data: dict, name="result.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def start(path: Path, deployment, **kwargs) -> ImportJob:
    upload = SimpleUploadedFile(path.name, path.read_bytes(), "application/json")
    with TestCase.captureOnCommitCallbacks(execute=False):
        return imports.start_import(None, upload, deployment, **kwargs)


@pytest.fixture
def var_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path / "var"
    settings.VAR_DIR.mkdir(mode=0o700)
    return settings.VAR_DIR


def test_a_multi_mb_vllm_file_imported_through_the_task_matches_a_whole_file_read(
    tmp_path, var_dir
):
    data = vllm_file(1500, 400)
    path = write(tmp_path, data)
    assert path.stat().st_size > 5 * 2**20
    job = start(path, make_deployment())
    tasks.import_result(job.pk)

    job.refresh_from_db()
    assert job.status == "succeeded", job.error
    assert job.progress == 1.0 and job.phase == "done" and job.path == ""
    run = job.run
    rows, distributions, ttft, itl = expected_from_whole(data)
    assert run.completed == data["completed"] and run.failed == data["failed"]
    assert run.label == "streamed" and run.source == "vllm-bench"
    log = RunRequestLog.objects.get(run=run)
    assert log.count == 1500
    assert records.decode(bytes(log.data)) == records.decode(records.encode(rows))
    assert run.distributions == distributions
    # What the file has wins; p50/p95 it lacks are computed from every request and gap.
    assert run.summary["mean_ttft_ms"] == 123.0 and run.summary["p99_ttft_ms"] == 456.0
    assert run.summary["p95_ttft_ms"] == pytest.approx(ttft["p95_ttft_ms"], rel=1e-12)
    assert run.summary["p50_itl_ms"] == pytest.approx(itl["p50_itl_ms"], rel=1e-12)
    assert run.summary["p95_itl_ms"] == pytest.approx(itl["p95_itl_ms"], rel=1e-12)
    assert run.ttft_p95_ms == pytest.approx(ttft["p95_ttft_ms"], rel=1e-12)


def test_the_parser_reads_in_bounded_pieces_and_reports_progress_in_two_passes(tmp_path):
    data = vllm_file(600, 300)
    body = json.dumps(data).encode()
    reads: list[int] = []

    class Recording(io.BytesIO):
        def read(self, size=-1):
            chunk = super().read(size)
            reads.append(len(chunk))
            return chunk

    seen: list[tuple[str, int, float]] = []
    got = importers._read(lambda: Recording(body), len(body), lambda *report: seen.append(report))
    assert got.log_count == 600
    # Never more than one buffer at a time, and the whole file twice over, in pieces.
    assert max(reads) <= importers.READ_SIZE
    assert sum(reads) >= 2 * len(body) and len(reads) > 2 * len(body) // importers.READ_SIZE
    fractions = [fraction for _, _, fraction in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    phases = [phase for phase, _, _ in seen]
    assert phases.index("reading the per-request lists") > phases.index("reading the file")
    first_pass = [f for p, _, f in seen if p == "reading the file"]
    assert first_pass[-1] == pytest.approx(0.5)


def test_memory_held_while_reading_is_a_small_part_of_the_file(tmp_path, monkeypatch):
    """tracemalloc sees every Python object the reader builds: a reader that built the
    per-request lists (as json.load did) would hold several times the file's size."""
    monkeypatch.setattr(records, "MAX_POOLED_GAPS", 20_000)
    path = write(tmp_path, vllm_file(1000, 400))
    size = path.stat().st_size
    tracemalloc.start()
    try:
        got = importers.read(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.log_count == 1000 and got.distributions["itl_sampled"] <= 20_000
    assert peak < size / 4, f"peak {peak / 2**20:.1f} MiB for a {size / 2**20:.1f} MiB file"


def test_a_truncated_file_fails_the_job_cleanly_with_nothing_saved(tmp_path, var_dir):
    body = json.dumps(vllm_file(800, 200)).encode()
    path = tmp_path / "cut.json"
    path.write_bytes(body[: len(body) * 2 // 3])
    job = start(path, make_deployment())
    saved = Path(job.path)
    assert saved.exists()
    tasks.import_result(job.pk)
    job.refresh_from_db()
    assert job.status == "failed" and job.run is None
    assert job.error.startswith("The file was not imported: not valid JSON (near byte ")
    assert not BenchmarkRun.objects.exists() and not RunRequestLog.objects.exists()
    assert not saved.exists() and job.path == ""


def test_the_upload_is_saved_owner_only_under_var_dir_and_deleted_after(tmp_path, var_dir):
    job = start(write(tmp_path, vllm_file(20, 5)), make_deployment())
    saved = Path(job.path)
    assert saved.parent == var_dir / "imports"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert stat.S_IMODE(saved.parent.stat().st_mode) == 0o700
    assert job.bytes_total == saved.stat().st_size and job.status == "queued"
    tasks.import_result(job.pk)
    job.refresh_from_db()
    assert job.status == "succeeded" and not saved.exists()
    assert os.listdir(saved.parent) == []


def test_an_unexpected_error_fails_the_job_and_deletes_the_upload(tmp_path, var_dir):
    job = start(write(tmp_path, vllm_file(20, 5)), make_deployment())
    saved = Path(job.path)
    with (
        mock.patch.object(imports, "record_import", side_effect=RuntimeError("disk full")),
        pytest.raises(RuntimeError),
    ):
        tasks.import_result(job.pk)
    job.refresh_from_db()
    assert job.status == "failed" and job.error == "RuntimeError: disk full"
    assert not saved.exists()


def test_a_nul_character_in_an_imported_file_is_refused_with_where_it_was(tmp_path, var_dir):
    for extra, where in (
        ({"label": "tp2\u0000"}, "at label"),
        ({"metadata_note": "x\u0000y"}, "at metadata_note"),
    ):
        job = start(write(tmp_path, vllm_file(10, 3, **extra)), make_deployment())
        tasks.import_result(job.pk)
        job.refresh_from_db()
        assert job.status == "failed"
        assert "NUL character" in job.error and where in job.error
    assert not BenchmarkRun.objects.exists()


def test_a_nul_character_in_a_request_error_is_kept_in_the_binary_log(tmp_path, var_dir):
    data = vllm_file(13, 3)
    data["errors"][0] = "bad\u0000byte"
    job = start(write(tmp_path, data), make_deployment())
    tasks.import_result(job.pk)
    job.refresh_from_db()
    assert job.status == "succeeded", job.error
    rows = records.decode(bytes(RunRequestLog.objects.get(run=job.run).data))
    assert rows[0]["error"] == "bad\u0000byte"


def test_json_nested_100k_deep_in_an_imported_file_fails_the_job_not_the_worker(tmp_path, var_dir):
    body = json.dumps(vllm_file(10, 3))[:-1] + ', "extra": ' + "[" * 100_000 + "]" * 100_000
    path = tmp_path / "deep.json"
    path.write_text(body + "}")
    job = start(path, make_deployment())
    tasks.import_result(job.pk)
    job.refresh_from_db()
    assert job.status == "failed"
    assert "'extra' is nested more than 64 levels deep" in job.error


def test_our_own_file_with_records_streams_one_record_at_a_time(tmp_path):
    """The load generator's format: ``records`` are read in the second pass; NaN and
    Infinity (Python's json writes them) are read as null and "inf"."""
    rnd = random.Random(3)
    rows = []
    for i in range(300):
        sent = i * 0.1
        first = sent + rnd.random() / 10
        chunks = [first]
        for _ in range(rnd.randint(1, 30)):
            chunks.append(chunks[-1] + rnd.random() / 50)
        rows.append(
            {
                "index": i,
                "stage": "main",
                "warmup": i < 5,
                "input_len": 100,
                "output_tokens": len(chunks),
                "sent": sent,
                "scheduled": sent,
                "first_token": first,
                "end": chunks[-1],
                "chunk_times": chunks,
                "status": 200,
                "error_class": None,
                "error": "",
            }
        )
    spec = {"stages": [{"name": "main", "request_rate": math.inf, "num_requests": 300}]}
    document = {
        "completed": 295,
        "failed": 0,
        "mean_ttft_ms": math.nan,
        "stages": {},
        "timeline": [{"t": 1.0, "note": "NaN and Infinity in a string stay text"}],
        "spec": spec,
        "records": rows,
    }
    path = tmp_path / "ours.json"
    path.write_text(json.dumps(document))  # writes NaN and Infinity
    got = importers.read(path)
    assert got.kind == importers.LOADGEN and got.log_count == 295  # warm-up dropped
    assert records.decode(got.log) == records.decode(records.encode(rows))
    assert got.distributions == records.distributions(rows)
    assert got.spec["stages"][0]["request_rate"] == "inf"
    assert got.document["mean_ttft_ms"] is None
    assert got.document["timeline"][0]["note"] == "NaN and Infinity in a string stay text"


@pytest.mark.parametrize("read_size", [1, 2, 3, 5, 8, 64])
def test_non_finite_constants_are_replaced_outside_strings_across_any_read_boundary(
    monkeypatch, read_size
):
    monkeypatch.setattr(importers, "READ_SIZE", read_size)
    text = (
        '{"a": NaN, "b": [Infinity, -Infinity, 1.5, -2], "NaN": "Infinity \\" NaN \\\\",'
        ' "c": "\\\\", "d": -Infinity}'
    )
    converted = resultstream.NonFiniteAsText(io.BytesIO(text.encode())).read()
    assert json.loads(converted) == {
        "a": None,
        "b": ["inf", "-inf", 1.5, -2],
        "NaN": 'Infinity " NaN \\',
        "c": "\\",
        "d": "-inf",
    }


def test_the_import_page_follows_the_job_and_links_the_run(client, operator, tmp_path, var_dir):
    deployment = make_deployment()
    client.force_login(operator)
    body = json.dumps(vllm_file(30, 5)).encode()
    upload = SimpleUploadedFile("bench.json", body, "application/json")
    response = post_import(client, {"file": upload, "deployment": deployment.pk, "label": ""})
    job = ImportJob.objects.get()
    assert response.status_code == 302 and response["Location"] == job.get_absolute_url()
    page = client.get(job.get_absolute_url())
    run = BenchmarkRun.objects.get()
    assert page.status_code == 200
    content = page.content.decode()
    assert (
        f'href="{run.get_absolute_url()}"' in content
        and "27 requests succeeded, 3 failed" in content
    )
    assert "hx-trigger" not in content  # finished: no more polling


def test_a_running_job_polls_its_progress_every_second(client, operator, tmp_path, var_dir):
    job = start(write(tmp_path, vllm_file(5, 2)), make_deployment())
    ImportJob.objects.filter(pk=job.pk).update(
        status="running", progress=0.37, phase="reading the file"
    )
    client.force_login(operator)
    part = client.get(reverse("benchmarks:import_job_progress", args=[job.pk]))
    content = part.content.decode()
    assert part.status_code == 200 and 'hx-trigger="every 1s"' in content
    assert "37 %" in content and "reading the file" in content


def test_import_job_pages_need_the_import_permission(client, viewer, nobody, tmp_path, var_dir):
    job = start(write(tmp_path, vllm_file(5, 2)), make_deployment())
    for name in ("import_job", "import_job_progress"):
        url = reverse(f"benchmarks:{name}", args=[job.pk])
        assert client.get(url).status_code == 302  # anonymous: log in
        for user in (viewer, nobody):
            client.force_login(user)
            assert client.get(url).status_code == 403
        client.logout()


def test_progress_is_written_to_the_job_about_a_hundred_times(tmp_path, var_dir):
    job = start(write(tmp_path, vllm_file(400, 100)), make_deployment())
    with mock.patch.object(imports, "_report", wraps=imports._report) as report:
        tasks.import_result(job.pk)
    fractions = [
        call.kwargs["progress"] for call in report.call_args_list if "progress" in call.kwargs
    ]
    assert 10 < len(fractions) <= 2 * 100 + 10
    assert fractions == sorted(fractions) and fractions[-1] == 1.0


def test_a_job_no_worker_finished_is_failed_by_the_sweep_and_its_upload_deleted(tmp_path, var_dir):
    lost = start(write(tmp_path, vllm_file(5, 2)), make_deployment())
    fresh = start(write(tmp_path, vllm_file(5, 2), name="fresh.json"), make_deployment())
    ImportJob.objects.filter(pk=lost.pk).update(
        status="running", created_at=timezone.now() - timedelta(hours=1)
    )
    assert tasks.fail_stale_runs() == 1
    lost.refresh_from_db()
    fresh.refresh_from_db()
    assert lost.status == "failed" and "No worker finished this import" in lost.error
    assert lost.path == "" and fresh.status == "queued" and Path(fresh.path).exists()
