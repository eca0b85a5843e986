"""Load profile pages: who may do what, the editor's round trip, versions that never change,
profiles from traffic samples, export and import, and the list's query count."""

import json
import random
from html.parser import HTMLParser

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from benchmarks.choices import ProfileSource
from benchmarks.forms.profiles import ProfileForm, initial_from_document
from benchmarks.loadgen.profile import BUILTINS, validate
from benchmarks.models import LoadProfile
from controlpanel.models import AuditEntry
from tests.factories import make_deployment, make_profile, make_run

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

SPEC = {
    "endpoint": "/v1/chat/completions",
    "stages": [
        {"name": "low", "concurrency": 4, "num_requests": 40},
        {
            "name": "peak",
            "request_rate": 2.5,
            "burstiness": 0.5,
            "max_concurrency": 64,
            "duration_s": 60,
        },
    ],
    "input_len": {"kind": "lognormal", "mean": 600, "stddev": 0.7, "low": 16, "high": 4096},
    "output_len": {"kind": "uniform", "low": 50, "high": 300},
    "prefix_len": 1000,
    "prefix_groups": 2,
    "prefix_share": 0.75,
    "warmup_requests": 5,
    "slo": {"ttft": 500, "e2el": 20000},
    "seed": 7,
    "max_error_rate": 0.05,
    "ignore_eos": False,
    "request_timeout_s": 300,
}


def post_data(spec: dict, **overrides) -> dict:
    """What the browser posts for the editor showing ``spec``."""
    initial = initial_from_document(spec)
    stages = initial.pop("stages")
    data = {"name": "Custom", "description": "", "note": ""}
    for key, value in initial.items():
        if isinstance(value, bool):
            if value:
                data[key] = "on"
        else:
            data[key] = "" if value is None else str(value)
    data.update(
        {
            "stage-TOTAL_FORMS": str(len(stages) + 3),
            "stage-INITIAL_FORMS": "0",
            "stage-MIN_NUM_FORMS": "0",
            "stage-MAX_NUM_FORMS": "20",
        }
    )
    for i, stage in enumerate(stages + [{"mode": "closed"}] * 3):
        for key in ("name", "mode", "concurrency", "request_rate", "burstiness"):
            data[f"stage-{i}-{key}"] = "" if stage.get(key) is None else str(stage[key])
        for key in ("max_concurrency", "num_requests", "duration_s"):
            data[f"stage-{i}-{key}"] = "" if stage.get(key) is None else str(stage[key])
    data.update(overrides)
    return data


def sample_file(name="traffic.jsonl", n=200, rate=4.0, seed=1) -> SimpleUploadedFile:
    rng = random.Random(seed)
    t, lines = 1_700_000_000.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        item = {"timestamp": t, "prompt_tokens": rng.randint(100, 900), "completion_tokens": 64}
        lines.append(json.dumps(item))
    return SimpleUploadedFile(name, ("\n".join(lines) + "\n").encode(), "application/jsonl")


# -- permissions ----------------------------------------------------------------------------

READ_ONLY = ("profiles", "profile", "profile_export")
WRITES = ("profile_create", "profile_edit", "profile_from_traffic", "profile_import")


def url(name, profile):
    return reverse(
        f"benchmarks:{name}",
        args=[profile.pk] if name in ("profile", "profile_edit", "profile_export") else [],
    )


@pytest.mark.parametrize("name", READ_ONLY + WRITES)
def test_anonymous_is_sent_to_log_in(client, name):
    response = client.get(url(name, make_profile()))
    assert response.status_code == 302 and reverse("login") in response["Location"]


@pytest.mark.parametrize("name", READ_ONLY + WRITES)
def test_no_role_is_forbidden(client, nobody, name):
    client.force_login(nobody)
    assert client.get(url(name, make_profile())).status_code == 403


