"""Files an ops team downloads to scale and watch one deployment's replica group on the
panel's series: a KEDA ``ScaledObject``, Prometheus alerting rules, a Grafana dashboard (pure).

Every series name comes from ``series`` (one registry); every threshold from the
``ExportTarget`` (derived by the panel from a benchmark run, named in ``thresholds.evidence``).
A trigger or rule whose threshold is unknown is left out, and the file says why, rather than
shipping a guess.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, fields

import yaml

from scaling.planning import series
from scaling.planning.types import SLO, ExportTarget

PANEL = "LLM control panel"
ANNOTATION = "llmpanel"  # prefix of the Kubernetes annotation and label keys we write
# Saturation levels that hold for every engine (not measured per config): a KV pool this full
# preempts or queues new requests, whatever the model.
KV_SATURATED = 0.95
STALE_AFTER_S = 30


# --- PromQL and Kubernetes names ----------------------------------------------------------


def promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal (Go escapes: a model name may hold a
    quote or a backslash, and an unescaped one would break or widen the selector)."""
    escaped = (
        str(value)
        .replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
    )
    return f'"{escaped}"'


def selector(key: str, model: str, window: str | None = None) -> str:
    """The series ``key`` of one model's replica group (optionally one percentile window)."""
    matchers = [f"model={promql_string(model)}"]
    if window is not None:
        matchers.append(f"window={promql_string(window)}")
    return f"{series.name(key)}{{{','.join(matchers)}}}"


