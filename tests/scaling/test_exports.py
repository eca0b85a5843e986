"""The scaling downloads (KEDA ScaledObject, Prometheus rules, Grafana dashboard): each is
parsed back from its text and checked against its format (KEDA's own CRD schema, Prometheus's
rule-file fields and PromQL grammar, Grafana's dashboard fields) and against the target's
thresholds."""

import json
import re
from pathlib import Path

import jsonschema
import promql_parser
import pytest
import yaml

from scaling.planning import exports, series
from scaling.planning.__main__ import main
from scaling.planning.types import SLO, ExportTarget, PolicyConfig, Thresholds

SCHEMA = Path(__file__).parent / "fixtures" / "keda_scaledobject_schema.json"
# Prometheus's duration syntax (common/model ParseDuration).
DURATION = re.compile(
    r"^(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?$"
)
MODEL = 'org/model "q" \\ 8B'  # a quote and a backslash: both must be escaped in PromQL
# The Prometheus scaler's metadata keys (kedacore/keda pkg/scalers/prometheus_scaler.go at
# the schema's commit): a key outside them would configure nothing.
PROMETHEUS_SCALER_KEYS = {
    "serverAddress", "query", "queryParameters", "threshold", "activationThreshold",
    "namespace", "customHeaders", "ignoreNullValues", "unsafeSsl", "awsRegion", "timeout",
    "identityOwner",
}  # fmt: skip
EVIDENCE = "run #42 'chat 4k' stage 3.0 rps, 2026-11-30"


def make_target(model: str = MODEL, **thresholds) -> ExportTarget:
    values = dict(
        requests_waiting=6.5,
        activation_requests_waiting=1.0,
        pending_prompt_tokens=13000.0,
        requests_per_s=3.25,
        evidence=EVIDENCE,
    )
    values.update(thresholds)
    return ExportTarget(
        deployment="Llama 8B (blue)",
        deployment_id=7,
        host="gpu-a",
        model=model,
        engine="vllm",
        namespace="serving",
        prometheus_url="http://prom.example:9090",
        policy=PolicyConfig(
            min_replicas=1,
            max_replicas=5,
            stabilisation_s=420,
            cooldown_s=240,
            polling_interval_s=10,
            engine_start_s=88.0,
        ),
        thresholds=Thresholds(**values),
        slo=SLO(ttft_p95_ms=800.0, itl_p95_ms=60.0),
    )


def strip_k8s_extensions(node):
    """The CRD schema as JSON Schema: Kubernetes' ``x-kubernetes-*`` keys dropped."""
    if isinstance(node, dict):
        return {
            k: strip_k8s_extensions(v) for k, v in node.items() if not k.startswith("x-kubernetes-")
        }
    if isinstance(node, list):
        return [strip_k8s_extensions(v) for v in node]
    return node


@pytest.fixture(scope="module")
def keda_validator():
    schema = strip_k8s_extensions(json.loads(SCHEMA.read_text()))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def selectors(expr: str) -> list:
    """Every vector selector in a PromQL expression, as parsed by a real PromQL parser."""
    found = []

    def walk(node):
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)
            return
        for attr in ("lhs", "rhs", "expr", "param", "vector_selector", "args"):
            child = getattr(node, attr, None)
            for item in child if isinstance(child, list | tuple) else [child]:
                if item is not None and type(item).__module__.startswith("promql_parser"):
                    walk(item)

    walk(promql_parser.parse(expr))
    return found


def matchers(selector) -> dict:
    return {m.name: m.value for m in selector.matchers.matchers}


def keda_doc(target: ExportTarget) -> dict:
    return yaml.safe_load(exports.render(target, "keda.yaml").text)


def triggers_by_name(doc: dict) -> dict:
    return {t["name"]: t for t in doc["spec"]["triggers"]}


# --- KEDA -----------------------------------------------------------------------------------