@pytest.mark.parametrize("name", READ_ONLY)
def test_viewer_reads(client, viewer, name):
    client.force_login(viewer)
    assert client.get(url(name, make_profile())).status_code == 200


@pytest.mark.parametrize("name", WRITES)
def test_viewer_may_not_write(client, viewer, name):
    client.force_login(viewer)
    profile = make_profile()
    assert client.get(url(name, profile)).status_code == 403
    assert client.post(url(name, profile), post_data(SPEC)).status_code == 403
    assert LoadProfile.objects.filter(name=profile.name).count() == 1


@pytest.mark.parametrize("name", READ_ONLY + WRITES)
def test_operator_may_do_everything(client, operator, name):
    client.force_login(operator)
    assert client.get(url(name, make_profile())).status_code == 200


# -- list -----------------------------------------------------------------------------------


def test_list_shows_latest_versions_with_counts_in_a_fixed_number_of_queries(
    client, viewer, django_assert_max_num_queries
):
    deployment = make_deployment()
    for i in range(6):
        first = make_profile(name=f"load-{i}")
        make_profile(name=f"load-{i}", note="second")
        make_run(deployment, load_profile=first, status="succeeded")
    client.force_login(viewer)
    with django_assert_max_num_queries(6):
        response = client.get(reverse("benchmarks:profiles"))
    page = response.content.decode()
    rows = response.context["profiles"]
    assert len(rows) == 6 + len(BUILTINS)
    mine = {p.name: p for p in rows}
    assert mine["load-3"].version == 2 and mine["load-3"].version_count == 2
    assert mine["load-3"].run_count == 1  # the run of v1 counts for the name
    assert mine["Interactive chat"].run_count == 0 and mine["Interactive chat"].version_count == 1
    assert "Built-in starter" in page and "(2 versions)" in page


# -- create and edit ------------------------------------------------------------------------


def test_form_round_trip_gives_back_the_document(client, operator):
    client.force_login(operator)
    response = client.post(reverse("benchmarks:profile_create"), post_data(SPEC, note="first cut"))
    profile = LoadProfile.objects.get(name="Custom")
    assert response.status_code == 302 and response["Location"] == profile.get_absolute_url()
    assert profile.spec == validate(SPEC)
    assert (profile.version, profile.source, profile.created_by) == (1, "manual", operator)
    assert profile.note == "first cut"
    entry = AuditEntry.objects.get(action="profile.create")
    assert entry.actor == operator and entry.before is None
    assert entry.after["name"] == "Custom" and entry.after["version"] == 1
    assert entry.after["spec"]["slo"] == {"ttft": 500, "e2el": 20000}


def test_blank_rows_are_ignored_and_percentages_become_fractions():
    form = ProfileForm(post_data(SPEC, prefix_share_pct="12.5", max_error_rate_pct=""))
    assert form.is_valid(), form.errors
    assert len(form.document["stages"]) == 2
    assert form.document["prefix_share"] == 0.125 and form.document["max_error_rate"] is None


def test_invalid_stage_shows_the_validators_message_on_its_row(client, operator):
    client.force_login(operator)
    data = post_data(SPEC, **{"stage-1-request_rate": "0"})
    response = client.post(reverse("benchmarks:profile_create"), data)
    assert response.status_code == 200
    form = response.context["form"]
    assert form.stages.forms[1].errors["request_rate"] == ["stage 'peak': request_rate must be > 0"]
    assert "stage &#x27;peak&#x27;: request_rate must be &gt; 0" in response.content.decode()
    assert not LoadProfile.objects.filter(name="Custom").exists()


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        (
            {"input_kind": "uniform", "input_low": "", "input_high": ""},
            "input_low",
            "uniform needs",
        ),
        ({"slo_ttft": "-5"}, "slo_ttft", "goodput: ttft must be > 0 ms"),
        ({"max_error_rate_pct": "150"}, "max_error_rate_pct", "max_error_rate: must be between"),
        ({"prefix_share_pct": "300"}, "prefix_len", "prefix: need"),
        ({"output_kind": "fixed", "output_mean": ""}, "output_mean", "Give the mean"),
        ({"input_kind": "empirical"}, "input_kind", "traffic sample"),
        ({"stage-0-mode": "open"}, None, None),  # a rate is missing on the row
    ],
)
def test_field_errors_land_on_their_field(overrides, field, message):
    form = ProfileForm(post_data(SPEC, **overrides))
    assert not form.is_valid()
    if field is None:
        assert form.stages.forms[0].errors["request_rate"] == [
            "An open-loop stage needs a request rate."
        ]
    else:
        assert message in " ".join(form.errors[field])


