"""Issue 14 item 2: secret flags are masked everywhere, and nothing is masked by a substring of
its name.

The flag spec marks what is secret (``Flag.secret``: vLLM's and SGLang's ``api_key``), the
launch rules' named list marks secret variables (``HF_TOKEN``, ...), and one function
(hosts.engines.redaction.is_secret) decides for every place that shows, logs, exports or sends
a config: the change page, its timeline (page and JSON), the audit log and both its exports,
notifications, config history, benchmark records and exports. ``max_num_batched_tokens`` holds
"TOKEN" and is shown, exported and imported back with its value.
"""

from __future__ import annotations

import http.server
import json
import threading
from unittest import mock

import pytest
from django.contrib.contenttypes.models import ContentType
from django.urls import reverse

from benchmarks.models import BenchmarkRun
from benchmarks.services.environment import recorded_config
from benchmarks.services.imports import import_run
from changes import notify
from changes.forms import REMOVE_PREFIX
from changes.models import ChangeRequest
from changes.services import review
from controlpanel.models import AuditEntry
from hosts.engines import get_spec
from hosts.engines.redaction import MASK, is_secret, mask_argv, masked
from tests.factories import (
    make_config,
    make_deployment,
    make_finished_run,
    make_gpu,
    make_host,
    make_profile,
)

pytestmark = pytest.mark.django_db

SECRET = "sk-live-S3CRET-do-not-show"
HF_SECRET = "hf_S3CRETtoken"


@pytest.fixture
def deployment(db):
    host = make_host()
    make_gpu(host)
    deployment = make_deployment(host)
    deployment.active_config = make_config(
        deployment, {"max_num_seqs": 64}, env={"HF_TOKEN": HF_SECRET}
    )
    deployment.save()
    return deployment


