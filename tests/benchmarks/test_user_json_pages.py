"""JSON and text that users type or upload on the benchmark pages (issue 14, item 8): a NUL
character (which PostgreSQL can store in neither text nor jsonb) and JSON nested 100k deep
(which json.loads dies of) are form errors, never a 500 — on SQLite and on PostgreSQL, where
the NUL used to reach the database. Run this module with DATABASE_URL set to check the
latter."""

from __future__ import annotations

import json
from unittest import mock

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from benchmarks.models import BenchmarkRun, ImportJob, LoadProfile
from tests.benchmarks.test_import_streaming import post_import, vllm_file
from tests.benchmarks.test_profile_pages import SPEC, post_data
from tests.factories import make_deployment

pytestmark = pytest.mark.django_db

DEEP = "[" * 100_000 + "]" * 100_000
NUL_DOCUMENT = json.dumps({**SPEC, "description": "a\u0000b"})  # the escape \u0000
EXPORT_FORMAT = "llm-control-panel/load-profile"


@pytest.fixture
def operator_client(client, operator):
    client.force_login(operator)
    return client


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (json.dumps({"stages": [{"name": "a\u0000", "concurrency": 1}]}), "NUL character"),
        (DEEP, "nested too deeply: more than 64 levels"),
        ('{"stages": NaN}', "must be finite"),
    ],
)
def test_profile_document_with_nul_or_deep_nesting_is_a_form_error(operator_client, text, message):
    response = operator_client.post(
        reverse("benchmarks:profile_create"), post_data(SPEC, name="Doc", document_text=text)
    )
    assert response.status_code == 200
    assert message in response.context["form"].errors["document_text"][0]
    assert not LoadProfile.objects.filter(name="Doc").exists()


@pytest.mark.parametrize("field", ["name", "description", "note"])
def test_nul_typed_into_a_profile_text_field_is_a_form_error(operator_client, field):
    before = LoadProfile.objects.count()
    data = post_data(SPEC, name="Plain")
    data[field] = "before\x00after"
    response = operator_client.post(reverse("benchmarks:profile_create"), data)
    assert response.status_code == 200
    assert "Null characters are not allowed." in response.context["form"].errors[field]
    assert LoadProfile.objects.count() == before


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            json.dumps(
                {"format": EXPORT_FORMAT, "version": 1, "name": "X\u0000", "spec": SPEC}
            ).encode(),
            "NUL character",
        ),
        (
            json.dumps({"format": EXPORT_FORMAT, "version": 1, "name": "X", "spec": SPEC}).encode()[
                :-1
            ]
            + b', "deep": '
            + DEEP.encode()
            + b"}",
            "nested too deeply",
        ),
    ],
)
def test_profile_import_with_nul_or_deep_nesting_is_a_form_error(operator_client, content, message):
    before = LoadProfile.objects.count()
    upload = SimpleUploadedFile("x.json", content, "application/json")
    response = operator_client.post(reverse("benchmarks:profile_import"), {"file": upload})
    assert response.status_code == 200 and message in response.content.decode()
    assert LoadProfile.objects.count() == before


def test_traffic_sample_with_nul_prefix_or_deep_line_is_a_form_error(operator_client):
    url = reverse("benchmarks:profile_from_traffic")
    nul = b'{"input_tokens": 10, "output_tokens": 5, "prefix_id": "p\\u0000"}\n' * 3
    deep = b'{"input_tokens": 10, "output_tokens": 5}\n' + DEEP.encode() + b"\n"
    for content, message in ((nul, "NUL character"), (deep, "nested too deeply")):
        upload = SimpleUploadedFile("sample.jsonl", content, "application/jsonl")
        response = operator_client.post(url, {"file": upload})
        assert response.status_code == 200
        assert message in response.context["form"].errors["file"][0]
        assert response.context["preview"] is None


def test_run_import_with_nul_or_deep_nesting_fails_the_job_not_the_page(operator_client, var_dir):
    deployment = make_deployment()
    nul = json.dumps(vllm_file(10, 3, label="lab\u0000el")).encode()
    deep = json.dumps(vllm_file(10, 3)).encode()[:-1] + b', "x": ' + DEEP.encode() + b"}"
    for content, message in ((nul, "NUL character"), (deep, "nested more than 64 levels")):
        upload = SimpleUploadedFile("bench.json", content, "application/json")
        response = post_import(operator_client, {"file": upload, "deployment": deployment.pk})
        assert response.status_code == 302
        page = operator_client.get(response["Location"])
        assert page.status_code == 200 and message in page.content.decode()
    assert ImportJob.objects.filter(status="failed").count() == 2
    assert not BenchmarkRun.objects.exists()


def test_run_import_label_with_nul_is_a_form_error(operator_client, var_dir):
    upload = SimpleUploadedFile("b.json", json.dumps(vllm_file(5, 2)).encode())
    response = operator_client.post(
        reverse("benchmarks:import"),
        {"file": upload, "deployment": make_deployment().pk, "label": "a\x00b"},
    )
    assert response.status_code == 400
    assert "Null characters are not allowed." in response.context["form"].errors["label"]
    assert not ImportJob.objects.exists()


@pytest.fixture
def var_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    return tmp_path


def test_admin_json_fields_use_the_user_json_parser(rf, admin_user):
    from django.contrib import admin

    from controlpanel.forms import UserJSONField

    request = rf.get("/")
    request.user = admin_user
    form = admin.site._registry[LoadProfile].get_form(request)
    assert isinstance(form.base_fields["spec"], UserJSONField)
    bound = form(data={"name": "n", "version": 1, "spec": '{"a": "\\u0000"}', "source": "manual"})
    assert not bound.is_valid() and "NUL character" in bound.errors["spec"][0]


def test_a_profile_import_too_large_is_refused_before_it_is_read(operator_client, monkeypatch):
    from benchmarks.forms import profiles as forms

    monkeypatch.setattr(forms, "MAX_IMPORT_BYTES", 10)
    upload = SimpleUploadedFile("x.json", b'{"format": "x", "padding": "0123456789"}')
    with mock.patch("benchmarks.services.profiles.import_profile") as import_profile:
        response = operator_client.post(reverse("benchmarks:profile_import"), {"file": upload})
    assert response.status_code == 200 and not import_profile.called
    assert "an exported profile is at most" in response.content.decode()
