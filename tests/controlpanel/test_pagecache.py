"""Shared page parts (controlpanel.pagecache, issue 22): the hosts list, the history and the
dashboard's fleet cards are rendered once for every viewer of a role and reused; a committed
write shows at once; a write without a model signal shows within PAGE_CACHE_SECONDS; what is
one user's own (their name, their attention list, their CSRF token, buttons of their role)
is never taken from another user's page."""

from __future__ import annotations

import pickle
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import AnonymousUser, Group
from django.core.cache import cache
from django.core.cache.backends import base as cache_base
from django.core.cache.backends import locmem
from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from controlpanel import pagecache
from hosts.models import Gpu, GpuSample, Host
from tests.factories import make_deployment, make_finished_run, make_gpu, make_host

pytestmark = pytest.mark.django_db

HOSTS = reverse("hosts:list")
HISTORY = reverse("benchmarks:list")
DASHBOARD = reverse("dashboard")


@pytest.fixture(autouse=True)
def _on(settings):
    settings.PAGE_CACHE_SECONDS = 1
    cache.clear()
    pagecache.clear_local()


@pytest.fixture
def clock(monkeypatch):
    """The local-memory cache's clock, moved by hand (its expiry reads time.time())."""

    class Clock:
        now = 1_000_000.0

        def time(self):
            return self.now

    fake = Clock()
    monkeypatch.setattr(locmem, "time", fake)
    monkeypatch.setattr(cache_base, "time", fake)
    monkeypatch.setattr(pagecache, "time", fake)
    return fake


def _viewer(django_user_model, name: str):
    user = django_user_model.objects.create_user(username=name, password="pw")
    user.groups.add(Group.objects.get(name="Viewer"))
    return user


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _get(client, url, **params):
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, params)
    assert response.status_code == 200
    return response.content.decode(), len(queries)


def _host_names(html: str) -> list[str]:
    return re.findall(r'<tr data-host="([^"]+)"', html)


def _row(html: str, name: str) -> str:
    return re.search(rf'<tr data-host="{name}">(.*?)</tr>', html, re.S).group(1)


def _fleet(n: int) -> None:
    for i in range(n):
        host = make_host(name=f"fleet-{i:02d}")
        make_gpu(host, last_sample={"utilization_gpu_pct": 40.0, "memory_used_bytes": 2**30})


def _shared_parts() -> list[str]:
    """Every shared part now in the local-memory cache, as stored."""
    return [
        pickle.loads(value)[0]  # (html, fresh until)
        for key, value in locmem._caches[""].items()
        if ":pagecache:part:" in key
    ]


def test_a_second_viewer_of_the_role_gets_the_list_without_its_queries(django_user_model):
    _fleet(6)
    first, second = _viewer(django_user_model, "ada"), _viewer(django_user_model, "bob")
    html_a, queries_a = _get(_client(first), HOSTS)
    html_b, queries_b = _get(_client(second), HOSTS)
    assert _host_names(html_a) == _host_names(html_b) == [f"fleet-{i:02d}" for i in range(6)]
    # The list's own queries (hosts, GPUs, deployments, count, models) ran once.
    assert queries_b <= queries_a - 4, (queries_a, queries_b)
    # Each page is still the user's own outside the shared part.
    assert "ada" in html_a and "bob" not in html_a
    assert "bob" in html_b and "ada" not in html_b


def test_the_cache_off_renders_every_time(settings, django_user_model):
    settings.PAGE_CACHE_SECONDS = 0
    _fleet(3)
    client = _client(_viewer(django_user_model, "ada"))
    _, first = _get(client, HOSTS)
    _, again = _get(client, HOSTS)
    assert again == first
    assert _shared_parts() == []


def test_a_role_never_gets_another_roles_buttons(viewer, operator):
    _fleet(2)
    as_operator, _ = _get(_client(operator), HOSTS)
    as_viewer, _ = _get(_client(viewer), HOSTS)
    again_operator, _ = _get(_client(operator), HOSTS)
    assert "Add host" in as_operator and "Add host" in again_operator
    assert "Add host" not in as_viewer


def test_filters_and_pages_are_parts_of_their_own(viewer):
    _fleet(3)
    Host.objects.filter(name="fleet-01").update(status="unreachable")
    client = _client(viewer)
    everything, _ = _get(client, HOSTS)
    trouble, _ = _get(client, HOSTS, status="trouble")
    assert _host_names(everything) == ["fleet-00", "fleet-01", "fleet-02"]
    assert _host_names(trouble) == ["fleet-01"]


