"""The Django admin is held to the panel's rules (issue 14, items 1, 2 and 8; issue 21): secret
flags show masked, what a credential is bound to is not shown, and the models the panel edits
under review and audit are read-only there (an admin edit would skip both), with a note saying
where to edit; the deletes it still allows are audited."""

import pytest
from django.apps import apps
from django.contrib import admin as django_admin
from django.urls import reverse

from controlpanel.admin_audited import READ_ONLY_NOTE
from controlpanel.models import AuditEntry
from hosts.models import Deployment, Host
from tests.factories import (
    make_config,
    make_deployment,
    make_finished_run,
    make_gpu,
    make_host,
    make_profile,
)

pytestmark = pytest.mark.django_db

API_KEY = "sk-admin-page-0123456789"


@pytest.fixture
def superuser(django_user_model):
    return django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-123")


def test_engine_config_admin_masks_the_api_key(client, superuser):
    config = make_config(make_deployment(), {"api_key": API_KEY, "max_num_batched_tokens": 8192})
    client.force_login(superuser)
    page = client.get(reverse("admin:hosts_engineconfig_change", args=[config.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    assert API_KEY not in text
    assert "•••" in text and "8192" in text


def test_host_admin_does_not_offer_the_credential_bindings(client, superuser):
    host = make_host()
    client.force_login(superuser)
    page = client.get(reverse("admin:hosts_host_change", args=[host.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "credential_bindings" not in text and "Credential bindings" not in text
    assert "test-token" not in text  # the agent token either
    assert "Labels" in text  # the rest is shown, read-only


# Every model the panel edits under review or audit, by app.
AUDITED = {
    "hosts": ["host", "gpu", "deployment", "engineconfig", "engineoperation", "hostcheck"],
    "benchmarks": ["loadprofile", "benchmarkrun", "importjob", "price"],
    "controlpanel": ["auditentry"],
}


def test_every_panel_model_in_the_admin_is_read_only(rf, superuser):
    """No model of the panel's apps can be added or changed in the admin: a new model
    registered there has to take a side (this test names it)."""
    request = rf.get("/admin/")
    request.user = superuser
    editable = []
    for model, model_admin in django_admin.site._registry.items():
        label = model._meta.app_label
        if label not in ("hosts", "benchmarks", "changes", "scaling", "controlpanel", "api"):
            continue
        if model_admin.has_add_permission(request) or model_admin.has_change_permission(request):
            editable.append(model._meta.label_lower)
    assert editable == []
    for label, names in AUDITED.items():
        for name in names:
            assert apps.get_model(label, name) in django_admin.site._registry, (label, name)


@pytest.fixture
def objects():
    host = make_host()
    make_gpu(host, index=0)
    deployment = make_deployment(host)
    config = make_config(deployment)
    return {
        "host": host,
        "deployment": deployment,
        "engineconfig": config,
        "loadprofile": make_profile(),
        "benchmarkrun": make_finished_run(deployment),
    }


@pytest.mark.parametrize(
    "app, name",
    [
        ("hosts", "host"),
        ("hosts", "deployment"),
        ("hosts", "engineconfig"),
        ("benchmarks", "loadprofile"),
        ("benchmarks", "benchmarkrun"),
    ],
)
def test_change_page_is_a_view_with_the_note_and_a_post_changes_nothing(
    client, superuser, objects, app, name
):
    obj = objects[name]
    client.force_login(superuser)
    url = reverse(f"admin:{app}_{name}_change", args=[obj.pk])
    page = client.get(url)
    assert page.status_code == 200
    text = page.content.decode()
    assert READ_ONLY_NOTE in text
    assert 'name="_save"' not in text  # no save button: nothing to submit
    assert client.post(url, {"name": "renamed", "model": "other/model"}).status_code == 403
    obj.refresh_from_db()
    assert getattr(obj, "name", None) != "renamed" and getattr(obj, "model", "") != "other/model"
    listing = client.get(reverse(f"admin:{app}_{name}_changelist"))
    assert listing.status_code == 200 and READ_ONLY_NOTE in listing.content.decode()
    assert client.get(reverse(f"admin:{app}_{name}_add")).status_code == 403


def test_deployment_model_cannot_be_changed_in_the_admin(client, superuser, objects):
    deployment = objects["deployment"]
    client.force_login(superuser)
    url = reverse("admin:hosts_deployment_change", args=[deployment.pk])
    form = {"name": deployment.name, "model": "evil/model", "port": deployment.port}
    assert client.post(url, form).status_code == 403
    assert Deployment.objects.get(pk=deployment.pk).model == deployment.model
    assert not AuditEntry.objects.exists()


def test_deleting_a_host_in_the_admin_is_audited(client, superuser):
    # Its GPUs, deployment and configs go with it (view-only on their own, not protected).
    host = make_host()
    make_gpu(host, index=0)
    make_config(make_deployment(host))
    client.force_login(superuser)
    url = reverse("admin:hosts_host_delete", args=[host.pk])
    assert client.post(url, {"post": "yes"}).status_code == 302
    assert not Host.objects.filter(pk=host.pk).exists()
    entry = AuditEntry.objects.get(action="host.delete")
    assert entry.actor == superuser and entry.via == "admin"
    assert entry.object_id == str(host.pk) and entry.before == {"object": host.name}


def test_a_host_whose_measurements_exist_is_not_deleted(client, superuser, objects):
    """Benchmark runs protect their deployment (the history stays): the admin says so."""
    client.force_login(superuser)
    url = reverse("admin:hosts_host_delete", args=[objects["host"].pk])
    assert client.post(url, {"post": "yes"}).status_code == 200  # the refusal page
    assert Host.objects.filter(pk=objects["host"].pk).exists()
    assert not AuditEntry.objects.exists()


def test_records_cannot_be_deleted_in_the_admin(client, superuser, objects):
    client.force_login(superuser)
    config = objects["engineconfig"]
    url = reverse("admin:hosts_engineconfig_delete", args=[config.pk])
    assert client.post(url, {"post": "yes"}).status_code == 403
