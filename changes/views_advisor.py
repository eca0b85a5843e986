"""The advisor's pages: the "Advisor" fragment of a deployment (on its host's page) and of a run,
dismissing a finding with a reason, and the pre-filling of the proposal form that "Propose this
change" opens (``changes:new?deployment=D&finding=N``).

The host and run pages belong to apps below this one, which may not import it: they hold an
empty section per deployment that htmx fills from here on load and again on each live
``advisor.findings`` event of the deployment's socket (the dashboard's list: the fleet's).
The rules live in ``changes.advisor``, the verbs in ``changes.services.diagnosis``; these
views only check access and render."""

from __future__ import annotations

import re

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.utils.dateparse import parse_datetime
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from benchmarks.models import BenchmarkRun
from changes import verdict
from changes.models import Finding
from changes.services import diagnosis
from hosts.models import Deployment

VIEW = "changes.view_finding"
PROPOSE = "changes.add_changerequest"
BADGES = {"critical": "red", "warning": "amber", "info": "blue"}
FLEET_SHOWN = 20  # the worst of the fleet on the dashboard; the rest on their hosts' pages

SOURCE_RUN = re.compile(r"run (\d+)")


def active_findings():
    """Findings neither cleared nor dismissed, worst first, with what their rows show."""
    return (
        Finding.objects.active()
        .worst_first()
        .select_related("deployment__host", "deployment__active_config")
    )


def source_run_id(source: str) -> int | None:
    """The run a finding's numbers came from (its ``source`` is "run N"), or None (live)."""
    match = SOURCE_RUN.fullmatch(source or "")
    return int(match.group(1)) if match else None