def test_a_taken_name_is_refused_on_create():
    make_profile(name="Custom")
    form = ProfileForm(post_data(SPEC))
    assert not form.is_valid() and "edit it" in form.errors["name"][0]


def test_json_document_alternative(client, operator):
    client.force_login(operator)
    data = post_data(
        SPEC,
        document_text=json.dumps({"stages": [{"name": "x", "concurrency": 2, "num_requests": 5}]}),
    )
    client.post(reverse("benchmarks:profile_create"), data)
    assert LoadProfile.objects.get(name="Custom").spec["stages"] == [
        {"name": "x", "concurrency": 2, "num_requests": 5}
    ]
    bad = post_data(SPEC, name="Other", document_text='{"concurency": 3}')
    response = client.post(reverse("benchmarks:profile_create"), bad)
    assert response.context["form"].errors["document_text"] == [
        "profile: unknown field(s) concurency"
    ]
    not_json = post_data(SPEC, name="Other", document_text="{stages")
    response = client.post(reverse("benchmarks:profile_create"), not_json)
    assert "is not valid JSON" in response.context["form"].errors["document_text"][0]


def test_edit_creates_v2_and_leaves_v1_unchanged(client, operator, viewer):
    v1 = make_profile(name="Chat", spec=SPEC, description="original")
    stored = dict(v1.spec)
    client.force_login(operator)
    page = client.get(reverse("benchmarks:profile_edit", args=[v1.pk]))
    form = page.context["form"]
    assert form["input_mean"].value() == 600 and form["description"].value() == "original"
    data = post_data(
        SPEC,
        name="ignored",
        description="original",
        note="more peak",
        **{"stage-1-request_rate": "5"},
    )
    response = client.post(reverse("benchmarks:profile_edit", args=[v1.pk]), data)
    v2 = LoadProfile.objects.get(name="Chat", version=2)
    assert response["Location"] == v2.get_absolute_url()
    assert v2.spec["stages"][1]["request_rate"] == 5 and v2.note == "more peak"
    assert v2.description == "original" and v2.created_by == operator
    v1.refresh_from_db()
    assert v1.spec == stored and v1.version == 1 and v1.spec["stages"][1]["request_rate"] == 2.5
    entry = AuditEntry.objects.get(action="profile.create", object_id=str(v2.pk))
    assert entry.before["version"] == 1 and entry.after["version"] == 2

    client.force_login(viewer)
    old = client.get(reverse("benchmarks:profile", args=[v1.pk])).content.decode()
    assert "A newer version exists" in old and v2.get_absolute_url() in old
    new = client.get(reverse("benchmarks:profile", args=[v2.pk]))
    assert "A newer version exists" not in new.content.decode()
    history = new.context["history"]
    assert [row["profile"].version for row in history] == [2, 1]
    assert history[0]["changed"] == ["stages"] and history[1]["changed"] == []