def test_a_committed_write_shows_at_once(viewer, django_capture_on_commit_callbacks):
    _fleet(2)
    client = _client(viewer)
    before, _ = _get(client, HOSTS)
    with django_capture_on_commit_callbacks(execute=True):
        make_host(name="fleet-new")
    after, _ = _get(client, HOSTS)
    assert "fleet-new" not in _host_names(before)
    assert "fleet-new" in _host_names(after)


def test_a_write_without_a_signal_shows_within_the_cache_seconds(viewer, clock):
    _fleet(2)
    client = _client(viewer)
    _get(client, HOSTS)
    # Telemetry writes the newest readings in batches (no model signal), as .update() does.
    Gpu.objects.update(last_sample={"utilization_gpu_pct": 97.0, "memory_used_bytes": 2**30})
    soon, _ = _get(client, HOSTS)
    assert "97" not in _row(soon, "fleet-00")  # still the part rendered a moment ago
    clock.now += 1.01
    later, _ = _get(client, HOSTS)
    assert "97" in _row(later, "fleet-00")


def test_quiet_models_and_rolled_back_writes_keep_the_generation(
    viewer, django_capture_on_commit_callbacks
):
    host = make_host(name="fleet-a")
    gpu = make_gpu(host)
    with django_capture_on_commit_callbacks(execute=True):
        pagecache.bump()
    before = pagecache.generation()
    with django_capture_on_commit_callbacks(execute=True):
        GpuSample.objects.create(gpu=gpu, time=timezone.now(), utilization_pct=1.0)
    assert pagecache.generation() == before
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        host.save()
    assert len(callbacks) == 1  # waits for a commit that, here, never comes
    assert pagecache.generation() == before
    with django_capture_on_commit_callbacks(execute=True):
        host.save()
    assert pagecache.generation() != before


def test_the_dashboard_shares_the_fleet_cards_but_not_the_attention_list(viewer, django_user_model):
    _fleet(2)
    Host.objects.filter(name="fleet-00").update(status="unreachable", last_error="refused")
    second = _viewer(django_user_model, "bob")
    html_a, queries_a = _get(_client(viewer), DASHBOARD)
    html_b, queries_b = _get(_client(second), DASHBOARD)
    assert queries_b < queries_a
    for html in (html_a, html_b):
        assert 'data-testid="attention-host"' in html  # each user's own list, read for them
        assert 'data-testid="host-count">2<' in html


def test_the_history_list_is_shared_and_keeps_its_filters(viewer, django_user_model):
    deployment = make_deployment()
    runs = [make_finished_run(deployment, label=f"run-{i}") for i in range(3)]
    second = _viewer(django_user_model, "bob")
    html_a, queries_a = _get(_client(viewer), HISTORY)
    html_b, queries_b = _get(_client(second), HISTORY)
    assert queries_b < queries_a
    rows = re.findall(r'<tr data-run="(\d+)"', html_b)
    assert sorted(int(r) for r in rows) == sorted(r.pk for r in runs)
    only, _ = _get(_client(second), HISTORY, q="run-1")
    assert re.findall(r'<tr data-run="(\d+)"', only) == [str(runs[1].pk)]


def test_no_shared_part_holds_a_csrf_token_or_the_users_menu(viewer, operator):
    _fleet(2)
    make_finished_run(make_deployment())
    host = Host.objects.get(name="fleet-00")
    for user in (viewer, operator):
        client = _client(user)
        for url in (HOSTS, HISTORY, DASHBOARD, reverse("hosts:detail", args=[host.pk])):
            _get(client, url)
    parts = _shared_parts()
    assert len(parts) >= 8  # 4 pages (the dashboard in two parts) x 2 roles
    placeholder = pagecache.csrf_placeholder()
    for part in parts:
        # A form in a part holds the placeholder, never a token.
        for token in re.findall(r'name="csrfmiddlewaretoken" value="([^"]*)"', part):
            assert token == placeholder
        assert 'class="user"' not in part and "Log out" not in part
    # The operator's host page has forms (Test connection): stored with the placeholder.
    assert any(placeholder in part for part in parts)