def test_scaled_object_is_valid_against_kedas_crd_schema(keda_validator):
    doc = keda_doc(make_target())
    keda_validator.validate(doc)
    assert doc["apiVersion"] == "keda.sh/v1alpha1" and doc["kind"] == "ScaledObject"
    spec = doc["spec"]
    # The CRD's CEL rule (x-kubernetes-validations), which jsonschema cannot run.
    assert spec["minReplicaCount"] <= spec["maxReplicaCount"]
    for trigger in spec["triggers"]:
        assert trigger["type"] == "prometheus"
        assert trigger["metricType"] in ("Value", "AverageValue")
        assert all(isinstance(v, str) for v in trigger["metadata"].values())
        assert set(trigger["metadata"]) <= PROMETHEUS_SCALER_KEYS
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
    for key, value in doc["metadata"]["labels"].items():
        assert re.fullmatch(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]", value), key


def test_the_schema_check_bites(keda_validator):
    doc = keda_doc(make_target())
    doc["spec"]["triggers"][0]["metadata"]["threshold"] = 6.5  # KEDA wants strings
    with pytest.raises(jsonschema.ValidationError):
        keda_validator.validate(doc)


def test_scaled_object_carries_the_policy():
    target = make_target()
    spec = keda_doc(target)["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "llama-8b-blue",
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 5)
    assert (spec["pollingInterval"], spec["cooldownPeriod"]) == (10, 240)
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 420


def test_scale_target_is_named_as_given():
    target = ExportTarget(
        deployment="d", model="m", scale_target="vllm.llama-8b", scale_target_kind="StatefulSet"
    )
    doc = exports.keda_scaled_object(target)
    assert doc["spec"]["scaleTargetRef"]["name"] == "vllm.llama-8b"
    assert doc["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
    assert doc["metadata"]["name"] == "vllm-llama-8b"


def test_triggers_take_the_targets_thresholds_on_the_panels_series():
    doc = keda_doc(make_target())
    by_name = triggers_by_name(doc)
    assert set(by_name) == {
        "queue-depth",
        "pending-prompt-tokens",
        "ttft-p95-guardrail",
        "arrival-rate",
    }
    expected = {
        "queue-depth": ("requests_waiting", 6.5, "AverageValue"),
        "pending-prompt-tokens": ("pending_prompt_tokens", 13000.0, "AverageValue"),
        "ttft-p95-guardrail": ("ttft_p95_seconds", 0.8, "Value"),
        "arrival-rate": ("arrival_requests_per_second", 3.25, "AverageValue"),
    }
    for name, (key, threshold, metric_type) in expected.items():
        trig = by_name[name]
        meta = trig["metadata"]
        assert float(meta["threshold"]) == pytest.approx(threshold)
        assert trig["metricType"] == metric_type
        assert meta["serverAddress"] == "http://prom.example:9090"
        [sel] = selectors(meta["query"])
        assert sel.name == series.name(key)
        assert matchers(sel)["model"] == MODEL
    assert float(by_name["queue-depth"]["metadata"]["activationThreshold"]) == 1.0
    # The token trigger wakes at the same queue: 1 request x 13000/6.5 tokens per request.
    tokens = by_name["pending-prompt-tokens"]["metadata"]
    assert float(tokens["activationThreshold"]) == pytest.approx(2000.0)
    guard = selectors(by_name["ttft-p95-guardrail"]["metadata"]["query"])[0]
    assert matchers(guard)["window"] == "1m"


def test_unknown_thresholds_drop_their_triggers_and_say_why():
    target = make_target(
        requests_waiting=None,
        activation_requests_waiting=None,
        pending_prompt_tokens=None,
        requests_per_s=0.0,
        evidence="",
    )
    doc = keda_doc(target)
    # The latency guardrail stays: the SLO is always known.
    assert list(triggers_by_name(doc)) == ["ttft-p95-guardrail"]
    omitted = doc["metadata"]["annotations"]["llmpanel/omitted-triggers"]
    for name in ("queue-depth", "pending-prompt-tokens", "arrival-rate"):
        assert name in omitted


def test_a_quote_in_the_model_name_is_escaped():
    query = triggers_by_name(keda_doc(make_target()))["queue-depth"]["metadata"]["query"]
    assert 'model="org/model \\"q\\" \\\\ 8B"' in query
    assert exports.promql_string('a"b\\c') == '"a\\"b\\\\c"'
    # Parsed by PromQL, the matcher holds the exact name back.
    assert matchers(selectors(query)[0]) == {"model": MODEL}


def test_evidence_and_slo_are_in_the_annotations_and_the_header():
    target = make_target()
    text = exports.render(target, "keda").text
    annotations = yaml.safe_load(text)["metadata"]["annotations"]
    assert annotations["llmpanel/evidence"] == EVIDENCE
    assert "800 ms" in annotations["llmpanel/slo"]
    assert annotations["llmpanel/model"] == MODEL
    head = text.split("apiVersion:")[0]
    assert EVIDENCE in head and "Llama 8B (blue)" in head and "LLM control panel" in head
    assert all(line.startswith("#") for line in head.strip().splitlines())


def test_bad_policies_and_targets_are_refused():
    with pytest.raises(ValueError):
        exports.keda_scaled_object(make_target().__class__(deployment="x", model=""))
    bad = ExportTarget(
        deployment="x", model="m", policy=PolicyConfig(min_replicas=4, max_replicas=2)
    )
    with pytest.raises(ValueError, match="replica bounds"):
        exports.keda_scaled_object(bad)


# --- Prometheus rules -----------------------------------------------------------------------


def alert_doc(target: ExportTarget) -> dict:
    return yaml.safe_load(exports.render(target, "alerts.yaml").text)


def test_alert_rules_follow_prometheus_rule_file_format():
    doc = alert_doc(make_target())
    assert set(doc) == {"groups"}
    names = [g["name"] for g in doc["groups"]]
    assert len(names) == len(set(names)) and all(names)
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "limit", "rules"}
        alerts = [r["alert"] for r in group["rules"]]
        assert len(alerts) == len(set(alerts))
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
            assert re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", rule["alert"])
            assert DURATION.match(rule["for"]) and rule["for"] not in ("", "0")
            for field in ("labels", "annotations"):
                assert all(
                    isinstance(k, str) and isinstance(v, str) for k, v in rule[field].items()
                )
            assert rule["labels"]["severity"] in ("warning", "critical")
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]
            for sel in selectors(rule["expr"]):  # every expression parses as PromQL
                assert sel.name in {s.name for s in series.SERIES}
                assert matchers(sel)["model"] == MODEL