def test_editing_a_starter_makes_it_the_teams_own(client, operator):
    starter = LoadProfile.objects.get(name="Interactive chat")
    client.force_login(operator)
    page = client.get(reverse("benchmarks:profile_edit", args=[starter.pk]))
    form = page.context["form"]
    data = post_data(starter.spec, note="tighter TTFT", slo_ttft="300")
    client.post(reverse("benchmarks:profile_edit", args=[starter.pk]), data)
    v2 = LoadProfile.objects.get(name="Interactive chat", version=2)
    assert v2.source == ProfileSource.MANUAL and v2.spec["slo"] == {"ttft": 300, "tpot": 50}
    assert form.fields["name"].disabled


def test_editing_a_traffic_profile_keeps_its_empirical_lengths_and_replay_rows(client, operator):
    client.force_login(operator)
    spec = {
        "input_len": {
            "kind": "empirical",
            "values": [[100, 0.5], [900, 0.5]],
            "low": 90,
            "high": 950,
        },
        "replay": {"rows": [[0, 100, 10], [4, 900, 20]], "time_scale": 1},
    }
    base = make_profile(name="Replayed", spec=spec, source=ProfileSource.REPLAY)
    data = post_data(base.spec, time_scale="0.25", note="faster")
    client.post(reverse("benchmarks:profile_edit", args=[base.pk]), data)
    v2 = LoadProfile.objects.get(name="Replayed", version=2)
    assert v2.spec["replay"] == {"rows": [[0, 100, 10], [4, 900, 20]], "time_scale": 0.25}
    assert v2.spec["input_len"]["values"] == [[100, 0.5], [900, 0.5]]
    assert v2.source == ProfileSource.REPLAY


# -- detail ---------------------------------------------------------------------------------


def test_detail_renders_the_document_and_recent_runs(client, viewer):
    profile = make_profile(name="Chat", spec=SPEC)
    run = make_run(load_profile=profile, label="nightly")
    client.force_login(viewer)
    page = client.get(reverse("benchmarks:profile", args=[profile.pk])).content.decode()
    assert "open loop: 2.5 req/s, burstiness 0.5, at most 64 in flight" in page
    assert "closed loop: 4 concurrent" in page
    assert "lognormal: mean 600, sigma 0.7, within 16–4096" in page
    assert "ttft ≤ 500 ms" in page and "1000 tokens, 2 distinct, on 75 %" in page
    assert reverse("benchmarks:detail", args=[run.pk]) in page and "nightly" in page
    assert f"{reverse('benchmarks:new')}?profile={profile.pk}" not in page  # viewers can't run


def test_detail_reads_a_fixed_number_of_queries(client, viewer, django_assert_max_num_queries):
    profile = make_profile(name="Busy")
    make_profile(name="Busy", note="v2")
    for _ in range(5):
        make_run(load_profile=profile, status="succeeded")
    client.force_login(viewer)
    with django_assert_max_num_queries(10):
        response = client.get(reverse("benchmarks:profile", args=[profile.pk]))
    assert len(response.context["runs"]) == 5


def test_operator_gets_a_run_button(client, operator):
    profile = make_profile()
    client.force_login(operator)
    page = client.get(reverse("benchmarks:profile", args=[profile.pk])).content.decode()
    assert f"{reverse('benchmarks:new')}?profile={profile.pk}" in page


# -- export and import ----------------------------------------------------------------------


