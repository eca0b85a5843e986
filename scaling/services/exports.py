"""The export downloads of one deployment: the ``ExportTarget`` the pure writers take
(``scaling.planning.exports``), and each file rendered with its name and media type.

The header comment of every file says where it came from (panel, deployment, the runs the
thresholds came from) and which triggers or rules are missing and why, so a file
downloaded before any benchmark is still honest about what it leaves out."""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.utils import timezone

from hosts.models import Deployment
from scaling.planning import exports as writers
from scaling.planning.types import ExportTarget

KINDS = ("keda.yaml", "alerts.yaml", "grafana.json")
# What each threshold feeds, and why it may be missing: said in the header when it is.
THRESHOLD_USES = (
    ("requests_waiting", "the queue-depth trigger (requests waiting per replica)"),
    ("pending_prompt_tokens", "the pending-prompt-tokens trigger"),
    ("requests_per_s", "the arrival-rate trigger (requests/s per replica)"),
)


@dataclass(frozen=True)
class ExportFile:
    """One rendered download."""

    body: str
    content_type: str
    filename: str


def export_target(deployment: Deployment, state, params: dict) -> ExportTarget:
    """The target for ``deployment`` from its scaling state (``scaling_state``) and the
    download's cleaned parameters (``ExportForm.target_params``)."""
    return ExportTarget(
        deployment=deployment.name,
        deployment_id=deployment.pk,
        host=deployment.host.name,
        model=deployment.model,
        engine=deployment.engine,
        policy=state.policy,
        thresholds=state.decision.thresholds,
        slo=state.slo,
        **params,
    )


def missing_thresholds(target: ExportTarget) -> list[str]:
    """One line per threshold the scaler file lacks, saying what is left out and why."""
    evidence = target.thresholds.evidence or "no finished benchmark run of the running config"
    return [
        f"{use} is left out: no measured threshold ({evidence})."
        for key, use in THRESHOLD_USES
        if getattr(target.thresholds, key) is None
    ]


def header(target: ExportTarget, what: str) -> str:
    lines = [
        f"{what} for {target.host}/{target.deployment} ({target.model}, {target.engine}),",
        f"written by the LLM control panel on {timezone.now():%Y-%m-%d %H:%M} UTC.",
        f"SLO: p95 TTFT <= {target.slo.ttft_p95_ms:g} ms"
        + (f", p95 ITL <= {target.slo.itl_p95_ms:g} ms" if target.slo.itl_p95_ms else "")
        + ".",
        "Thresholds: " + (target.thresholds.evidence or "none measured yet."),
    ]
    missing = missing_thresholds(target)
    if missing:
        lines.append("Missing:")
        lines.extend("  - " + line for line in missing)
        lines.append(
            "  Benchmark the deployment on its running config (a staged load that crosses "
            "the SLO) and download again."
        )
    return "\n".join(lines)


def _stem(target: ExportTarget) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{target.host}-{target.deployment}").strip("-")


def render(kind: str, target: ExportTarget) -> ExportFile:
    """The file of ``kind`` (one of ``KINDS``) for ``target``."""
    stem = _stem(target)
    if kind == "keda.yaml":
        doc = writers.keda_scaled_object(target)
        body = writers.dump_yaml(doc, header(target, "KEDA ScaledObject"))
        return ExportFile(body, "application/yaml", f"{stem}-keda-scaledobject.yaml")
    if kind == "alerts.yaml":
        doc = writers.alert_rules(target)
        body = writers.dump_yaml(doc, header(target, "Prometheus alerting rules"))
        return ExportFile(body, "application/yaml", f"{stem}-alert-rules.yaml")
    if kind == "grafana.json":
        body = writers.dump_json(writers.grafana_dashboard(target))
        return ExportFile(body, "application/json", f"{stem}-grafana-dashboard.json")
    raise ValueError(f"unknown export kind {kind!r}")


def scrape_config(panel_url: str) -> str:
    """The Prometheus scrape job for the panel's ``/metrics`` (a bearer token is needed
    unless the scraper's address is allowed; see the README)."""
    scheme, _, rest = panel_url.partition("://")
    host = rest.split("/", 1)[0]
    return (
        "scrape_configs:\n"
        "  - job_name: llm-control-panel\n"
        "    scrape_interval: 5s\n"
        f"    scheme: {scheme or 'http'}\n"
        "    metrics_path: /metrics\n"
        "    authorization:\n"
        "      credentials_file: /etc/prometheus/llmpanel-token\n"
        "    static_configs:\n"
        f"      - targets: ['{host}']\n"
    )
