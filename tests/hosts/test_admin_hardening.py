"""The Django admin is held to the panel's rules (issue 14, items 1, 2 and 8): JSON typed there
goes through the panel's parser, secret flags show masked, and what a credential is bound to
cannot be edited."""

import pytest
from django.urls import reverse

from tests.factories import make_config, make_deployment, make_host

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
    assert 'name="credential_bindings"' not in page.content.decode()
    assert 'name="labels"' in page.content.decode()


@pytest.mark.parametrize(
    "labels, message",
    [('{"env": "prod\\u0000"}', "NUL"), ("[" * 100_000 + "]" * 100_000, "deep")],
    ids=["nul", "deep"],
)
def test_host_admin_labels_json_is_a_form_error_not_a_500(client, superuser, labels, message):
    host = make_host()
    client.force_login(superuser)
    url = reverse("admin:hosts_host_change", args=[host.pk])
    form = client.get(url).context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and not isinstance(v, list)}
    data.update(
        {
            "labels": labels,
            "gpus-TOTAL_FORMS": "0",
            "gpus-INITIAL_FORMS": "0",
            "gpus-MIN_NUM_FORMS": "0",
            "gpus-MAX_NUM_FORMS": "1000",
        }
    )
    response = client.post(url, data)
    assert response.status_code == 200  # the form again, with its error
    errors = response.context["adminform"].form.errors
    assert "labels" in errors and message.lower() in str(errors["labels"]).lower()