def test_export_import_round_trip(client, operator):
    original = make_profile(name="Chat", spec=SPEC, description="shared")
    client.force_login(operator)
    response = client.get(reverse("benchmarks:profile_export", args=[original.pk]))
    assert response["Content-Disposition"] == 'attachment; filename="chat-v1.json"'
    exported = json.loads(response.content)
    assert exported["format"] == "llm-control-panel/load-profile" and exported["version"] == 2
    assert (exported["name"], exported["description"]) == ("Chat", "shared")

    upload = SimpleUploadedFile("chat-v1.json", response.content, "application/json")
    response = client.post(reverse("benchmarks:profile_import"), {"file": upload, "note": ""})
    imported = LoadProfile.objects.get(name="Chat", version=2)
    assert response["Location"] == imported.get_absolute_url()
    assert imported.spec == validate(original.spec) and imported.description == "shared"
    assert imported.source == ProfileSource.IMPORTED and imported.note == "imported"
    entry = AuditEntry.objects.get(action="profile.import")
    assert entry.after["version"] == 2 and entry.actor == operator


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            b'{"format": "vllm-bench", "spec": {}}',
            "not a load profile export (format &#x27;vllm-bench&#x27;",
        ),
        (b"not json", "the file is not valid JSON"),
        (
            json.dumps(
                {
                    "format": "llm-control-panel/load-profile",
                    "version": 1,
                    "name": "X",
                    "spec": {"stages": []},
                }
            ).encode(),
            "stages: at least one stage",
        ),
    ],
)
def test_import_refuses_other_files(client, operator, content, message):
    client.force_login(operator)
    upload = SimpleUploadedFile("x.json", content, "application/json")
    response = client.post(reverse("benchmarks:profile_import"), {"file": upload})
    assert response.status_code == 200 and message in response.content.decode()
    assert not AuditEntry.objects.filter(action="profile.import").exists()


# -- from traffic ---------------------------------------------------------------------------


def test_traffic_preview_then_save_a_fit(client, operator):
    client.force_login(operator)
    target = reverse("benchmarks:profile_from_traffic")
    response = client.post(target, {"file": sample_file(), "action": "preview"})
    assert response.status_code == 200
    preview = response.context["preview"]
    assert preview["stats"]["count"] == 200 and preview["replay"].startswith("replay of 200")
    page = response.content.decode()
    assert "What the sample says" in page
    form = response.context["form"]
    assert not form.errors
    assert form.data["name"] == "traffic" and form.data["sample"]
    assert not LoadProfile.objects.filter(name="traffic").exists()

    data = {k: form.data.get(k, "") for k in ("sample", "name", "time_scale")}
    data.update(mode="fit", name="Prod chat", action="save", num_requests="50")
    response = client.post(target, data)
    profile = LoadProfile.objects.get(name="Prod chat")
    assert response["Location"] == profile.get_absolute_url()
    assert profile.source == ProfileSource.TRAFFIC and profile.note == "fitted to 200 requests"
    stage = profile.spec["stages"][0]
    assert stage["num_requests"] == 50
    assert stage["request_rate"] == pytest.approx(preview["stats"]["rate"], rel=1e-4)
    assert profile.spec["input_len"]["kind"] == "empirical"
    assert AuditEntry.objects.get(action="profile.create").after["source"] == "traffic"


def test_traffic_replay_with_a_new_upload(client, operator):
    client.force_login(operator)
    data = {
        "file": sample_file(n=30),
        "mode": "replay",
        "name": "Replay",
        "time_scale": "0.5",
        "action": "save",
    }
    client.post(reverse("benchmarks:profile_from_traffic"), data)
    profile = LoadProfile.objects.get(name="Replay")
    assert profile.source == ProfileSource.REPLAY
    assert len(profile.spec["replay"]["rows"]) == 30 and profile.spec["replay"]["time_scale"] == 0.5
    entry = AuditEntry.objects.get(action="profile.create")
    assert entry.after["spec"]["replay"]["rows"] == 30  # counted, not copied


def test_traffic_errors_are_shown(client, operator):
    client.force_login(operator)
    target = reverse("benchmarks:profile_from_traffic")
    bad = SimpleUploadedFile("t.csv", b"input_tokens,output_tokens\n10,5\n10,x\n")
    response = client.post(target, {"file": bad, "action": "preview"})
    assert "line 3: output_tokens &#x27;x&#x27; is not a number" in response.content.decode()
    response = client.post(target, {"action": "save", "name": "x", "mode": "fit"})
    assert "Choose a JSONL or CSV file." in response.content.decode()
    # A carried sample that was tampered with is refused, not trusted.
    response = client.post(target, {"file": sample_file(), "action": "preview"})
    token = response.context["form"].data["sample"]
    tampered = {"sample": token[:-3] + "abc", "mode": "fit", "name": "T", "action": "save"}
    response = client.post(target, tampered)
    assert "altered" in response.content.decode()
    # Replay needs timestamps.
    untimed = SimpleUploadedFile("t.csv", b"input_tokens,output_tokens\n10,5\n12,5\n")
    data = {"file": untimed, "mode": "replay", "name": "R", "action": "save"}
    response = client.post(target, data)
    assert "replay: the sample has no timestamps" in response.content.decode()
    assert not LoadProfile.objects.filter(name__in=["x", "T", "R"]).exists()


