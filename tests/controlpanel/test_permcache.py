"""A logged-in user's permissions come from the shared cache while no account, role or group
changed (controlpanel.permcache, issue 22): the second page view reads none of the permission
tables, and a role taken away, a permission granted or a superuser flag flipped shows on the
very next request."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from controlpanel import pagecache, permcache

pytestmark = pytest.mark.django_db

HOSTS = reverse("hosts:list")
CHANGES = reverse("changes:list")


@pytest.fixture(autouse=True)
def _shared(settings):
    settings.PAGE_CACHE_SECONDS = 0
    settings.REDIS_URL = "redis://shared-by-every-process"  # the generation moves everywhere
    cache.clear()
    pagecache.bump()  # a running panel's cache has a generation


def _get(client, url):
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    # The permissions' tables, and the groups' (role names) the permissions don't join.
    permission_reads = [
        q["sql"] for q in queries if "auth_permission" in q["sql"] or "auth_user_groups" in q["sql"]
    ]
    return response.status_code, permission_reads


def _client(user):
    client = Client()
    client.force_login(user)
    return client


def test_the_second_view_reads_no_permission_tables(viewer):
    client = _client(viewer)
    status, reads = _get(client, HOSTS)
    assert status == 200 and reads  # read once and stored
    status, reads = _get(client, HOSTS)
    assert status == 200 and reads == []
    assert cache.get(permcache.key(viewer))[2] == ["Viewer"]  # the role names shown
    assert "Viewer" in client.get(HOSTS).content.decode()


def test_a_role_taken_away_shows_on_the_next_request(viewer, django_capture_on_commit_callbacks):
    client = _client(viewer)
    assert _get(client, HOSTS)[0] == 200
    with django_capture_on_commit_callbacks(execute=True):
        viewer.groups.clear()
    assert _get(client, HOSTS)[0] == 403


def test_a_permission_granted_to_a_role_shows_on_the_next_request(
    django_capture_on_commit_callbacks,
):
    role = Group.objects.create(name="Custom")
    user = get_user_model().objects.create_user(username="cleo", password="pw")
    user.groups.add(role)
    client = _client(user)
    assert _get(client, HOSTS)[0] == 403
    with django_capture_on_commit_callbacks(execute=True):
        role.permissions.add(Permission.objects.get(codename="view_host"))
    assert _get(client, HOSTS)[0] == 200


def test_a_superuser_flag_written_without_a_signal_is_not_answered_from_the_old_set():
    user = get_user_model().objects.create_user(username="sam", password="pw")
    client = _client(user)
    assert _get(client, CHANGES)[0] == 403
    get_user_model().objects.filter(pk=user.pk).update(is_superuser=True)  # no model signal
    assert _get(client, CHANGES)[0] == 200
    # Whoever lists the permissions (the shared parts' key does) gets a superuser's, too.
    user = get_user_model().objects.get(pk=user.pk)
    permcache.warm(user)
    assert "changes.add_changerequest" in user.get_all_permissions()


def test_each_user_has_a_set_of_their_own(viewer, operator):
    assert _get(_client(operator), HOSTS)[0] == 200
    viewer_client = _client(viewer)
    _get(viewer_client, HOSTS)
    cached = {u.username: cache.get(permcache.key(u))[1] for u in (viewer, operator)}
    assert "changes.add_changerequest" in cached["otto-operator"]
    assert "changes.add_changerequest" not in cached["vera-viewer"]


def test_off_where_the_generation_does_not_move_in_every_process(settings, viewer):
    settings.REDIS_URL = ""  # embedded: one process, the shared parts off
    client = _client(viewer)
    _get(client, HOSTS)
    status, reads = _get(client, HOSTS)
    assert status == 200 and reads
    assert cache.get(permcache.key(viewer)) is None


def test_a_lost_generation_never_brings_back_a_set_stored_before(viewer):
    client = _client(viewer)
    _get(client, HOSTS)
    _get(client, HOSTS)  # stored under the generation the first view started
    stale = cache.get(permcache.key(viewer))
    viewer.groups.clear()  # and the generation key is lost (evicted, flushed) meanwhile
    cache.delete(pagecache.GENERATION_KEY)
    cache.set(permcache.key(viewer), ("0", *stale[1:]))  # as if stored with no generation
    assert _get(client, HOSTS)[0] == 403
    assert _get(client, HOSTS)[0] == 403  # and from the new generation on
