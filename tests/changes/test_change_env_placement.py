"""Environment variables and CPU placement are proposed like flags (issue 21): the form's
Environment field (running variables filled in, secrets never sent back and kept unless
retyped, names refused with the env policy's words) and its NUMA node / CPUs fields (checked
by the launch rules and against the host's nodes and CPUs); a change of only one of them is a
change; the preview and the change page show them in the diff with secrets masked and say the
prediction does not model them; the API takes ``env`` and ``placement`` and masks secrets in
what it answers; and an applied change launches with them, a rollback restores the previous
ones."""

from __future__ import annotations

from unittest import mock

import pytest
from django.urls import reverse

from api import tokens
from changes.forms import FLAG_PREFIX, ProposeForm
from changes.forms_launch import KEPT, cpu_list, cpu_set
from changes.models import ChangeRequest
from changes.services import apply as change_apply
from changes.services import pipeline, review
from hosts.engines.launch import render_process
from hosts.engines.redaction import MASK
from hosts.models import EngineConfig
from hosts.transport.base import ApplyOutcome
from tests.api.conftest import bearer
from tests.factories import make_config, make_deployment, make_host

pytestmark = pytest.mark.django_db

RUNNING = {"max_num_seqs": 64, "gpu_memory_utilization": 0.9}
SECRET = "hf_stored_secret_value_123"
NEW_SECRET = "hf_new_typed_secret_456"
RUNNING_ENV = {"CUDA_VISIBLE_DEVICES": "0", "HF_TOKEN": SECRET}
RUNNING_PLACEMENT = {"numa_node": 0, "cpus": "0-15"}
LIST = "/api/v1/changes/"


@pytest.fixture
def deployment(db):
    host = make_host(
        name="numa-host",
        cpu_count=32,
        numa_nodes=[{"node": 0, "cpus": "0-15"}, {"node": 1, "cpus": "16-31"}],
    )
    deployment = make_deployment(host, name="chat")
    deployment.active_config = make_config(
        deployment, dict(RUNNING), env=dict(RUNNING_ENV), placement=dict(RUNNING_PLACEMENT)
    )
    deployment.save()
    return deployment


def form_data(deployment, env: str | None = None, numa_node="0", cpus="0-15", **flags) -> dict:
    """What the page posts: the running flags, the environment as shown (a secret as the keep
    mark) unless ``env`` is given, and the placement fields."""
    data = {
        "title": "Pin to node 1",
        "rationale": "The GPUs hang off node 1.",
        "max_error_rate_increase": "1",
        "max_ttft_p95_regression": "20",
        "max_itl_p95_regression": "20",
        "action": "submit",
        "env": f"CUDA_VISIBLE_DEVICES=0\nHF_TOKEN={KEPT}" if env is None else env,
        "numa_node": numa_node,
        "cpus": cpus,
    }
    values = {**RUNNING, **flags}
    data.update({FLAG_PREFIX + k: "" if v is None else str(v) for k, v in values.items()})
    return data


def new_url(deployment) -> str:
    return f"{reverse('changes:new')}?deployment={deployment.pk}"


def preview_url(deployment) -> str:
    return f"{reverse('changes:preview')}?deployment={deployment.pk}"


# --- the form ----------------------------------------------------------------------------
def test_the_page_shows_the_running_env_and_placement_but_never_a_secret(
    client, operator, deployment
):
    client.force_login(operator)
    html = client.get(new_url(deployment)).content.decode()
    assert SECRET not in html
    assert f"CUDA_VISIBLE_DEVICES=0\nHF_TOKEN={KEPT}</textarea>" in html
    # The host's nodes to choose from, the running one selected; the running CPU list.
    assert '<option value="0" selected>node 0 (CPUs 0-15)</option>' in html
    assert '<option value="1">node 1 (CPUs 16-31)</option>' in html
    assert '<option value="">none</option>' in html
    assert 'name="cpus" value="0-15"' in html


def test_an_edited_env_is_proposed_and_the_secret_kept(client, operator, deployment):
    client.force_login(operator)
    env = f"CUDA_VISIBLE_DEVICES=0,1\nHF_TOKEN={KEPT}\nNCCL_DEBUG=INFO"
    response = client.post(new_url(deployment), form_data(deployment, env=env))
    change = ChangeRequest.objects.get()
    assert response.status_code == 302, response.context["form"].errors
    assert change.state == "pending"
    assert change.env == {"CUDA_VISIBLE_DEVICES": "0,1", "HF_TOKEN": SECRET, "NCCL_DEBUG": "INFO"}
    assert change.settings == RUNNING and change.placement == RUNNING_PLACEMENT
    # Only the environment changed, and that is a change to review.
    assert change.diff() == {
        "env.CUDA_VISIBLE_DEVICES": ("0", "0,1"),
        "env.NCCL_DEBUG": (None, "INFO"),
    }