class FormValues(HTMLParser):
    """The values a browser would submit for the page's inputs, selects and textareas."""

    def __init__(self):
        super().__init__()
        self.values, self._select, self._textarea = {}, None, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "input" and a.get("name") and a.get("type") not in ("file", "submit"):
            if a.get("type") in ("checkbox", "radio"):
                if "checked" in a:
                    self.values[a["name"]] = a.get("value", "on")
            else:
                self.values[a["name"]] = a.get("value") or ""
        elif tag == "select":
            self._select = a["name"]
            self.values.setdefault(self._select, None)
        elif tag == "option" and self._select:
            if self.values[self._select] is None or "selected" in a:
                self.values[self._select] = a.get("value", "")
        elif tag == "textarea":
            self._textarea = a["name"]
            self.values[self._textarea] = ""

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None

    def handle_data(self, data):
        if self._textarea:
            self.values[self._textarea] += data.strip()


def browser_values(page: str) -> dict:
    parser = FormValues()
    parser.feed(page)
    return {k: v for k, v in parser.values.items() if v is not None}


@pytest.mark.parametrize("name", list(BUILTINS))
def test_saving_the_editor_unchanged_keeps_the_document(client, operator, name):
    """What the page renders, posted back as a browser would, is the same load."""
    base = LoadProfile.objects.get(name=name)
    client.force_login(operator)
    page = client.get(reverse("benchmarks:profile_edit", args=[base.pk])).content.decode()
    data = browser_values(page)
    assert data["stage-INITIAL_FORMS"] == str(len(base.spec["stages"]))
    response = client.post(reverse("benchmarks:profile_edit", args=[base.pk]), data)
    assert response.status_code == 302, response.context["form"].errors
    v2 = LoadProfile.objects.get(name=name, version=2)
    assert v2.spec == base.spec and v2.description == base.description


def test_a_sample_too_large_to_carry_asks_for_the_file_again(client, operator, monkeypatch):
    from benchmarks.services import profiles as services

    monkeypatch.setattr(services, "SAMPLE_MAX_CHARS", 100)
    client.force_login(operator)
    target = reverse("benchmarks:profile_from_traffic")
    response = client.post(target, {"file": sample_file(), "action": "preview"})
    assert response.context["form"].data["sample"] == ""
    assert "too large to carry" in response.content.decode()


def test_pasted_json_of_a_replay_keeps_its_elided_rows(client, operator):
    spec = {"replay": {"rows": [[0, 100, 10], [4, 900, 20]], "time_scale": 1}}
    base = make_profile(name="Replayed", spec=spec, source=ProfileSource.REPLAY)
    client.force_login(operator)
    page = client.get(reverse("benchmarks:profile_edit", args=[base.pk]))
    shown = json.loads(page.context["current_json"])
    assert shown["replay"]["rows"] == "<2 rows>"
    shown["replay"]["time_scale"] = 2
    data = post_data(base.spec, document_text=json.dumps(shown))
    client.post(reverse("benchmarks:profile_edit", args=[base.pk]), data)
    v2 = LoadProfile.objects.get(name="Replayed", version=2)
    assert v2.spec["replay"] == {"rows": [[0, 100, 10], [4, 900, 20]], "time_scale": 2}
