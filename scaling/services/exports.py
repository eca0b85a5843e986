"""The export downloads of one deployment: the ``ExportTarget`` the pure writers take
(``scaling.planning.exports``), and each file rendered with its name and media type.

Every file's header comment says where it came from (panel, deployment, the runs the
thresholds came from); a YAML file's also lists the triggers it lacks and why, so a file
downloaded before any benchmark is still honest about what it leaves out."""

from __future__ import annotations

from hosts.models import Deployment
from scaling.planning import exports as writers
from scaling.planning.types import ExportTarget

KINDS = ("keda.yaml", "alerts.yaml", "grafana.json")
# What each threshold feeds (in the scaler and the alerts), said in the header when missing.
THRESHOLD_USES = (
    ("requests_waiting", "the queue-depth trigger and alert (requests waiting per replica)"),
    ("pending_prompt_tokens", "the pending-prompt-tokens trigger"),
    ("requests_per_s", "the arrival-rate trigger (requests/s per replica)"),
)


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


def render(kind: str, target: ExportTarget) -> writers.ExportFile:
    """The file of ``kind`` (one of ``KINDS``) for ``target``; a YAML file's header also
    lists the triggers it lacks, and why."""
    file = writers.render(target, kind)
    missing = missing_thresholds(target)
    if not kind.endswith(".yaml") or not missing:
        return file
    title, build, _ = writers.KINDS[kind.removesuffix(".yaml")]
    lines = [writers.header(target, title), "Missing:"]
    lines += ["  - " + line for line in missing]
    lines.append(
        "  Benchmark the deployment on its running config with a load that crosses the SLO, "
        "then download again."
    )
    text = writers.dump_yaml(build(target), "\n".join(lines))
    return writers.ExportFile(file.filename, file.content_type, text)


def scrape_config(panel_url: str) -> str:
    """The Prometheus scrape job for the panel's ``/metrics`` (a bearer token is needed
    unless the scraper's address is allowed; see docs/api.md)."""
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