def k8s_name(text: str) -> str:
    """A DNS-1123 label (what KEDA also copies into a label value, so at most 63 chars)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return slug[:63].rstrip("-") or "llm-deployment"


def k8s_label_value(text: str) -> str:
    """A label value (model names carry "/" and ":", which labels refuse; the exact name is
    kept in an annotation)."""
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def number(value: float) -> str:
    """A threshold as KEDA wants it: a string (trigger metadata is a string map) that Go's
    ParseFloat reads, without float noise."""
    text = f"{float(value):.6f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def target_from_dict(data: dict) -> ExportTarget:
    """An ``ExportTarget`` from its ``as_dict`` form (nested policy, thresholds and SLO too)."""
    if not isinstance(data, dict):
        raise ValueError("a target is a JSON object of ExportTarget's fields")
    unknown = sorted(set(data) - {f.name for f in fields(ExportTarget)})
    if unknown:  # a typo in a hand-written target file must not pass silently
        raise ValueError(f"unknown target field(s): {', '.join(unknown)}")
    return ExportTarget.from_dict(data)


def _check(target: ExportTarget) -> ExportTarget:
    if isinstance(target, dict):
        target = target_from_dict(target)
    if not target.deployment or not target.model:
        raise ValueError("the target needs a deployment and a model name")
    policy = target.policy
    if policy.min_replicas < 0 or policy.max_replicas < max(policy.min_replicas, 1):
        raise ValueError(
            f"replica bounds make no sense: min {policy.min_replicas}, max {policy.max_replicas}"
        )
    if target.slo.ttft_p95_ms <= 0:
        raise ValueError("the SLO's p95 TTFT must be positive")
    return target


def _known(value: float | None) -> bool:
    # A zero or negative per-replica threshold would divide demand by nothing: not a threshold.
    return value is not None and value > 0


def _plain(text: str) -> str:
    # Names go into Prometheus's Go templates (alert annotations): "{{" there would execute.
    return text.replace("{{", "{ {").replace("}}", "} }")


def slo_seconds(target: ExportTarget) -> float:
    return target.slo.ttft_p95_ms / 1000.0


def slo_text(slo: SLO) -> str:
    parts = [f"p95 TTFT <= {slo.ttft_p95_ms:g} ms"]
    if slo.itl_p95_ms is not None:
        parts.append(f"p95 ITL <= {slo.itl_p95_ms:g} ms")
    parts.append(f"errors <= {slo.max_error_rate:.1%}")
    return ", ".join(parts)


def evidence_text(target: ExportTarget) -> str:
    return target.thresholds.evidence or "no benchmark evidence: thresholds unknown"


def header(target: ExportTarget, what: str) -> str:
    """The comment block on top of a downloaded file: who made it, for what, from what."""
    target = _check(target)
    lines = [
        f"{what} written by the {PANEL}.",
        f"Deployment: {target.deployment} (id {target.deployment_id}), model {target.model}, "
        f"host {target.host or '-'}, engine {target.engine or '-'}.",
        f"SLO: {slo_text(target.slo)}.",
        f"Thresholds from: {evidence_text(target)}.",
    ]
    return "\n".join(lines)


# --- KEDA -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Trigger:
    name: str
    query: str
    threshold: float | None
    metric_type: str  # "AverageValue": threshold is per replica; "Value": for the whole group
    activation: float | None = None
    why_missing: str = ""


def _triggers(target: ExportTarget) -> list[_Trigger]:
    t, model = target.thresholds, target.model
    activation_tokens = None
    # The pending-token trigger wakes the group at the same queue as the waiting-requests one:
    # the activation scales with the ratio of the two thresholds.
    if _known(t.pending_prompt_tokens) and _known(t.requests_waiting):
        if t.activation_requests_waiting is not None:
            ratio = t.pending_prompt_tokens / t.requests_waiting
            activation_tokens = t.activation_requests_waiting * ratio
    return [
        _Trigger(
            "queue-depth",
            f"sum({selector('requests_waiting', model)})",
            t.requests_waiting,
            "AverageValue",
            t.activation_requests_waiting,
            "no benchmark gives the queue depth at which p95 TTFT crossed the SLO",
        ),
        _Trigger(
            "pending-prompt-tokens",
            f"sum({selector('pending_prompt_tokens', model)})",
            t.pending_prompt_tokens,
            "AverageValue",
            activation_tokens,
            "the benchmark runs have no prompt-length record to turn the queue into tokens",
        ),
        # The latency guardrail is "Value": HPA then asks ceil(replicas x p95 / SLO), so the
        # group grows in proportion to how far the worst replica is past the SLO.
        # "AverageValue" would divide a latency by the replica count, which means nothing.
        _Trigger(
            "ttft-p95-guardrail",
            f"max({selector('ttft_p95_seconds', model, '1m')})",
            t.ttft_p95_seconds or slo_seconds(target),
            "Value",
            None,
        ),
        _Trigger(
            "arrival-rate",
            f"sum({selector('arrival_requests_per_second', model)})",
            t.requests_per_s,
            "AverageValue",
            None,
            "no benchmark of this config and profile measured the request rate within the SLO",
        ),
    ]


def keda_scaled_object(target: ExportTarget) -> dict:
    """A KEDA ``ScaledObject`` (keda.sh/v1alpha1) scaling ``target.scale_target`` on the
    panel's series through KEDA's Prometheus scaler."""
    target = _check(target)
    policy = target.policy
    name = k8s_name(target.scale_target or target.deployment)
    triggers, omitted = [], []
    for trig in _triggers(target):
        if not _known(trig.threshold):
            omitted.append(f"{trig.name}: {trig.why_missing or 'threshold unknown'}")
            continue
        metadata = {
            "serverAddress": target.prometheus_url,
            "query": trig.query,
            "threshold": number(trig.threshold),
            # No sample (an idle engine has no latency window, a fresh panel no series yet)
            # reads as 0 rather than a scaler error that freezes the group.
            "ignoreNullValues": "true",
        }
        if trig.activation is not None and trig.activation >= 0:
            metadata["activationThreshold"] = number(trig.activation)
        triggers.append(
            {
                "type": "prometheus",
                "name": trig.name,
                "metricType": trig.metric_type,
                "metadata": metadata,
            }
        )
    annotations = {
        f"{ANNOTATION}/generated-by": PANEL,
        f"{ANNOTATION}/deployment": target.deployment,
        f"{ANNOTATION}/model": target.model,
        f"{ANNOTATION}/host": target.host,
        f"{ANNOTATION}/engine": target.engine,
        f"{ANNOTATION}/evidence": evidence_text(target),
        f"{ANNOTATION}/slo": slo_text(target.slo),
        f"{ANNOTATION}/guardrail": (
            "ttft-p95-guardrail is metricType Value: desired = ceil(replicas x p95 TTFT / SLO), "
            "so the group grows when latency crosses the SLO whatever the queue says"
        ),
    }
    if omitted:
        annotations[f"{ANNOTATION}/omitted-triggers"] = "; ".join(omitted)
    if policy.engine_start_s is not None:
        annotations[f"{ANNOTATION}/engine-start-seconds"] = number(policy.engine_start_s)
    labels = {
        "app.kubernetes.io/managed-by": "llmpanel",
        f"{ANNOTATION}/deployment": k8s_name(target.deployment),
    }
    if k8s_label_value(target.model):
        labels[f"{ANNOTATION}/model"] = k8s_label_value(target.model)
    # HPA accepts stabilisation windows of 0..3600 s only.
    stabilise = int(min(max(round(policy.stabilisation_s), 0), 3600))
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {
            "name": name,
            "namespace": target.namespace or "default",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": target.scale_target_kind or "Deployment",
                # The object exists already: its own name, as given; ours when none was.
                "name": target.scale_target or name,
            },
            "minReplicaCount": int(policy.min_replicas),
            "maxReplicaCount": int(policy.max_replicas),
            "pollingInterval": max(int(round(policy.polling_interval_s)), 1),
            # KEDA's cooldown applies only to the last replica going to zero; between 1 and N
            # the HPA behaviour below holds replicas through a dip.
            "cooldownPeriod": max(int(round(policy.cooldown_s)), 0),
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        # A replica that is gone costs a full engine start to get back, so
                        # scale down one at a time after a stable window; scale up at once.
                        "scaleDown": {
                            "stabilizationWindowSeconds": stabilise,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
                        },
                        "scaleUp": {"stabilizationWindowSeconds": 0},
                    }
                }
            },
            "triggers": triggers,
        },
    }


# --- Prometheus alerting rules --------------------------------------------------------------


def _rule(alert: str, expr: str, for_: str, severity: str, summary: str, description: str):
    return {
        "alert": alert,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": description},
    }


def alert_rules(target: ExportTarget) -> dict:
    """Prometheus alerting rules for one model's replica group: SLO burn (5m and fast 1m),
    queue growth, KV saturation and preemptions, under-provisioning, stale signals."""
    target = _check(target)
    model, t = target.model, target.thresholds
    m = _plain(model)  # for the texts; selectors take the exact name
    slo_s = slo_seconds(target)
    per = "max by (deployment, host) "
    who = "{{ $labels.deployment }} on {{ $labels.host }}"
    rules = [
        _rule(
            "LLMPanelTTFTSLOBurn",
            f"{per}({selector('ttft_p95_seconds', model, '5m')}) > {number(slo_s)}",
            "5m",
            "warning",
            f"p95 TTFT of {m} above its SLO",
            f"{who}: p95 TTFT over 5 minutes is {{{{ $value | humanizeDuration }}}}, "
            f"SLO {slo_text(target.slo)}.",
        ),
        # A 1-minute percentile is noisy: it pages only when twice the SLO, held for 2 minutes.
        _rule(
            "LLMPanelTTFTSLOFastBurn",
            f"{per}({selector('ttft_p95_seconds', model, '1m')}) > {number(2 * slo_s)}",
            "2m",
            "critical",
            f"p95 TTFT of {m} at twice its SLO",
            f"{who}: p95 TTFT over 1 minute is {{{{ $value | humanizeDuration }}}}, "
            f"more than twice the SLO ({slo_text(target.slo)}).",
        ),
    ]
    if _known(t.requests_waiting):
        rules.append(
            _rule(
                "LLMPanelQueueAboveThreshold",
                f"{per}({selector('requests_waiting', model)}) > {number(t.requests_waiting)}",
                "2m",
                "warning",
                f"Requests queue on {m} beyond the depth that breaks the SLO",
                f"{who}: {{{{ $value }}}} requests waiting; above {number(t.requests_waiting)} "
                f"p95 TTFT crossed the SLO in {_plain(evidence_text(target))}.",
            )
        )
    # Without a measured threshold, a queue that keeps growing is still worth a look.
    floor = t.activation_requests_waiting if _known(t.activation_requests_waiting) else 1
    waiting = selector("requests_waiting", model)
    rules += [
        _rule(
            "LLMPanelQueueGrowing",
            f"deriv({waiting}[10m]) > 0 and {waiting} > {number(floor)}",
            "10m",
            "warning",
            f"Requests queue on {m} growing for 10 minutes",
            f"{who}: the waiting queue has grown for 10 minutes and holds more than "
            f"{number(floor)} requests: demand is above what the group serves.",
        ),
        _rule(
            "LLMPanelKVCacheSaturated",
            f"{per}({selector('kv_cache_usage_ratio', model)}) > {number(KV_SATURATED)}",
            "5m",
            "warning",
            f"KV cache of {m} nearly full",
            f"{who}: KV cache {{{{ $value | humanizePercentage }}}} used for 5 minutes; new "
            "requests wait or preempt running ones.",
        ),
        _rule(
            "LLMPanelPreemptions",
            f"{per}({selector('preemptions_per_second', model)}) > 0",
            "5m",
            "warning",
            f"{m} preempting requests",
            f"{who}: {{{{ $value }}}} preemptions/s for 5 minutes: the KV cache is too small "
            "for the load, and preempted requests recompute their prompts.",
        ),
        _rule(
            "LLMPanelUnderProvisioned",
            f"max({selector('desired_replicas', model)}) > max({selector('replicas', model)})",
            "10m",
            "warning",
            f"{m} needs more replicas than run",
            f"The panel has recommended {{{{ $value }}}} replicas of {m} for 10 minutes, more "
            "than run.",
        ),
        _rule(
            "LLMPanelSignalsStale",
            f"{per}({selector('signals_age_seconds', model)}) > {STALE_AFTER_S} "
            f"or absent({selector('signals_age_seconds', model)})",
            "2m",
            "warning",
            f"Scaling signals of {m} stale",
            f"The panel has not read the engines' /metrics of {m} for over {STALE_AFTER_S} s "
            "(or exports none): scalers on these series act on old data.",
        ),
    ]
    return {"groups": [{"name": f"llmpanel-{k8s_name(target.deployment)}", "rules": rules}]}


# --- Grafana --------------------------------------------------------------------------------

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _steps(lines) -> dict:
    steps = [{"color": "green", "value": None}]
    steps += [{"color": "red", "value": v} for v in sorted(v for v in lines if _known(v))]
    return {"mode": "absolute", "steps": steps}


def _panel(kind: str, title: str, unit: str, keys, description: str = "", lines=()) -> dict:
    """One panel; ``keys`` are series keys, "key@window" for a percentile window; ``lines``
    the thresholds drawn across a time series (unknown ones are skipped)."""
    targets = []
    for i, spec in enumerate(keys):
        key, _, window = spec.partition("@")
        what = f"{key.removesuffix('_seconds')} {window}".strip() + " " if len(keys) > 1 else ""
        matchers = 'model="$model"' + (f",window={promql_string(window)}" if window else "")
        targets.append(
            {
                "datasource": DATASOURCE,
                "expr": f"{series.name(key)}{{{matchers}}}",
                "legendFormat": what + "{{deployment}} @ {{host}}",
                "refId": chr(ord("A") + i),
            }
        )
    defaults = {"unit": unit, "thresholds": _steps(lines)}
    if kind == "timeseries":
        shown = "line" if any(_known(v) for v in lines) else "off"
        defaults["custom"] = {"thresholdsStyle": {"mode": shown}}
        options = {"legend": {"displayMode": "list", "placement": "bottom"}}
    else:
        options = {"reduceOptions": {"calcs": ["lastNotNull"]}}
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": targets,
    }


def _layout(panels: list[dict], widths: list[int]) -> list[dict]:
    """Ids and grid positions, left to right in Grafana's 24 columns, wrapping into rows."""
    x = y = row_h = 0
    for pid, (panel, w) in enumerate(zip(panels, widths, strict=True), start=1):
        h = 8 if panel["type"] == "timeseries" else 4
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        panel["id"] = pid
        panel["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
        x, row_h = x + w, max(row_h, h)
    return panels


def grafana_dashboard(target: ExportTarget) -> dict:
    """A Grafana dashboard (schema 39) of every panel series, for one model's replica group,
    with the SLO and the scaler thresholds drawn as lines."""
    target = _check(target)
    t, slo_s = target.thresholds, slo_seconds(target)
    itl_slo = target.slo.itl_p95_ms / 1000.0 if target.slo.itl_p95_ms else None
    windows = [f"{q}_seconds@{w}" for q in ("p50", "p95") for w in ("1m", "5m")]
    evidence = "From the benchmark history: " + evidence_text(target)
    panels = [
        _panel("stat", "Replicas running", "short", ["replicas"]),
        _panel("stat", "Desired replicas", "short", ["desired_replicas"]),
        _panel("stat", "Capacity per replica at SLO", "reqps", ["capacity_rps_at_slo"], evidence),
        _panel("stat", "SLO p95 TTFT", "s", ["slo_ttft_p95_seconds"]),
        _panel("stat", "Signals age", "s", ["signals_age_seconds"], "", (STALE_AFTER_S,)),
        _panel(
            "timeseries",
            "Requests waiting and running",
            "short",
            ["requests_waiting", "requests_running"],
            "Line: the per-replica queue depth the scaler acts at. " + evidence,
            (t.requests_waiting,),
        ),
        _panel(
            "timeseries",
            "Pending prompt tokens",
            "short",
            ["pending_prompt_tokens"],
            series.BY_KEY["pending_prompt_tokens"].help,
            (t.pending_prompt_tokens,),
        ),
        _panel(
            "timeseries",
            "Time to first token",
            "s",
            ["ttft_" + w for w in windows],
            "Line: the SLO's p95 TTFT.",
            (slo_s,),
        ),
        _panel(
            "timeseries", "Inter-token latency", "s", ["itl_" + w for w in windows], "", (itl_slo,)
        ),
        _panel(
            "timeseries",
            "KV cache usage",
            "percentunit",
            ["kv_cache_usage_ratio"],
            "",
            (KV_SATURATED,),
        ),
        _panel("timeseries", "Preemptions", "reqps", ["preemptions_per_second"]),
        _panel(
            "timeseries",
            "Request rate: arriving vs capacity at SLO",
            "reqps",
            ["arrival_requests_per_second", "capacity_rps_at_slo"],
            "Line: the per-replica request rate the scaler acts at.",
            (t.requests_per_s,),
        ),
        _panel(
            "timeseries",
            "Tokens per second",
            "suffix: tok/s",
            ["input_tokens_per_second", "output_tokens_per_second"],
        ),
        _panel(
            "timeseries", "Replicas: running vs desired", "short", ["replicas", "desired_replicas"]
        ),
    ]
    _layout(panels, [5, 5, 5, 5, 4] + [12] * (len(panels) - 5))
    values = f"label_values({series.name('requests_waiting')}, model)"
    seed = f"{target.deployment_id}/{target.deployment}".encode()
    return {
        "id": None,
        "uid": "llmpanel-" + hashlib.sha1(seed, usedforsecurity=False).hexdigest()[:16],
        "title": f"LLM panel scaling: {target.deployment}",
        "description": header(target, "Dashboard"),
        "tags": ["llmpanel", "scaling"],
        "timezone": "browser",
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                {
                    "name": "model",
                    "label": "Model",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "query": values,
                    "definition": values,
                    "refresh": 2,  # on time-range change: models come and go
                    "current": {"selected": True, "text": target.model, "value": target.model},
                    "includeAll": False,
                    "multi": False,
                },
            ]
        },
        "panels": panels,
    }


