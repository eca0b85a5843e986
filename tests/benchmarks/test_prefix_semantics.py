"""The shared prefix on top of the input length (vLLM's --random-prefix-len) in the panel: the
profile editor and page say so, and the data migration keeps every stored version sending
what its runs sent while the untouched built-in starter gets a version that sends what its
name says."""

import importlib

import pytest
from django.apps import apps
from django.urls import reverse

from benchmarks.choices import ProfileSource
from benchmarks.loadgen.dataset import PromptFactory
from benchmarks.loadgen.profile import BUILTINS, build_spec
from benchmarks.models import LoadProfile
from tests.benchmarks.test_profile_pages import post_data
from tests.factories import make_profile, make_run

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

migration = importlib.import_module("benchmarks.migrations.0014_prefix_added_on_top_of_input")

SHARED = "Shared system prompt"
OLD_SHARED_SPEC = {  # as the former code stored the starter (no rule key)
    "stages": [{"name": "main", "concurrency": 32, "num_requests": 300}],
    "input_len": {"kind": "normal", "mean": 300, "stddev": 100, "low": 16, "high": 1024},
    "output_len": {"kind": "fixed", "mean": 150},
    "prefix_len": 2000,
    "prefix_groups": 4,
    "prefix_share": 0.9,
    "warmup_requests": 8,
    "slo": {"ttft": 400, "tpot": 50},
}


def prompt_lengths(spec: dict, n: int = 200) -> list[int]:
    built = build_spec(spec, "http://x.invalid", "m")
    factory = PromptFactory(built.dataset, built.seed)
    return [len(factory.make(i).payload) for i in range(n)]


def test_the_editor_says_the_prefix_is_added_on_top(client, operator):
    client.force_login(operator)
    page = client.get(reverse("benchmarks:profile_create")).content.decode()
    assert "The prefix is added on top of the input length, as vLLM's" in page
    assert "<code>--random-prefix-len</code>" in page
    assert "Added on top of the input length, as vLLM&#x27;s --random-prefix-len." in page
    assert "Input length includes the prefix" in page  # the other rule, a choice
    assert "counts the whole prompt, shared prefix included" not in page  # the old words


def test_the_starters_page_says_what_a_request_sends(client, viewer):
    client.force_login(viewer)
    starter = LoadProfile.objects.get(name=SHARED)
    page = client.get(starter.get_absolute_url()).content.decode()
    assert "added on top of the input length (as vLLM's <code>--random-prefix-len</code>)" in (page)
    assert "2100 tokens a request on average, 1800 of them in a shared prefix" in page


def test_the_other_rule_round_trips_through_the_editor(client, operator):
    client.force_login(operator)
    spec = {**OLD_SHARED_SPEC, "prefix_within_input": True}
    response = client.post(
        reverse("benchmarks:profile_create"), post_data(spec, name="agents (sampled)")
    )
    assert response.status_code == 302
    saved = LoadProfile.objects.get(name="agents (sampled)")
    assert saved.spec["prefix_within_input"] is True
    page = client.get(saved.get_absolute_url()).content.decode()
    assert "counted within the input length" in page
    unticked = client.post(reverse("benchmarks:profile_create"), post_data(OLD_SHARED_SPEC))
    assert unticked.status_code == 302
    assert LoadProfile.objects.get(name="Custom").spec["prefix_within_input"] is False


def test_the_migration_keeps_stored_versions_and_moves_the_untouched_starter():
    LoadProfile.objects.filter(name=SHARED).delete()
    old_starter = make_profile(
        SHARED, dict(OLD_SHARED_SPEC), source=ProfileSource.BUILTIN, description="old words"
    )
    run = make_run(load_profile=old_starter)
    users = make_profile("agents", {**OLD_SHARED_SPEC, "prefix_len": 500})
    plain = make_profile("no prefix")
    # A starter the team edited is theirs: it keeps its rule and gets no new version.
    make_profile("Offline batch", {**OLD_SHARED_SPEC, "prefix_len": 64})
    plain_spec = dict(plain.spec)

    migration.forwards(apps, None)

    old_starter.refresh_from_db()
    assert old_starter.spec["prefix_within_input"] is True
    # The run still describes what it sent: ~300-token prompts, the prefix cut into them.
    run.load_profile.refresh_from_db()
    assert max(prompt_lengths(run.profile_spec)) <= 1024
    new = LoadProfile.objects.get(name=SHARED, version=2)
    assert new.source == ProfileSource.BUILTIN and new.spec["prefix_within_input"] is False
    assert new.description == BUILTINS[SHARED]["description"]
    carried = [n for n in prompt_lengths(new.spec) if n > 2000]
    assert len(carried) > 150 and min(carried) >= 2016  # 2,000 shared + ≥ 16 own
    users.refresh_from_db()
    plain.refresh_from_db()
    assert users.spec["prefix_within_input"] is True
    assert plain.spec == plain_spec  # no prefix: nothing to keep
    assert not LoadProfile.objects.filter(name="agents", version=2).exists()
    assert LoadProfile.objects.filter(name="Offline batch").count() == 2
    edited = LoadProfile.objects.get(name="Offline batch", version=2)
    assert edited.spec["prefix_within_input"] is True

    migration.forwards(apps, None)  # idempotent: nothing more to mark or to move
    assert LoadProfile.objects.filter(name=SHARED).count() == 2

    migration.backwards(apps, None)
    old_starter.refresh_from_db()
    assert "prefix_within_input" not in old_starter.spec