def _scalar(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        numbers = [v for v in value if isinstance(v, int | float) and not isinstance(v, bool)]
        if numbers and len(numbers) == len(value) and len(value) > 6:
            # A series (a chart's points): its size and range say enough in a table.
            return f"{len(value)} values, {min(numbers):.4g} … {max(numbers):.4g}"
        return ", ".join(_scalar(v) for v in value)
    if value is None:
        return "—"
    return str(value)


def evidence_rows(evidence) -> list[tuple[str, str]]:
    """The evidence as (name, value) rows: nested mappings one level deep as ``a · b``."""
    rows = []
    for key, value in (evidence or {}).items():
        if isinstance(value, dict):
            rows += [(f"{key} · {k}", _scalar(v)) for k, v in value.items()]
        else:
            rows.append((str(key), _scalar(value)))
    return rows


def decorate(findings, run: BenchmarkRun | None = None) -> list[Finding]:
    """What the template shows beside the row's fields: badge, evidence rows, suggestion parts."""
    out = []
    for finding in findings:
        suggestion = finding.suggestion or {}
        finding.badge = BADGES.get(finding.severity, "grey")
        finding.rows = evidence_rows(finding.evidence)
        finding.settings = dict(suggestion.get("settings") or {})
        finding.action = suggestion.get("action") or ""
        running = finding.deployment.active_config
        current = dict(running.settings) if running else {}
        finding.changes = [
            (dest, current.get(dest), value) for dest, value in finding.settings.items()
        ]
        finding.source_run_id = source_run_id(finding.source)
        finding.from_this_run = run is not None and finding.source_run_id == run.pk
        out.append(finding)
    return out


def _render(request, findings, **context):
    return render(request, "changes/_advisor.html", {"findings": findings, **context})


@permission_required(VIEW, raise_exception=True)
def deployment_advisor(request, pk):
    """The findings of one deployment (its part of the host page, the deployment page)."""
    deployment = get_object_or_404(Deployment.objects.select_related("host"), pk=pk)
    findings = decorate(active_findings().filter(deployment=deployment))
    return _render(
        request,
        findings,
        deployment=deployment,
        next=deployment.host.get_absolute_url(),
        freshness=_freshness(deployment.pk, findings),
    )


def _freshness(deployment_pk: int, findings) -> diagnosis.Freshness:
    newest = max((f.last_seen_at for f in findings), default=None)
    return diagnosis.freshness(diagnosis.last_evaluation(deployment_pk), newest_seen=newest)


@permission_required(VIEW, raise_exception=True)
def run_advisor(request, pk):
    """The findings of the run's deployment, those this run's numbers raised marked as such."""
    run = get_object_or_404(BenchmarkRun, pk=pk)
    findings = decorate(active_findings().filter(deployment_id=run.deployment_id), run)
    return _render(
        request,
        findings,
        run=run,
        next=run.get_absolute_url(),
        freshness=_freshness(run.deployment_id, findings),
    )


def _back(request, finding: Finding):
    target = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        return redirect(target)
    return redirect(finding.deployment.host)


@require_POST
@permission_required(PROPOSE, raise_exception=True)
def dismiss(request, pk):
    """Dismiss a finding with a reason (the service audits it); back to the page it was on."""
    finding = get_object_or_404(Finding.objects.select_related("deployment__host"), pk=pk)
    try:
        diagnosis.dismiss(request.user, finding, request.POST.get("reason", ""))
    except diagnosis.DismissRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Finding “{finding.title}” dismissed.")
    return _back(request, finding)


def fleet_context() -> dict:
    """The fleet's active findings, worst first, and when the advisor last evaluated any
    deployment (queries: the same however many findings there are)."""
    findings = active_findings()
    shown = decorate(findings[:FLEET_SHOWN])
    more = findings.count() - FLEET_SHOWN if len(shown) == FLEET_SHOWN else 0
    evaluated = diagnosis.last_evaluations(Deployment.objects.values_list("pk", flat=True))
    times = [parse_datetime(e["evaluated_at"]) for e in evaluated.values() if e.get("evaluated_at")]
    return {"findings": shown, "findings_more": more, "advisor_last_ran": max(times, default=None)}


@permission_required(VIEW, raise_exception=True)
def fleet_advisor(request):
    """The dashboard's findings list, fetched again on a live event of the fleet."""
    return render(request, "home/_findings.html", fleet_context())


def proposal_rationale(finding: Finding) -> str:
    """What was seen and why it matters, and where it came from: the reviewer reads this."""
    return (
        f"{finding.seen}\n\n{finding.why}\n\nFrom advisor finding #{finding.pk} ({finding.rule})."
    )


def _grows_batch(settings: dict, running: dict) -> bool:
    for dest in verdict.BATCH_FLAGS:
        new, old = settings.get(dest), running.get(dest)
        if isinstance(new, int) and (not isinstance(old, int) or new > old):
            return True
    return False


def _verification_from_run(form, finding: Finding, settings: dict) -> list[str]:
    """Verify with the load the finding was seen under (its run's profile), and, for a
    larger batch, allow ITL p95 to grow with the batch (``verdict.batch_itl_limit``: from the
    change alone, so the limit does not depend on which run it was proposed from) instead of
    +20 %. Returns the lines that tell the reviewer so."""
    notes = []
    run_id = source_run_id(finding.source)
    run = (
        BenchmarkRun.objects.select_related("load_profile")
        .filter(pk=run_id, deployment=form.deployment)
        .first()
        if run_id
        else None
    )
    profile = run.load_profile if run else None
    if profile is not None and profile.pk in {p.pk for p in form.fields["verify_profile"].queryset}:
        form.initial["verify_profile"] = profile.pk
        notes.append(
            f"Verified with {profile.name} v{profile.version}, the load it was seen under."
        )
    if not _grows_batch(settings, form.running):
        return notes
    default = form.fields["max_itl_p95_regression"].initial
    limit = verdict.batch_itl_limit(settings, form.running, default / 100)
    if limit is not None and limit > default / 100:
        percent = round(limit * 100)
        form.initial["max_itl_p95_regression"] = percent
        notes.append(
            f"A larger batch costs inter-token latency: the ITL p95 limit is +{percent} %, "
            "as much as the batch cap grows (a decode step with that many more sequences "
            f"takes at most that much longer; at most +{verdict.BATCH_ITL_MAX:.0%}), instead of "
            f"+{default:g} %. It applies to the baseline run the verification compares against."
        )
    else:
        notes.append(
            "A larger batch costs inter-token latency: the ITL p95 limit is left at "
            f"+{default:g} %; raise it to what your users accept, or the verification may roll "
            "back the change for the price it was chosen to pay."
        )
    return notes


def prefill_from_finding(request, form) -> Finding | None:
    """Pre-fill the proposal form from ``?finding=N`` (a finding of the form's deployment)."""
    pk = request.GET.get("finding", "")
    if not pk.isdigit():
        return None
    finding = get_object_or_404(Finding, pk=int(pk), deployment=form.deployment)
    settings = dict((finding.suggestion or {}).get("settings") or {})
    notes = _verification_from_run(form, finding, settings)
    rationale = proposal_rationale(finding) + "".join(f"\n{line}" for line in notes)
    missing = form.prefill(title=finding.title, rationale=rationale, settings=settings)
    form.initial["finding"] = finding.pk
    messages.info(
        request,
        f"Pre-filled from advisor finding #{finding.pk} ({finding.rule}): {finding.title}. "
        "The preview shows the predicted impact.",
    )
    if missing:
        messages.warning(
            request,
            "This engine version has no field for "
            + ", ".join(missing)
            + ": left out of the proposal.",
        )
    return finding


# Included by changes/urls.py under advisor/ (names in the changes: namespace).
urlpatterns = [
    path("deployments/<int:pk>/", deployment_advisor, name="advisor_deployment"),
    path("fleet/", fleet_advisor, name="advisor_fleet"),
    path("runs/<int:pk>/", run_advisor, name="advisor_run"),
    path("findings/<int:pk>/dismiss/", dismiss, name="advisor_dismiss"),
]