def test_alert_rules_cover_slo_burn_queue_kv_provisioning_and_staleness():
    rules = {r["alert"]: r for r in alert_doc(make_target())["groups"][0]["rules"]}
    assert set(rules) == {
        "LLMPanelTTFTSLOBurn",
        "LLMPanelTTFTSLOFastBurn",
        "LLMPanelQueueAboveThreshold",
        "LLMPanelQueueGrowing",
        "LLMPanelKVCacheSaturated",
        "LLMPanelPreemptions",
        "LLMPanelUnderProvisioned",
        "LLMPanelSignalsStale",
    }
    burn = rules["LLMPanelTTFTSLOBurn"]
    assert burn["for"] == "5m" and burn["expr"].endswith("> 0.8")
    assert matchers(selectors(burn["expr"])[0])["window"] == "5m"
    assert matchers(selectors(rules["LLMPanelTTFTSLOFastBurn"]["expr"])[0])["window"] == "1m"
    queue = rules["LLMPanelQueueAboveThreshold"]
    assert queue["expr"].endswith("> 6.5") and queue["for"] == "2m"
    assert EVIDENCE in queue["annotations"]["description"]
    assert "deriv(" in rules["LLMPanelQueueGrowing"]["expr"]
    assert rules["LLMPanelKVCacheSaturated"]["expr"].endswith("> 0.95")
    assert [s.name for s in selectors(rules["LLMPanelUnderProvisioned"]["expr"])] == [
        series.name("desired_replicas"),
        series.name("replicas"),
    ]
    assert "absent(" in rules["LLMPanelSignalsStale"]["expr"]


def test_without_a_queue_threshold_only_the_growth_rule_watches_the_queue():
    target = make_target(requests_waiting=None, activation_requests_waiting=None)
    alerts = {r["alert"] for r in alert_doc(target)["groups"][0]["rules"]}
    assert "LLMPanelQueueAboveThreshold" not in alerts
    assert "LLMPanelQueueGrowing" in alerts


def test_template_braces_in_a_model_name_do_not_reach_prometheus_templates():
    doc = alert_doc(make_target(model="m{{ .x }}"))
    for rule in doc["groups"][0]["rules"]:
        assert "{{ .x }}" not in rule["annotations"]["summary"]
        assert matchers(selectors(rule["expr"])[0])["model"] == "m{{ .x }}"


