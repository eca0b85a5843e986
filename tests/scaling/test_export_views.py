"""The export downloads: attachments named for the deployment, parsed back, thresholds from
the benchmark run, query parameters validated (a clear 400, never a 500)."""

from __future__ import annotations

import json

import pytest
import yaml
from django.urls import reverse

from scaling.planning import series
from tests.scaling.test_pages import running, sample, staged_run

pytestmark = pytest.mark.django_db


def download(client, deployment, file, params=None):
    return client.get(reverse("scaling:export", args=[deployment.pk, file]), params or {})


def test_keda_yaml_is_an_attachment_with_thresholds_from_the_run(client, viewer):
    deployment = running(name="llama-8b")
    run = staged_run(deployment)
    sample(deployment, 1)
    client.force_login(viewer)
    response = download(client, deployment, "keda.yaml")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/yaml")
    disposition = response["Content-Disposition"]
    assert disposition.startswith("attachment;") and "llama-8b" in disposition
    text = response.content.decode()
    assert text.startswith("#") and f"run #{run.pk}" in text  # evidence in the header
    doc = yaml.safe_load(text)
    assert doc["kind"] == "ScaledObject"
    assert doc["metadata"]["namespace"] == "default"
    assert doc["spec"]["scaleTargetRef"]["name"] == "llama-8b"
    queries = [t["metadata"]["query"] for t in doc["spec"]["triggers"]]
    assert any(series.name("requests_waiting") in q for q in queries)
    for trigger in doc["spec"]["triggers"]:
        assert trigger["metadata"]["serverAddress"] == "http://prometheus.monitoring.svc:9090"


def test_parameters_name_the_target_namespace_and_prometheus(client, viewer):
    deployment = running()
    staged_run(deployment)
    client.force_login(viewer)
    response = download(
        client,
        deployment,
        "keda.yaml",
        {
            "name": "vllm-llama.prod",
            "namespace": "inference",
            "kind": "StatefulSet",
            "prometheus": "https://prom.example.org:9090",
        },
    )
    assert response.status_code == 200
    doc = yaml.safe_load(response.content)
    assert doc["metadata"]["namespace"] == "inference"
    assert doc["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
    assert doc["spec"]["scaleTargetRef"]["name"].startswith("vllm-llama")
    assert doc["spec"]["triggers"][0]["metadata"]["serverAddress"] == (
        "https://prom.example.org:9090"
    )


def test_without_evidence_the_file_still_downloads_and_says_what_is_missing(client, viewer):
    deployment = running()
    client.force_login(viewer)
    response = download(client, deployment, "keda.yaml")
    assert response.status_code == 200
    text = response.content.decode()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert "Missing:" in header and "queue-depth trigger" in header
    assert "no measured threshold" in header
    doc = yaml.safe_load(text)
    assert doc["kind"] == "ScaledObject"
    queries = " ".join(t["metadata"]["query"] for t in doc["spec"].get("triggers") or [])
    assert series.name("requests_waiting") not in queries


def test_alert_rules_and_grafana_parse_back(client, viewer):
    deployment = running(name="qwen")
    staged_run(deployment)
    client.force_login(viewer)
    alerts = download(client, deployment, "alerts.yaml")
    assert alerts.status_code == 200 and "qwen" in alerts["Content-Disposition"]
    rules = yaml.safe_load(alerts.content)
    assert rules["groups"] and all(r["alert"] and r["expr"] for r in rules["groups"][0]["rules"])
    grafana = download(client, deployment, "grafana.json")
    assert grafana.status_code == 200
    assert grafana["Content-Type"].startswith("application/json")
    assert grafana["Content-Disposition"].endswith('.json"')
    dashboard = json.loads(grafana.content)
    assert dashboard["title"] and dashboard["panels"]


@pytest.mark.parametrize(
    "params, field",
    [
        ({"name": "Bad_Name"}, "name"),
        ({"name": "-leading"}, "name"),
        ({"namespace": "has.dots"}, "namespace"),
        ({"namespace": "x" * 64}, "namespace"),
        ({"prometheus": "ftp://prom:21"}, "prometheus"),
        ({"prometheus": "not a url"}, "prometheus"),
        ({"kind": "DaemonSet"}, "kind"),
    ],
)
def test_bad_parameters_give_a_clear_400(client, viewer, params, field):
    deployment = running()
    client.force_login(viewer)
    response = download(client, deployment, "keda.yaml", params)
    assert response.status_code == 400
    assert "Content-Disposition" not in response
    html = response.content.decode()
    assert "Cannot write the export" in html and f"{field}:" in html


def test_exports_need_a_role_and_a_known_deployment(client, nobody, viewer):
    deployment = running()
    url = reverse("scaling:export", args=[deployment.pk, "keda.yaml"])
    assert client.get(url).status_code == 302  # to the log-in page
    client.force_login(nobody)
    assert client.get(url).status_code == 403
    client.force_login(viewer)
    assert client.get(reverse("scaling:export", args=[99999, "keda.yaml"])).status_code == 404