def _tokens(html: str) -> set[str]:
    return set(re.findall(r'name="csrfmiddlewaretoken" value="([^"]*)"', html))


def test_a_shared_part_with_forms_gets_each_viewers_own_csrf_token(operator, django_user_model):
    """The host page's body (forms included) is rendered once for the role; each viewer's forms
    carry their own CSRF token, which the CSRF check accepts, and never the renderer's."""
    host = make_host(name="shared-forms")
    make_gpu(host)
    make_deployment(host=host)
    other = django_user_model.objects.create_user(username="op2", password="pw")
    other.groups.add(Group.objects.get(name="Operator"))
    url = reverse("hosts:detail", args=[host.pk])
    first_client = Client(enforce_csrf_checks=True)
    first_client.force_login(operator)
    second_client = Client(enforce_csrf_checks=True)
    second_client.force_login(other)
    first, first_queries = _get(first_client, url)
    with CaptureQueriesContext(connection) as queries:
        second = second_client.get(url).content.decode()
    # Served from the part: no GPU, deployment or check query for the second viewer.
    assert not [q for q in queries if "hosts_gpu" in q["sql"] or "hosts_hostcheck" in q["sql"]]
    assert len(queries) < first_queries
    assert 'data-testid="check-host"' in second
    placeholder = pagecache.csrf_placeholder()
    assert placeholder not in first and placeholder not in second
    mine, theirs = _tokens(first), _tokens(second)
    assert len(mine) == 1 and len(theirs) == 1  # one token a page, in every form
    assert not mine & theirs
    # The token the second viewer was handed is theirs: a POST with it passes the CSRF check
    # (204: the check is queued), and the first viewer's token on their session does not.
    check = reverse("hosts:check", args=[host.pk])
    ok = second_client.post(check, {"csrfmiddlewaretoken": theirs.pop()}, HTTP_HX_REQUEST="true")
    assert ok.status_code == 204
    other_client = Client(enforce_csrf_checks=True)
    other_client.force_login(other)
    refused = other_client.post(check, {"csrfmiddlewaretoken": mine.pop()}, HTTP_HX_REQUEST="true")
    assert refused.status_code == 403


def test_the_csrf_placeholder_is_secret_and_replaced_wherever_it_stands(settings):
    """Someone who can write text into a shared part (a host's notes) cannot have a viewer's
    token written into it: the placeholder is derived from SECRET_KEY."""
    placeholder = pagecache.csrf_placeholder()
    assert len(placeholder) > 40
    settings.SECRET_KEY = "another-secret-key-" + "x" * 40
    assert pagecache.csrf_placeholder() != placeholder
    html = pagecache.with_csrf_tokens(f"<a href='/?t={pagecache.csrf_placeholder()}'>", "TOKEN")
    assert html == "<a href='/?t=TOKEN'>"
    assert pagecache.with_csrf_tokens("no form here", "TOKEN") == "no form here"


def test_the_attention_card_keeps_each_users_own_rows(viewer, approver, django_user_model):
    deployment = make_deployment()
    make_finished_run(deployment, requested_by=approver, status="failed")
    second = _viewer(django_user_model, "bob")
    mine, _ = _get(_client(approver), DASHBOARD)
    theirs, _ = _get(_client(viewer), DASHBOARD)
    assert 'data-testid="attention-failed-run"' in mine
    assert 'data-testid="attention-empty"' not in mine
    assert 'data-testid="attention-failed-run"' not in theirs
    assert 'data-testid="attention-empty"' in theirs
    # A host in trouble is the fleet's: once written (committed), every viewer's card has it.
    Host.objects.filter(pk=deployment.host_id).update(status="unreachable")
    pagecache.bump()
    again, _ = _get(_client(second), DASHBOARD)
    assert 'data-testid="attention-host"' in again
    assert 'data-testid="attention-empty"' not in again


