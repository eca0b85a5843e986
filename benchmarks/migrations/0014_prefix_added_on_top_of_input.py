"""A shared prefix now comes on top of a profile's input length, as vLLM's
``--random-prefix-len`` (before, its tokens were the first of the input length, cut to it).

Profile versions are immutable and every run names the version it ran, so each stored version
with a prefix keeps the rule it was made under (``prefix_within_input``): it and its runs
still say what was sent. A built-in starter nobody edited gets its next version under the new
rule, so that it sends what its name says ("Shared system prompt": 2,000 shared tokens and
then ~300 of each request's own)."""

from django.db import migrations
from django.utils import timezone

NOTE = "prefix sent on top of the input length (vLLM's --random-prefix-len)"
# The starters' descriptions as of this change (benchmarks.loadgen.profile.BUILTINS).
DESCRIPTIONS = {
    "Shared system prompt": "Agents and assistants that reuse a 2,000-token system prompt: "
    "90 % of requests send one of 4 shared 2,000-token prefixes, then ~300 tokens of their "
    "own. Run with prefix caching on and off.",
}


def _has_prefix(spec) -> bool:
    if not isinstance(spec, dict):
        return False
    try:
        return int(spec.get("prefix_len") or 0) > 0
    except (TypeError, ValueError):
        return False


def forwards(apps, schema_editor):
    LoadProfile = apps.get_model("benchmarks", "LoadProfile")
    for pk, spec in LoadProfile.objects.values_list("pk", "spec"):
        if _has_prefix(spec) and "prefix_within_input" not in spec:
            LoadProfile.objects.filter(pk=pk).update(spec={**spec, "prefix_within_input": True})
    names = LoadProfile.objects.filter(source="builtin").values_list("name", flat=True).distinct()
    for name in sorted(set(names)):
        latest = LoadProfile.objects.filter(name=name).order_by("-version").first()
        if latest.source != "builtin" or not _has_prefix(latest.spec):
            continue  # edited since: its owners keep the rule they saved
        if latest.spec.get("prefix_within_input") is not True:
            continue  # made under the new rule already
        spec = {**latest.spec, "prefix_within_input": False}
        LoadProfile.objects.create(
            name=name,
            version=latest.version + 1,
            description=DESCRIPTIONS.get(name, latest.description),
            spec=spec,
            source="builtin",
            note=NOTE,
            created_at=timezone.now(),
        )


def backwards(apps, schema_editor):
    # The former code refuses an unknown key; the versions made above stay (runs may name
    # them) and are read under the former rule again.
    LoadProfile = apps.get_model("benchmarks", "LoadProfile")
    for pk, spec in LoadProfile.objects.values_list("pk", "spec"):
        if isinstance(spec, dict) and "prefix_within_input" in spec:
            rest = {k: v for k, v in spec.items() if k != "prefix_within_input"}
            LoadProfile.objects.filter(pk=pk).update(spec=rest)


class Migration(migrations.Migration):
    dependencies = [
        ("benchmarks", "0013_run_client_health"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