@pytest.fixture
def webhook():
    """A local HTTP server standing in for Slack: records each POSTed JSON body."""
    received = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(json.loads(body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", received
    server.shutdown()


def propose_key(actor, deployment) -> ChangeRequest:
    return review.propose_change(
        actor,
        deployment,
        title="Protect the engine",
        rationale="anyone on the network can use it",
        settings={"max_num_seqs": 64, "max_num_batched_tokens": 4096, "api_key": SECRET},
        env=dict(deployment.active_config.env),
    )


def audit_texts(client) -> dict[str, str]:
    return {
        "page": client.get(reverse("audit")).content.decode(),
        "csv": b"".join(
            client.get(reverse("audit_export", kwargs={"fmt": "csv"})).streaming_content
        ).decode(),
        "json": client.get(reverse("audit_export", kwargs={"fmt": "json"})).content.decode(),
    }


# --- the one rule ------------------------------------------------------------------------------


def test_secret_by_spec_and_named_list_not_by_substring():
    for engine in ("vllm", "sglang"):
        spec = get_spec(engine)
        assert spec.flag("api_key").secret
        assert [f.dest for f in spec.flags if f.secret] == ["api_key"]
    assert is_secret("api_key") and is_secret("env.HF_TOKEN") and is_secret("HF_TOKEN")
    assert is_secret("env.VLLM_API_KEY") and is_secret("HUGGING_FACE_HUB_TOKEN")
    # Names that hold TOKEN/KEY but carry no credential keep their values.
    for name in ("max_num_batched_tokens", "max_total_tokens", "max_prefill_tokens"):
        assert not is_secret(name)
    assert masked({"max_num_batched_tokens": 4096, "api_key": SECRET}) == {
        "max_num_batched_tokens": 4096,
        "api_key": MASK,
    }
    assert mask_argv(["--api-key", SECRET, "--max-num-batched-tokens", "4096"]) == [
        "--api-key",
        MASK,
        "--max-num-batched-tokens",
        "4096",
    ]


def test_a_refused_secret_value_is_not_repeated_in_the_error():
    _, errors = get_spec("vllm").validate({"api_key": "two words " + SECRET})
    assert "api_key" in errors and SECRET not in errors["api_key"]


# --- the change's pages, timeline, audit log, notifications -----------------------------------


def test_api_key_is_masked_on_the_change_page_timeline_audit_and_notifications(
    client,
    operator,
    approver,
    viewer,
    deployment,
    mailoutbox,
    settings,
    webhook,
    django_capture_on_commit_callbacks,
):
    url, received = webhook
    settings.CHANGE_WEBHOOK_URL = url
    settings.CHANGE_NOTIFY_EMAILS = ["llm-ops@example.com"]
    with (
        mock.patch(
            "changes.tasks.notify_change.apply_async",
            side_effect=lambda args, **options: notify.send(*args),
        ),
        django_capture_on_commit_callbacks(execute=True),
    ):
        change = propose_key(operator, deployment)
    # The stored proposal keeps the real key: the engine needs it.
    assert change.settings["api_key"] == SECRET

    # Written masked: no audit entry holds the key.
    for entry in AuditEntry.objects.all():
        stored = json.dumps([entry.before, entry.after])
        assert SECRET not in stored and HF_SECRET not in stored

    client.force_login(viewer)
    page = client.get(change.get_absolute_url()).content.decode()
    timeline = client.get(reverse("changes:timeline", args=[change.pk])).content.decode()
    texts = {"change page": page, "timeline.json": timeline, **audit_texts(client)}
    for where, text in texts.items():
        assert SECRET not in text, where
        assert HF_SECRET not in text, where
    # What changed is still said: the key was set, and the batched-token budget with its value.
    assert 'data-flag="api_key"' in page and MASK in page
    assert 'data-flag="max_num_batched_tokens"' in page and "4096" in page
    items = json.loads(timeline)["items"]
    proposed = next(i for i in items if i["action"] == "propose")
    assert proposed["after"]["diff"] == {
        "api_key": [None, MASK],
        "max_num_batched_tokens": [None, 4096],
    }
    assert "max_num_batched_tokens" in texts["json"] and "4096" in texts["json"]

    # Mail and webhook: the key is not sent, the rest of the diff is.
    (mail,) = mailoutbox
    assert SECRET not in mail.body and SECRET not in mail.subject
    assert f"api_key: None → {MASK}" in mail.body
    assert "max_num_batched_tokens: None → 4096" in mail.body
    assert received and all(SECRET not in body["text"] for body in received)

    # An approver reviewing it sees the same.
    client.force_login(approver)
    assert SECRET not in client.get(change.get_absolute_url()).content.decode()


def test_entries_written_before_masking_are_masked_when_shown(client, viewer, operator, deployment):
    change = propose_key(operator, deployment)
    # An entry as the panel wrote it before secrets were masked at write time.
    AuditEntry.objects.create(
        actor=operator,
        actor_name=operator.get_username(),
        action="change.rebase",
        content_type=ContentType.objects.get_for_model(ChangeRequest),
        object_id=str(change.pk),
        object_repr=str(change),
        after={"diff": {"api_key": [None, SECRET], "env.HF_TOKEN": [HF_SECRET, None]}},
    )
    client.force_login(viewer)
    timeline = client.get(reverse("changes:timeline", args=[change.pk])).content.decode()
    page = client.get(change.get_absolute_url()).content.decode()
    for where, text in {"timeline.json": timeline, "page": page, **audit_texts(client)}.items():
        assert SECRET not in text and HF_SECRET not in text, where
    rebase = next(i for i in json.loads(timeline)["items"] if i["action"] == "rebase")
    # "Unset" stays visible: the reader still learns the key was added and the token removed.
    assert rebase["after"]["diff"] == {"api_key": [None, MASK], "env.HF_TOKEN": [MASK, None]}


def test_preview_and_config_history_mask_the_key(client, operator, viewer, deployment):
    client.force_login(operator)
    preview = client.post(
        reverse("changes:preview") + f"?deployment={deployment.pk}",
        {"flag_max_num_seqs": "64", "flag_api_key": SECRET, "flag_max_num_batched_tokens": "4096"},
    ).content.decode()
    assert 'data-flag="api_key"' in preview and SECRET not in preview and "4096" in preview

    make_config(deployment, {"max_num_seqs": 64, "api_key": SECRET}, env={"HF_TOKEN": "hf_other"})
    client.force_login(viewer)
    for url in (reverse("changes:all_configs"), reverse("changes:configs", args=[deployment.pk])):
        text = client.get(url).content.decode()
        assert "api_key" in text and SECRET not in text and "hf_other" not in text, url


def test_the_form_never_sends_the_running_key_back_and_empty_keeps_it(client, operator, deployment):
    deployment.active_config = make_config(deployment, {"max_num_seqs": 64, "api_key": SECRET})
    deployment.save()
    client.force_login(operator)
    url = reverse("changes:new") + f"?deployment={deployment.pk}"
    assert SECRET not in client.get(url).content.decode()
    form = {
        "title": "More sequences",
        "rationale": "queue wait",
        "flag_max_num_seqs": "128",
        "flag_api_key": "",
        "max_error_rate_increase": "1",
        "max_ttft_p95_regression": "20",
        "max_itl_p95_regression": "20",
        "action": "submit",
    }
    assert client.post(url, form).status_code == 302
    kept = ChangeRequest.objects.latest("pk")
    assert kept.settings["api_key"] == SECRET and kept.diff() == {"max_num_seqs": (64, 128)}
    review.withdraw_change(operator, kept)
    assert client.post(url, {**form, REMOVE_PREFIX + "api_key": "on"}).status_code == 302
    removed = ChangeRequest.objects.latest("pk")
    assert "api_key" not in removed.settings and removed.diff()["api_key"] == (SECRET, None)


# --- benchmark records: exported with every value but the secrets, imported back ------------


def test_max_num_batched_tokens_round_trips_export_and_import(client, viewer, operator):
    host = make_host()
    make_gpu(host)
    deployment = make_deployment(host)
    config = make_config(
        deployment,
        {"max_num_seqs": 64, "max_num_batched_tokens": 4096, "api_key": SECRET},
        env={"HF_TOKEN": HF_SECRET},
    )
    run = make_finished_run(
        deployment,
        engine_config=config,
        load_profile=make_profile(),
        label="budget",
        environment={"config": recorded_config(config)},
    )
    client.force_login(viewer)
    page = client.get(run.get_absolute_url()).content.decode()
    assert "max_num_batched_tokens" in page and "4096" in page and SECRET not in page
    exported = client.get(reverse("benchmarks:export_json", args=[run.pk])).content
    assert SECRET.encode() not in exported and HF_SECRET.encode() not in exported
    data = json.loads(exported)
    for recorded in (data["panel"]["config"], data["panel"]["environment"]["config"]):
        assert recorded["settings"]["max_num_batched_tokens"] == 4096
        assert recorded["settings"]["api_key"] == MASK and recorded["env"]["HF_TOKEN"] == MASK

    # Read back as the import does (the file's config not chosen among this panel's).
    import_run(operator, deployment, data)
    copy = BenchmarkRun.objects.exclude(pk=run.pk).get()
    assert copy.engine_config is None  # so the page shows what the file recorded

    client.force_login(viewer)
    page = client.get(copy.get_absolute_url()).content.decode()
    facts = page[page.index('data-testid="run-config"') :][:600]
    assert "not recorded" not in facts
    assert "max_num_batched_tokens" in facts and "4096" in facts
    compare = client.get(reverse("benchmarks:compare"), {"runs": [run.pk, copy.pk]})
    assert b"Config not recorded" not in compare.content
    assert compare.context["diff"]["unknown"] == []


# --- what engines repeat of their arguments ----------------------------------------------------


def test_engine_output_that_repeats_the_key_is_masked_in_the_operation_log(
    client, operator, viewer, monkeypatch
):
    from hosts.services import operations
    from hosts.transport.base import ApplyOutcome

    deployment = make_deployment(make_host())
    old = make_config(deployment, {"max_num_seqs": 64, "api_key": "sk-old-key-123"})
    deployment.active_config = old
    deployment.save()
    new = make_config(deployment, {"max_num_seqs": 64, "api_key": SECRET})
    # vLLM logs its non-default arguments at start, the key among them; the rollback's
    # output repeats the previous key.
    lines = [
        f"INFO non-default args: {{'api_key': '{SECRET}', 'max_num_seqs': 64}}",
        "INFO non-default args: {'api_key': 'sk-old-key-123'}",
    ]

    class Transport:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def apply_config(self, name, launch, *, previous, ready_timeout_s):
            return ApplyOutcome("rolled_back", f"not ready; args {SECRET}", log_lines=lines)

    monkeypatch.setattr(operations, "transport_for", lambda host, deployment=None: Transport())
    operation = operations.request_operation(operator, deployment, "apply", new)
    operations.run_operation(operation)
    operation.refresh_from_db()
    assert f"'api_key': '{MASK}'" in operation.engine_log and "max_num_seqs" in operation.engine_log
    assert SECRET not in operation.engine_log + operation.error
    assert "sk-old-key-123" not in operation.engine_log
    deployment.refresh_from_db()
    assert SECRET not in operation.log and SECRET not in deployment.status_detail
    client.force_login(viewer)
    page = client.get(reverse("hosts:operation", args=[operation.pk])).content.decode()
    assert SECRET not in page