def test_a_finished_runs_body_is_shared_and_a_running_ones_is_not(viewer, django_user_model):
    deployment = make_deployment()
    finished = make_finished_run(deployment)
    running = make_finished_run(deployment, status="running", finished_at=None)
    second = _viewer(django_user_model, "bob")
    url = finished.get_absolute_url()
    html_a, queries_a = _get(_client(viewer), url)
    second_client = _client(second)
    with CaptureQueriesContext(connection) as queries:
        html_b = second_client.get(url).content.decode()
    assert 'data-testid="run-results"' in html_a and 'data-testid="run-results"' in html_b
    assert 'id="run-points"' in html_b
    assert html_b.count(f"<title>{finished}") == 1
    assert len(queries) < queries_a
    # The whole page body is the stored part: the second viewer reads the run's status and
    # label only, no join to its deployment, host or profile.
    run_reads = [q["sql"] for q in queries if "benchmarks_benchmarkrun" in q["sql"]]
    assert len(run_reads) == 1 and "JOIN" not in run_reads[0]
    assert len(_shared_parts()) == 1
    _get(_client(viewer), running.get_absolute_url())
    _get(_client(second), running.get_absolute_url())
    assert len(_shared_parts()) == 1  # a live page is read whole every time


def test_a_process_with_the_parts_off_still_moves_the_shared_generation(
    settings, django_capture_on_commit_callbacks
):
    """A Celery worker started with PAGE_CACHE_SECONDS=0 writes rows the web processes show
    from the shared cache: its writes still replace the generation."""
    settings.PAGE_CACHE_SECONDS = 0
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"  # what production sets; not contacted here
    before = pagecache.generation()
    with django_capture_on_commit_callbacks(execute=True):
        make_host(name="written-by-a-worker")
    assert pagecache.generation() != before
    settings.REDIS_URL = None  # embedded: nothing is shared, nothing to move
    before = pagecache.generation()
    with django_capture_on_commit_callbacks(execute=True):
        make_host(name="embedded")
    assert pagecache.generation() == before


def _anonymous(path="/fleet"):
    request = RequestFactory().get(path)
    request.user = AnonymousUser()
    return request


def test_an_expired_part_is_rendered_once_while_the_others_serve_its_last_copy(clock):
    request, renders = _anonymous(), []

    def render(text):
        return lambda: renders.append(text) or text

    assert pagecache.shared(request, "p", render("v1")) == "v1"
    assert pagecache.shared(request, "p", render("v2")) == "v1"  # fresh: no render
    clock.now += 1.01
    lock = pagecache.part_key(request, "p").replace(":part:", ":rendering:")
    assert cache.add(lock, 1)  # another viewer is rendering the expired part
    assert pagecache.shared(request, "p", render("v3")) == "v1"  # its last copy meanwhile
    cache.delete(lock)
    assert pagecache.shared(request, "p", render("v4")) == "v4"  # this viewer renders it
    assert cache.get(lock) is None  # and lets the next expiry's renderer in
    assert pagecache.shared(request, "p", render("v5")) == "v4"
    assert renders == ["v1", "v4"]


def test_an_old_copy_is_never_served_past_the_grace_nor_across_a_write(
    clock, django_capture_on_commit_callbacks
):
    request = _anonymous()
    pagecache.shared(request, "p", lambda: "old")
    lock = pagecache.part_key(request, "p").replace(":part:", ":rendering:")
    cache.add(lock, 1, timeout=60)  # a render that never finishes (its process died)
    clock.now += 1 + pagecache.RENDER_GRACE_SECONDS + 0.01
    assert pagecache.shared(request, "p", lambda: "new") == "new"
    # A committed write: a new generation, a new key with no copy to serve, lock or not.
    with django_capture_on_commit_callbacks(execute=True):
        make_host(name="written")
    cache.add(pagecache.part_key(request, "p").replace(":part:", ":rendering:"), 1)
    assert pagecache.shared(request, "p", lambda: "after the write") == "after the write"


def test_a_failed_render_lets_the_next_viewer_render(clock):
    request = _anonymous()
    pagecache.shared(request, "p", lambda: "v1")
    clock.now += 1.01

    def broken():
        raise RuntimeError("the database went away")

    with pytest.raises(RuntimeError):
        pagecache.shared(request, "p", broken)
    assert pagecache.shared(request, "p", lambda: "v2") == "v2"


