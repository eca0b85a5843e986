"""Notifications (email through Django's mail backend, a Slack-compatible webhook) and the
change page's WebSocket: timeline entries and state changes reach watchers, and only them."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from unittest import mock

import pytest
from channels.routing import URLRouter
from django.contrib.auth.models import AnonymousUser

from changes import notify
from changes.services import review
from controlpanel.models import AuditEntry
from home.routing import websocket_urlpatterns
from tests.factories import make_config, make_deployment, make_host


@pytest.fixture
def deployment(db):
    deployment = make_deployment(make_host())
    deployment.active_config = make_config(deployment, {"max_num_seqs": 64})
    deployment.save()
    return deployment


def propose(actor, deployment, **kw):
    return review.propose_change(
        actor,
        deployment,
        title="More sequences",
        rationale="queue wait",
        settings={"max_num_seqs": 128},
        **kw,
    )


@pytest.fixture
def webhook():
    """A local HTTP server standing in for Slack: records each POSTed JSON body."""
    received = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.headers["Content-Type"], json.loads(body)))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/services/T000/B000/xyz", received
    server.shutdown()


@pytest.fixture
def worker_sends():
    """What the worker does with notify_change: send at once (no broker in unit tests)."""
    with mock.patch(
        "changes.tasks.notify_change.apply_async",
        side_effect=lambda args, **options: notify.send(*args),
    ) as sent:
        yield sent


@pytest.mark.django_db
def test_proposal_decision_and_result_are_notified(
    worker_sends,
    operator,
    approver,
    admin,
    deployment,
    mailoutbox,
    settings,
    webhook,
    django_capture_on_commit_callbacks,
):
    url, received = webhook
    settings.CHANGE_WEBHOOK_URL = url
    settings.CHANGE_NOTIFY_EMAILS = ["llm-ops@example.com"]
    settings.PANEL_URL = "https://panel.example.com"
    for user, address in (
        (operator, "otto@example.com"),
        (approver, "anna@example.com"),
        (admin, "adam@example.com"),
    ):
        user.email = address
        user.save()

    with django_capture_on_commit_callbacks(execute=True):
        change = propose(operator, deployment)
    (proposed,) = mailoutbox
    assert proposed.subject == f"[LLM panel] Change #{change.pk} needs review: More sequences"
    # Reviewers (never the proposer) and the team's list.
    assert sorted(proposed.to) == ["adam@example.com", "anna@example.com", "llm-ops@example.com"]
    assert "max_num_seqs: 64 → 128" in proposed.body
    assert f"https://panel.example.com/changes/{change.pk}/" in proposed.body
    content_type, body = received[0]
    assert content_type == "application/json" and set(body) == {"text"}
    assert body["text"].startswith(f"[LLM panel] Change #{change.pk} needs review")

    with django_capture_on_commit_callbacks(execute=True):
        review.reject_change(approver, change, "measure ITL first")
    decided = mailoutbox[-1]
    assert decided.subject.endswith("was rejected: More sequences")
    assert sorted(decided.to) == ["llm-ops@example.com", "otto@example.com"]
    assert "anna-approver rejected: measure ITL first" in decided.body
    assert len(received) == 2
    assert [c.args for c in worker_sends.call_args_list] == [
        ((change.pk, "pending"),),
        ((change.pk, "rejected"),),
    ]
    # What was sent is on the change's timeline.
    notes = AuditEntry.objects.filter(object_id=str(change.pk), action="change.notify")
    assert [n.after["event"] for n in notes.order_by("pk")] == ["pending", "rejected"]
    assert notes.first().after["webhook"] == "HTTP 200"


@pytest.mark.django_db
def test_a_failing_webhook_is_recorded_not_raised(operator, deployment, settings):
    settings.CHANGE_WEBHOOK_URL = "http://127.0.0.1:9/nothing-listens-here"
    change = propose(operator, deployment)
    result = notify.send(change.pk, "pending")
    assert result["webhook"].startswith("failed: ConnectError")
    entry = AuditEntry.objects.filter(action="change.notify").get()
    assert "127.0.0.1:9" not in json.dumps(entry.after), "the webhook URL is a secret"


@pytest.mark.django_db
def test_mail_failures_are_recorded(operator, deployment, settings):
    settings.CHANGE_NOTIFY_EMAILS = ["ops@example.com"]
    change = propose(operator, deployment)
    with mock.patch("changes.notify.send_mail", side_effect=OSError("connection refused")):
        result = notify.send(change.pk, "approved")
    assert result["email"] == "failed: OSError: connection refused"


@pytest.mark.django_db(transaction=True)
def test_the_change_socket_streams_its_timeline_to_viewers_only(
    operator, approver, viewer, nobody, deployment
):
    change = propose(operator, deployment)
    other = propose(operator, deployment)
    app = URLRouter(websocket_urlpatterns)
    from channels.testing import WebsocketCommunicator

    async def connect(user, pk):
        communicator = WebsocketCommunicator(app, f"/ws/changes/{pk}/")
        communicator.scope["user"] = user
        connected, code = await communicator.connect()
        return communicator, connected, code

    async def scenario():
        for user in (AnonymousUser(), nobody):
            communicator, connected, code = await connect(user, change.pk)
            assert not connected and code == 4403
            await communicator.disconnect()
        watchers = [await connect(viewer, change.pk) for _ in range(2)]
        elsewhere, _, _ = await connect(viewer, other.pk)
        assert all(connected for _, connected, _ in watchers)
        # A decision made by a worker thread (as a request would) reaches both watchers.
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: review.approve_change(approver, change, "ok")
        )
        for communicator, _, _ in watchers:
            events = [await communicator.receive_json_from(timeout=5) for _ in range(3)]
            kinds = [(e["event"], e["data"].get("action")) for e in events]
            assert kinds == [
                ("change.event", "approve"),
                ("change.event", "transition"),
                ("change.state", None),
            ]
            assert events[0]["data"]["who"] == approver.username
            assert events[2]["data"]["state"] == "approved"
            await communicator.disconnect()
        assert await elsewhere.receive_nothing(timeout=0.3)
        await elsewhere.disconnect()

    asyncio.run(scenario())
