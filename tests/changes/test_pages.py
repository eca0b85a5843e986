"""The changes page: every engine-config version with what it changed."""

import pytest
from django.urls import reverse

from tests.factories import make_config, make_deployment

pytestmark = pytest.mark.django_db


def test_changes_page_shows_what_each_version_changed(client, viewer):
    deployment = make_deployment(name="chat")
    make_config(deployment, {"max_num_seqs": 256})
    make_config(deployment, {"max_num_seqs": 512})
    client.force_login(viewer)
    response = client.get(reverse("changes:list"))
    diffs = [row["diff"] for row in response.context["rows"]]
    assert diffs == [{"max_num_seqs": (256, 512)}, {"max_num_seqs": (None, 256)}]