def test_a_hosts_recent_samples_are_read_once_for_every_viewer(viewer, django_user_model):
    host = make_host(name="polled")
    gpu = make_gpu(host)
    now = timezone.now()
    GpuSample.objects.bulk_create(
        GpuSample(gpu=gpu, time=now - timedelta(seconds=s), utilization_pct=61.5)
        for s in range(1, 20)
    )
    url = reverse("hosts:detail", args=[host.pk])
    first, _ = _get(_client(viewer), url)
    with CaptureQueriesContext(connection) as queries:
        second = _client(_viewer(django_user_model, "bob")).get(url).content.decode()
    assert not [q for q in queries if "hosts_gpusample" in q["sql"]]
    script = 'id="telemetry-data"'
    assert script in first and first.count("61.5") == second.count("61.5") > 0
    # The page's forms (CSRF tokens) stay each viewer's own.
    assert "csrfmiddlewaretoken" not in "".join(_shared_parts())


class _CountingCache:
    """The cache, counting the reads of the generation key (get and get_many)."""

    def __init__(self, real):
        self.real, self.generation_reads = real, 0

    def get(self, key, *args, **kwargs):
        self.generation_reads += key == pagecache.GENERATION_KEY
        return self.real.get(key, *args, **kwargs)

    def get_many(self, keys, *args, **kwargs):
        self.generation_reads += pagecache.GENERATION_KEY in keys
        return self.real.get_many(keys, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_a_request_reads_the_generation_once_for_all_its_parts(monkeypatch, viewer):
    """The dashboard has three shared parts and the permissions read with the generation: one
    Redis round trip for it a request, not one per part."""
    from controlpanel import permcache

    _fleet(2)
    pagecache.bump()
    counting = _CountingCache(cache)
    monkeypatch.setattr(pagecache, "cache", counting)
    monkeypatch.setattr(permcache, "cache", counting)
    client = _client(viewer)
    _get(client, DASHBOARD)
    counting.generation_reads = 0
    html, _ = _get(client, DASHBOARD)
    assert 'data-testid="attention"' in html
    assert counting.generation_reads == 1


def test_a_write_in_the_same_process_moves_the_requests_generation(rf, viewer):
    """A request that writes (the generation moves on commit) and then renders a part never
    keys it by the generation it read before its write."""
    request = rf.get("/hosts/")
    request.user = viewer
    before = pagecache.part_key(request, "p")
    assert pagecache.part_key(request, "p") == before  # remembered
    pagecache.bump()
    assert pagecache.part_key(request, "p") != before


def test_a_part_rendered_without_the_csrf_processor_still_gets_the_requests_token(rf, viewer):
    """A plain Context with the request (no context processors): the form gets the request's
    own token, never "None"."""
    from django.middleware.csrf import get_token
    from django.template import Context, Template

    request = rf.get("/hosts/")
    request.user = viewer
    html = Template(
        '{% load pagecache %}{% shared "p" %}<form>{% csrf_token %}</form>{% endshared %}'
    ).render(Context({"request": request}))
    (token,) = _tokens(html)
    assert token not in ("None", pagecache.csrf_placeholder())
    assert len(token) == len(get_token(request)) == 64


def test_a_fresh_part_is_served_from_the_processs_own_copy(monkeypatch, clock):
    """A viewer of a part this process served in its fresh second reads no cache (Redis in
    production: one round trip and up to ~100 KB a view); once expired, the cache again."""
    request = _anonymous()
    reads = []
    real_get = cache.get

    def counting_get(key, *args, **kwargs):
        reads.append(key)
        return real_get(key, *args, **kwargs)

    monkeypatch.setattr(cache, "get", counting_get)
    key = pagecache.part_key(request, "p")
    assert pagecache.shared(request, "p", lambda: "v1") == "v1"
    reads.clear()
    assert pagecache.shared(request, "p", lambda: "v2") == "v1"
    assert key not in reads
    # Another process rendered the next copy into the cache; this one's is expired.
    clock.now += 1.01
    cache.set(key, ("from another process", clock.now + 1))
    assert pagecache.shared(request, "p", lambda: "v3") == "from another process"
    assert key in reads


def test_the_processs_own_copies_are_bounded(clock):
    request = _anonymous()
    for i in range(pagecache.LOCAL_PARTS * 3):
        pagecache.shared(request, f"p{i}", lambda i=i: f"v{i}")
        assert len(pagecache._local) <= pagecache.LOCAL_PARTS
    # The newest is kept; expired copies go first.
    assert pagecache.part_key(request, f"p{pagecache.LOCAL_PARTS * 3 - 1}") in pagecache._local
    clock.now += 1.01
    pagecache.shared(request, "after", lambda: "x")
    assert list(pagecache._local) == [pagecache.part_key(request, "after")]