def test_a_typed_secret_replaces_the_stored_one_and_is_not_shown(client, operator, deployment):
    client.force_login(operator)
    env = f"CUDA_VISIBLE_DEVICES=0\nHF_TOKEN={NEW_SECRET}"
    client.post(new_url(deployment), form_data(deployment, env=env))
    change = ChangeRequest.objects.get()
    assert change.env["HF_TOKEN"] == NEW_SECRET
    assert change.diff() == {"env.HF_TOKEN": (SECRET, NEW_SECRET)}
    html = client.get(change.get_absolute_url()).content.decode()
    assert 'data-flag="env.HF_TOKEN"' in html
    assert SECRET not in html and NEW_SECRET not in html and MASK in html
    assert "The prediction does not model environment variables:" in html


def test_a_typed_secret_is_not_sent_back_when_the_form_is_shown_again(client, operator, deployment):
    client.force_login(operator)
    data = form_data(deployment, env=f"HF_TOKEN={NEW_SECRET}\nLD_PRELOAD=/tmp/evil.so")
    response = client.post(new_url(deployment), data)
    assert response.status_code == 200 and not ChangeRequest.objects.exists()
    html = response.content.decode()
    assert NEW_SECRET not in html
    assert "HF_TOKEN=\nLD_PRELOAD=/tmp/evil.so</textarea>" in html
    # The stored one sent back as typed (a script that knows it) is shown as kept, not as is.
    data = form_data(deployment, env=f"HF_TOKEN={SECRET}\nLD_PRELOAD=x")
    html = client.post(new_url(deployment), data).content.decode()
    assert SECRET not in html and f"HF_TOKEN={KEPT}" in html
    # Sent back empty, it asks for the value rather than clearing the secret silently.
    response = client.post(new_url(deployment), form_data(deployment, env="HF_TOKEN="))
    assert "HF_TOKEN: a secret is not shown again" in response.content.decode()
    assert not ChangeRequest.objects.exists()


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("LD_PRELOAD=/tmp/evil.so", "LD_PRELOAD is not allowed: the dynamic linker reads it"),
        ("HF_HOME=/tmp/x", "HF_HOME is not allowed: it names the directory models"),
        ("PYTHONPATH=/tmp", "PYTHONPATH is not allowed: it changes which Python code"),
        ("VLLM_PLUGINS=evil", "VLLM_PLUGINS is not allowed: it chooses plugin packages"),
        ("MY_VAR=1", "MY_VAR is not on the list of variables known to be safe"),
        ("NCCL_DEBUG=LOUD", "invalid value 'LOUD' for NCCL_DEBUG"),
        ("lower=1", "invalid variable name 'lower'"),
        ("VLLM_API_KEY=" + KEPT, "stands for a stored secret, and there is none"),
        ("just words", "line 1: expected NAME=value"),
        ("NCCL_DEBUG=INFO\nNCCL_DEBUG=WARN", "NCCL_DEBUG: set twice"),
    ],
)
def test_a_refused_variable_is_said_with_the_policy_words(
    client, operator, deployment, line, words
):
    client.force_login(operator)
    response = client.post(new_url(deployment), form_data(deployment, env=line))
    assert response.status_code == 200 and not ChangeRequest.objects.exists()
    errors = " ".join(response.context["form"].errors["env"])
    assert words in errors, errors
    assert words in response.content.decode().replace("&#x27;", "'")


@pytest.mark.parametrize(
    ("numa_node", "cpus", "field", "words"),
    [
        ("0", "7-3", "cpus", "CPU range '7-3' runs backwards"),
        ("0", "0-15;rm", "cpus", "expected a CPU list like 0-15,32-47"),
        ("0", "a,b", "cpus", "expected a CPU list like 0-15,32-47"),
        # Refused by its ends, before anything is expanded (it once took 16 GB of memory).
        ("0", "0-999999", "cpus", "CPU 999999 in '0-999999' is beyond the largest CPU number"),
        ("0", "0-9999999999", "cpus", "expected a CPU list like 0-15,32-47"),
        ("3", "", "numa_node", "numa-host has no NUMA node 3: it has nodes 0, 1"),
        ("1", "16-31,40-47", "cpus", "numa-host has no CPU 40-47: it has CPUs 0-31"),
        ("-1", "", "numa_node", "expected a NUMA node number >= 0"),
    ],
)
def test_a_bad_placement_is_refused_naming_the_field(
    client, operator, deployment, numa_node, cpus, field, words
):
    client.force_login(operator)
    data = form_data(deployment, numa_node=numa_node, cpus=cpus)
    response = client.post(new_url(deployment), data)
    assert response.status_code == 200 and not ChangeRequest.objects.exists()
    errors = response.context["form"].errors
    assert words in " ".join(errors.get(field, [])), errors