# --- Grafana --------------------------------------------------------------------------------


def dashboard(target: ExportTarget) -> dict:
    out = exports.render(target, "grafana.json")
    assert out.content_type == "application/json" and out.filename.endswith(".json")
    return json.loads(out.text)


def test_dashboard_has_grafanas_required_fields():
    dash = dashboard(make_target())
    for key in ("title", "uid", "schemaVersion", "time", "refresh", "templating", "panels"):
        assert key in dash
    assert dash["schemaVersion"] == 39
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dash["uid"])
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["model"]["query"] == (
        f"label_values({series.name('requests_waiting')}, model)"
    )
    assert variables["model"]["current"]["value"] == MODEL


def test_dashboard_uid_is_stable_per_deployment():
    assert dashboard(make_target())["uid"] == dashboard(make_target())["uid"]
    other = ExportTarget(deployment="other", deployment_id=8, model="m")
    assert exports.grafana_dashboard(other)["uid"] != dashboard(make_target())["uid"]


def test_dashboard_panels_are_well_formed_and_cover_every_series():
    panels = dashboard(make_target())["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells = set()
    named = set()
    for panel in panels:
        assert panel["type"] in ("timeseries", "stat") and panel["title"]
        pos = panel["gridPos"]
        assert pos["w"] > 0 and pos["h"] > 0 and pos["x"] >= 0 and pos["x"] + pos["w"] <= 24
        xs, ys = range(pos["x"], pos["x"] + pos["w"]), range(pos["y"], pos["y"] + pos["h"])
        area = {(x, y) for x in xs for y in ys}
        assert not cells & area, f"{panel['title']} overlaps another panel"
        cells |= area
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["fieldConfig"]["defaults"]["unit"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert target["legendFormat"]
            for sel in selectors(target["expr"]):
                assert sel.name in {s.name for s in series.SERIES}
                named.add(sel.name)
    assert named == {s.name for s in series.SERIES}
    units = {p["fieldConfig"]["defaults"]["unit"] for p in panels}
    assert {"s", "percentunit", "reqps"} <= units


def test_dashboard_draws_the_slo_and_the_queue_threshold():
    panels = {p["title"]: p for p in dashboard(make_target())["panels"]}

    def lines(title):
        defaults = panels[title]["fieldConfig"]["defaults"]
        assert defaults["custom"]["thresholdsStyle"]["mode"] == "line"
        return [s["value"] for s in defaults["thresholds"]["steps"] if s["value"] is not None]

    assert lines("Time to first token") == [0.8]
    assert lines("Requests waiting and running") == [6.5]
    assert lines("Inter-token latency") == [0.06]


# --- Files and the command line -------------------------------------------------------------


def test_dump_yaml_comments_the_header_and_round_trips():
    doc = {"a": [1, {"b": "x: y"}], "c": "true"}
    text = exports.dump_yaml(doc, header="one\ntwo")
    assert text.startswith("# one\n# two\n")
    assert yaml.safe_load(text) == doc
    assert json.loads(exports.dump_json(doc)) == doc


def test_unknown_export_kind_is_refused():
    with pytest.raises(ValueError):
        exports.render(make_target(), "keda.json")
    with pytest.raises(ValueError):
        exports.render(make_target(), "helm")


def test_command_line_writes_each_kind(tmp_path, capsys):
    path = tmp_path / "target.json"
    path.write_text(json.dumps(make_target().as_dict()))
    assert main(["exports", "--target", str(path), "--kind", "keda"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert float(triggers_by_name(doc)["queue-depth"]["metadata"]["threshold"]) == 6.5
    assert main(["exports", "--target", str(path), "--kind", "grafana"]) == 0
    assert json.loads(capsys.readouterr().out)["schemaVersion"] == 39


@pytest.mark.parametrize(
    "content",
    ["not json", "[1]", '{"deployment": "d"}', '{"deployment": "d", "model": "m", "nope": 1}'],
)
def test_command_line_bad_input_exits_2_with_one_line(tmp_path, capsys, content):
    path = tmp_path / "target.json"
    path.write_text(content)
    assert main(["exports", "--target", str(path), "--kind", "alerts"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1