# --- Files ----------------------------------------------------------------------------------


def dump_yaml(doc: dict, header: str = "") -> str:
    """YAML as written by PyYAML (safe, keys in our order), under ``header`` as comments."""
    body = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=4096)
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    return ("\n".join(lines) + "\n" if lines else "") + body


def dump_json(doc: dict) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


@dataclass(frozen=True)
class ExportFile:
    """One download: its file name, content type and text."""

    filename: str
    content_type: str
    text: str


# Kind (as the URL and the CLI say it) -> (title, builder, format).
KINDS = {
    "keda": ("KEDA ScaledObject", keda_scaled_object, "yaml"),
    "alerts": ("Prometheus alerting rules", alert_rules, "yaml"),
    "grafana": ("Grafana dashboard", grafana_dashboard, "json"),
}


def render(target: ExportTarget, kind: str) -> ExportFile:
    """The download of ``kind`` ("keda", "alerts", "grafana", or with its extension as the
    URLs say it: "keda.yaml", "alerts.yaml", "grafana.json") for ``target``."""
    base = kind.rsplit(".", 1)[0] if kind.endswith((".yaml", ".json")) else kind
    if base not in KINDS or (kind != base and not kind.endswith(KINDS[base][2])):
        raise ValueError(f"unknown export kind {kind!r}: one of keda, alerts, grafana")
    target = _check(target)
    title, build, fmt = KINDS[base]
    doc = build(target)
    name = f"{k8s_name(target.deployment)}-{base}.{fmt}"
    if fmt == "json":
        return ExportFile(name, "application/json", dump_json(doc))
    return ExportFile(name, "application/yaml", dump_yaml(doc, header(target, title)))