def test_a_new_node_is_refused_while_the_host_has_not_reported_its_nodes(operator, deployment):
    deployment.host.numa_nodes = []
    deployment.host.cpu_count = None
    deployment.host.save()
    form = ProposeForm(deployment, form_data(deployment, numa_node="1", cpus="16-31"))
    assert not form.is_valid()
    assert "has not reported its NUMA nodes yet" in form.errors["numa_node"][0]
    # The running node stays proposable; CPUs that cannot be checked pass to the launch rules.
    form = ProposeForm(deployment, form_data(deployment, numa_node="0", cpus="64-71"))
    assert form.is_valid(), form.errors


def test_only_a_placement_change_is_a_change(client, operator, deployment):
    client.force_login(operator)
    response = client.post(new_url(deployment), form_data(deployment, numa_node="1", cpus="16-31"))
    assert response.status_code == 302, response.context["form"].errors
    change = ChangeRequest.objects.get()
    assert change.placement == {"numa_node": 1, "cpus": "16-31"}
    assert change.env == RUNNING_ENV and change.settings == RUNNING
    assert change.diff() == {
        "placement.cpus": ("0-15", "16-31"),
        "placement.numa_node": (0, 1),
    }


def test_no_placement_at_all_is_a_change_too(client, operator, deployment):
    client.force_login(operator)
    response = client.post(new_url(deployment), form_data(deployment, numa_node="", cpus=""))
    assert response.status_code == 302, response.context["form"].errors
    change = ChangeRequest.objects.get()
    assert change.placement == {}
    assert change.diff() == {
        "placement.cpus": ("0-15", None),
        "placement.numa_node": (0, None),
    }


def test_the_same_env_and_placement_is_still_nothing_to_review(client, operator, deployment):
    client.force_login(operator)
    response = client.post(new_url(deployment), form_data(deployment))
    assert response.status_code == 200 and not ChangeRequest.objects.exists()
    assert "Nothing differs from the running config" in response.content.decode()


# --- the preview ---------------------------------------------------------------------------
def test_the_preview_shows_env_and_placement_masked_and_says_it_cannot_predict_them(
    client, operator, deployment
):
    client.force_login(operator)
    env = f"CUDA_VISIBLE_DEVICES=0\nHF_TOKEN={NEW_SECRET}\nNCCL_DEBUG=INFO"
    response = client.post(preview_url(deployment), form_data(deployment, env=env, numa_node="1"))
    assert response.status_code == 200
    html = response.content.decode()
    assert response.context["facts"]["diff"] == {
        "env.HF_TOKEN": (MASK, MASK),
        "env.NCCL_DEBUG": (None, "INFO"),
        "placement.numa_node": (0, 1),
    }
    for key in ("env.HF_TOKEN", "env.NCCL_DEBUG", "placement.numa_node"):
        assert f'data-flag="{key}"' in html
    assert NEW_SECRET not in html and SECRET not in html
    assert 'data-testid="diff-unmodelled"' in html
    assert "The prediction does not model environment variables or CPU placement" in html


def test_a_flag_only_preview_makes_no_such_claim(client, operator, deployment):
    client.force_login(operator)
    response = client.post(preview_url(deployment), form_data(deployment, max_num_seqs=128))
    assert response.context["facts"]["diff"] == {"max_num_seqs": (64, 128)}
    assert 'data-testid="diff-unmodelled"' not in response.content.decode()


def test_the_preview_says_what_the_env_policy_refuses(client, operator, deployment):
    client.force_login(operator)
    data = form_data(deployment, env="LD_PRELOAD=/tmp/evil.so", cpus="9-2")
    html = client.post(preview_url(deployment), data).content.decode()
    assert 'data-testid="preview-errors"' in html
    assert "LD_PRELOAD is not allowed" in html and "runs backwards" in html


# --- the API -----------------------------------------------------------------------------
def api_for(user):
    _, raw = tokens.issue(user, "ci", None, actor=user)
    return bearer(raw)


def api_body(deployment, **kw) -> dict:
    data = {
        "deployment": deployment.pk,
        "title": "Env and placement",
        "rationale": "The GPUs hang off node 1.",
        "settings": {},
    }
    data.update(kw)
    return data


def test_the_api_proposes_env_and_placement_and_masks_secrets(operator, deployment):
    api = api_for(operator)
    body = api_body(
        deployment,
        env={"NCCL_DEBUG": "INFO", "HF_TOKEN": MASK, "CUDA_VISIBLE_DEVICES": None},
        placement={"numa_node": 1, "cpus": "16-31"},
    )
    answer = api.post(LIST, body, format="json")
    assert answer.status_code == 201, answer.json()
    change = ChangeRequest.objects.get()
    # A variable left out or given as the mask is kept, null removes one.
    assert change.env == {"HF_TOKEN": SECRET, "NCCL_DEBUG": "INFO"}
    assert change.placement == {"numa_node": 1, "cpus": "16-31"}
    data = answer.json()
    assert data["env"] == {"HF_TOKEN": MASK, "NCCL_DEBUG": "INFO"}
    assert data["placement"] == {"numa_node": 1, "cpus": "16-31"}
    assert {row["flag"] for row in data["diff"]} == {
        "env.CUDA_VISIBLE_DEVICES",
        "env.NCCL_DEBUG",
        "placement.cpus",
        "placement.numa_node",
    }
    assert SECRET not in answer.content.decode()
    # A new secret, sent once, is stored and never read back.
    answer = api.post(LIST, api_body(deployment, env={"HF_TOKEN": NEW_SECRET}), format="json")
    assert answer.status_code == 201, answer.json()
    assert ChangeRequest.objects.get(pk=answer.json()["id"]).env["HF_TOKEN"] == NEW_SECRET
    text = api.get(f"{LIST}{answer.json()['id']}/").content.decode()
    assert NEW_SECRET not in text and SECRET not in text
    assert answer.json()["diff"] == [{"flag": "env.HF_TOKEN", "running": MASK, "proposed": MASK}]


def test_a_placement_key_left_out_keeps_its_running_value(operator, deployment):
    api = api_for(operator)
    answer = api.post(LIST, api_body(deployment, placement={"cpus": "0-7"}), format="json")
    assert answer.status_code == 201, answer.json()
    assert ChangeRequest.objects.get().placement == {"numa_node": 0, "cpus": "0-7"}
    answer = api.post(LIST, api_body(deployment, placement=None), format="json")
    assert answer.status_code == 201, answer.json()
    assert answer.json()["placement"] == {"numa_node": None, "cpus": None}
    assert ChangeRequest.objects.get(pk=answer.json()["id"]).placement == {}


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "env.LD_PRELOAD", "the dynamic linker reads it"),
        ({"env": {"MY_VAR": "1"}}, "env.MY_VAR", "not on the list of variables"),
        ({"env": {"VLLM_API_KEY": MASK}}, "env.VLLM_API_KEY", "there is none"),
        ({"env": {"NCCL_DEBUG": "INFO\nLD_PRELOAD=x"}}, "env.NCCL_DEBUG", "one line"),
        ({"env": {"A\nB": "1"}}, "env.A\nB", "invalid variable name"),
        ({"placement": {"numa_node": 5}}, "placement.numa_node", "no NUMA node 5: it has nodes"),
        ({"placement": {"cpus": "3-1"}}, "placement.cpus", "runs backwards"),
        ({"placement": {"cpus": "0-999999"}}, "placement.cpus", "beyond the largest CPU"),
        ({"placement": {"cpus": "0-99"}}, "placement.cpus", "has no CPU 32-99"),
        ({"placement": {"node": 1}}, "placement", "Unknown field"),
        ({"env": ["NCCL_DEBUG"]}, "env", "dictionary"),
    ],
)
def test_bad_env_or_placement_is_a_400_by_field(operator, deployment, extra, key, words):
    answer = api_for(operator).post(LIST, api_body(deployment, **extra), format="json")
    assert answer.status_code == 400, answer.json()
    problem = answer.json()
    assert answer["Content-Type"] == "application/problem+json"
    errors = problem["errors"]
    found = [m for k, v in errors.items() if k == key or k.startswith(key + ".") for m in v]
    assert any(words in m for m in found), errors
    assert not ChangeRequest.objects.exists()


# --- config version, launch and rollback ----------------------------------------------------
class RecordingHost:
    """A host's transport that records every launch config it is asked to run; applies
    take the scripted outcomes in turn (``ready`` when the script runs out)."""

    def __init__(self):
        self.launches = []
        self.script: list[ApplyOutcome] = []

    def apply_config(self, name, launch, *, previous, ready_timeout_s):
        self.launches.append(launch)
        return self.script.pop(0) if self.script else ApplyOutcome("ready")

    def restart_engine(self, name, *, ready_timeout_s):
        return ApplyOutcome("ready")

    def engine_status(self, name):
        return {"name": name, "state": "ready"}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def host(monkeypatch, settings):
    settings.CHANGE_HEARTBEAT_SECONDS = 3600
    fake = RecordingHost()
    monkeypatch.setattr("hosts.services.operations.transport_for", lambda h, d=None: fake)
    monkeypatch.setattr("hosts.services.transports.transport_for", lambda h, d=None: fake)
    monkeypatch.setattr("changes.services.verification.health_problem", lambda d, c=None: None)
    return fake


def apply_env_and_placement(operator, approver, deployment) -> ChangeRequest:
    form = ProposeForm(
        deployment,
        form_data(
            deployment,
            env=f"CUDA_VISIBLE_DEVICES=0\nHF_TOKEN={KEPT}\nNCCL_DEBUG=INFO",
            numa_node="1",
            cpus="16-31",
        ),
    )
    assert form.is_valid(), form.errors
    change = review.propose_change(operator, deployment, **form.proposal())
    review.approve_change(approver, change)
    with mock.patch("changes.tasks.apply_change.apply_async"):
        change_apply.apply_change(operator, ChangeRequest.objects.get(pk=change.pk))
    return pipeline.run_pipeline(change.pk, "worker-1")


def test_the_applied_version_launches_with_the_env_and_placement(
    operator, approver, deployment, host
):
    old = deployment.active_config
    change = apply_env_and_placement(operator, approver, deployment)
    assert change.state == "applied", change.outcome
    new = change.applied_config
    assert new.version == old.version + 1
    assert new.env == {"CUDA_VISIBLE_DEVICES": "0", "HF_TOKEN": SECRET, "NCCL_DEBUG": "INFO"}
    assert new.placement == {"numa_node": 1, "cpus": "16-31"}
    deployment.refresh_from_db()
    assert deployment.active_config == new
    # What the host was asked to run: pinned to node 1's CPUs and memory, with the variables.
    (launch,) = host.launches
    process = render_process(launch)
    assert process.argv[:4] == ("numactl", "--physcpubind=16-31", "--membind=1", "--")
    assert process.env == new.env
    # A rollback to the earlier version (a change like any other) puts both back.
    rollback = review.propose_rollback(operator, old, rationale="node 1 was slower")
    assert rollback.env == RUNNING_ENV and rollback.placement == RUNNING_PLACEMENT
    assert rollback.diff() == {
        "env.NCCL_DEBUG": ("INFO", None),
        "placement.cpus": ("16-31", "0-15"),
        "placement.numa_node": (1, 0),
    }


def test_a_failed_start_rolls_back_to_the_previous_env_and_placement(
    operator, approver, deployment, host
):
    old = deployment.active_config
    host.script = [ApplyOutcome("failed", error="numactl: node 1 busy")]
    change = apply_env_and_placement(operator, approver, deployment)
    assert change.state == "rolled_back", change.outcome
    new, back = host.launches
    assert render_process(new).argv[:3] == ("numactl", "--physcpubind=16-31", "--membind=1")
    assert dict(back.env) == RUNNING_ENV
    assert render_process(back).argv[:4] == ("numactl", "--physcpubind=0-15", "--membind=0", "--")
    deployment.refresh_from_db()
    assert deployment.active_config == change.snapshot_config
    assert change.snapshot_config.env == RUNNING_ENV
    assert change.snapshot_config.placement == RUNNING_PLACEMENT
    tried = EngineConfig.objects.get(deployment=deployment, version=old.version + 1)
    assert tried.placement == {"numa_node": 1, "cpus": "16-31"}


# --- CPU lists ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8", {0, 1, 2, 3, 8}), ("5", {5}), ("", set()), ("x", set()), ("2-2,4-5", {2, 4, 5})],
)
def test_cpu_lists_read_and_write(text, cpus):
    assert cpu_set(text) == cpus
    assert cpu_set(cpu_list(cpus)) == cpus
    assert cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
