"""Pages of the changes app: the list with the deployments' locks, proposing a change (with a
live preview), one change with its live timeline and actions, and a deployment's config
history with rollback proposals. Who may do what lives in ``changes.rules``, the verbs in
``changes.services``: a view checks access, calls one verb and says what happened."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_POST

from benchmarks.services import probes
from changes import advice, views_advisor
from changes.choices import LOCK_STATES, ChangeKind, ChangeState, Decision
from changes.forms import ChangeFilterForm, CommentForm, ProposeForm, RollbackForm
from changes.models import ChangeRequest
from changes.rules import APPLY, OVERRIDE, ChangeRefused, start_problem
from changes.services import apply, config_history, facts, progress, review, timeline
from controlpanel.services import redact
from hosts.models import Deployment, EngineConfig

PAGE_SIZE = 25
LIST_FIELDS = (
    "kind",
    "state",
    "title",
    "created_at",
    "required_approvals",
    "base_config",
    "proposed_by__username",
    "deployment__name",
    "deployment__active_config",
    "deployment__host__name",
)
PARTS = {
    "actions": "changes/_actions.html",
    "status": "changes/_status.html",
    "facts": "changes/_facts.html",
    "progress": "changes/_progress.html",
    "warnings": "changes/_warnings.html",
}
DETAIL_SELECT = (
    "deployment__host",
    "deployment__active_config",
    "proposed_by",
    "applied_by",
    "base_config",
    "target_config",
    "applied_config",
    "verify_profile",
    "baseline_run",
    "verification_run",
)


# --- the list ----------------------------------------------------------------------------------
@permission_required("changes.view_changerequest", raise_exception=True)
def change_list(request):
    form = ChangeFilterForm(request.GET)
    # Only the columns the table shows: the approvals count groups every change's row, so
    # the JSON documents (settings, prediction, comparison ...) would be sorted along.
    changes = (
        ChangeRequest.objects.select_related("deployment__host", "proposed_by")
        .only(*LIST_FIELDS)
        .with_approvals()
    )
    if form.is_valid():
        changes = form.filter(changes)
    page = Paginator(changes.order_by("-created_at", "-pk"), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    query = request.GET.copy()
    query.pop("page", None)
    locks = ChangeRequest.objects.filter(state__in=LOCK_STATES).select_related("deployment__host")
    context = {"form": form, "page": page, "query": query.urlencode(), "locks": locks}
    return render(request, "changes/change_list.html", context)


# --- proposing ---------------------------------------------------------------------------------
def _deployment(request) -> Deployment | None:
    pk = request.GET.get("deployment", "")
    if not pk.isdigit():
        return None
    return get_object_or_404(Deployment.objects.select_related("host", "active_config"), pk=int(pk))


@permission_required("changes.add_changerequest", raise_exception=True)
def change_new(request):
    deployment = _deployment(request)
    if deployment is None:
        deployments = Deployment.objects.select_related("host", "active_config").order_by(
            "host__name", "name"
        )
        return render(request, "changes/change_pick.html", {"deployments": deployments})
    form = ProposeForm(deployment, request.POST or None)
    if request.method != "POST":
        views_advisor.prefill_from_finding(request, form)  # "Propose this change" (?finding=N)
    if request.method == "POST" and form.is_valid():
        try:
            change = review.propose_change(
                request.user,
                deployment,
                submit=request.POST.get("action") != "draft",
                **form.proposal(),
            )
        except (ChangeRefused, PermissionDenied) as exc:
            # Refused for what it sets (a code-loading flag needs an Admin): say so on the
            # form, with what was typed kept.
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Change #{change.pk} {change.get_state_display().lower()}.")
            return redirect(change)
    return render(request, "changes/change_form.html", {"form": form, "deployment": deployment})


@require_POST
@permission_required("changes.add_changerequest", raise_exception=True)
def change_preview(request):
    """The proposal form's live pane: diff, warnings and predicted impact of what it holds."""
    deployment = _deployment(request)
    if deployment is None:
        raise Http404("no deployment given")
    form = ProposeForm(deployment, request.POST)
    form.is_valid()  # the title and the rationale may still be empty: only flags matter here
    context = {"problems": form.flag_errors(), "facts": None}
    if not context["problems"]:
        try:
            proposal = facts.validate_proposal(
                deployment, form.settings(), *form.carried(), form.model_choice()
            )
            shown = facts.review_facts(
                deployment,
                deployment.active_config,
                proposal,
                form.cleaned_data.get("verify_profile"),
            )
            context["facts"] = {**shown, "diff": facts.shown_diff(shown["diff"])}
        except ChangeRefused as exc:
            context["problems"] = [str(exc)]
    return render(request, "changes/_preview.html", context)


# --- one change --------------------------------------------------------------------------------
def _change(pk) -> ChangeRequest:
    return get_object_or_404(ChangeRequest.objects.select_related(*DETAIL_SELECT), pk=pk)


def _timeline_items(change: ChangeRequest) -> list[dict]:
    # Secrets are masked when an entry is written; masked again here for entries written
    # before that was so.
    return [redact(item) for item in timeline.timeline(change)]


def _timeline(change: ChangeRequest) -> list[dict]:
    items = _timeline_items(change)
    for item in items:
        item["when"] = parse_datetime(item["at"])
    return items


def _context(request, change: ChangeRequest) -> dict:
    approvals = list(change.approvals.all())
    current = [a for a in approvals if a.base_config_id == change.base_config_id]
    actions = change.allowed_actions(request.user)
    return {
        "change": change,
        "diff": facts.shown_diff(change.diff()),
        "stale": change.is_stale(),
        "actions": actions,
        "buttons": actions - {"comment", "rebase"},
        "approvals": approvals,
        "approved": sum(a.decision == Decision.APPROVE for a in current),
        "reviewed": any(a.reviewer_id == request.user.pk for a in current),
        "lock": apply.lock_holder(change.deployment),
        "alive": change.pipeline_alive(),
        "comparison": change.comparison or None,
        # The quality verdict in the words the timeline and the API say (one function).
        "quality_verdict": probes.quality_verdict(change.quality_comparison)
        if change.quality_comparison
        else None,
        # Stored warnings plus the prediction's harm, recomputed (advice.PREDICTED_HARM).
        "warnings": advice.with_prediction_warnings(change.warnings, change.prediction),
        "start_problem": start_problem(change) if change.state == ChangeState.PENDING else None,
        "progress": progress.progress(change),
    }


@permission_required("changes.view_changerequest", raise_exception=True)
def change_detail(request, pk):
    change = _change(pk)
    context = {**_context(request, change), "timeline": _timeline(change)}
    return render(request, "changes/change_detail.html", context)


@permission_required("changes.view_changerequest", raise_exception=True)
def change_part(request, pk, part):
    """One fragment of the change page, re-fetched by htmx on a live event."""
    if part not in PARTS:
        raise Http404("no such part")
    return render(request, PARTS[part], _context(request, _change(pk)))


@permission_required("changes.view_changerequest", raise_exception=True)
def change_timeline(request, pk):
    """The whole timeline and the state: what the live page merges in after a reconnect."""
    change = get_object_or_404(ChangeRequest, pk=pk)
    state = change.state_choice
    return JsonResponse(
        {
            "id": change.pk,
            "state": state.value,
            "label": state.label,
            "colour": state.colour,
            "items": _timeline_items(change),
        }
    )


# --- actions: each a POST that calls one verb and goes back to the change ----------------------
def _act(request, pk, verb, done: str | None, *, text: str | None = None):
    """``done``: the flash after it worked; None where the page's progress block says it from
    the change's state (a one-shot "being applied" would outlive the apply on a live page)."""
    change = get_object_or_404(ChangeRequest, pk=pk)
    form = CommentForm(request.POST)
    if not form.is_valid():
        messages.error(request, "; ".join(form.errors["comment"]))
        return redirect(change)
    args = () if text is None else (form.cleaned_data["comment"],)
    try:
        verb(request.user, change, *args)
    except ChangeRefused as exc:
        messages.error(request, str(exc))
    else:
        if done:
            messages.success(request, done.format(pk=change.pk))
    return redirect(change)


@require_POST
@permission_required("changes.add_changerequest", raise_exception=True)
def change_submit(request, pk):
    return _act(request, pk, review.submit_change, "Change #{pk} submitted for review.")


@require_POST
@permission_required("changes.approve_changerequest", raise_exception=True)
def change_approve(request, pk):
    return _act(request, pk, review.approve_change, "You approved change #{pk}.", text="")


@require_POST
@permission_required(OVERRIDE, raise_exception=True)
def change_approve_override(request, pk):
    """An Admin approves a change predicted not to start; the reason (the comment) is required
    and audited by the service."""
    return _act(
        request,
        pk,
        review.override_start_and_approve,
        "You approved change #{pk} despite the predicted start failure.",
        text="",
    )


@require_POST
@permission_required("changes.approve_changerequest", raise_exception=True)
def change_reject(request, pk):
    return _act(request, pk, review.reject_change, "You rejected change #{pk}.", text="")


@require_POST
@permission_required("changes.add_changerequest", raise_exception=True)
def change_withdraw(request, pk):
    return _act(request, pk, review.withdraw_change, "Change #{pk} withdrawn.", text="")


@require_POST
@permission_required("changes.add_changerequest", raise_exception=True)
def change_comment(request, pk):
    return _act(request, pk, review.comment_on_change, "Comment added.", text="")


@require_POST
@permission_required("changes.add_changerequest", raise_exception=True)
def change_rebase(request, pk):
    return _act(request, pk, review.rebase_change, "Change #{pk} rebased: it needs a review again.")


@require_POST
@permission_required(APPLY, raise_exception=True)
def change_apply(request, pk):
    return _act(request, pk, apply.apply_change, None)


@require_POST
@permission_required(APPLY, raise_exception=True)
def change_resume(request, pk):
    return _act(request, pk, apply.resume_change, None)


@require_POST
@permission_required(APPLY, raise_exception=True)
def change_rollback(request, pk):
    return _act(request, pk, apply.request_rollback, None, text="")


# --- config history ----------------------------------------------------------------------------
@permission_required("hosts.view_engineconfig", raise_exception=True)
def all_configs(request):
    """Every engine-config version of every deployment, newest first."""
    configs = list(
        EngineConfig.objects.select_related("deployment__host", "created_by").order_by(
            "-created_at", "-pk"
        )[:100]
    )
    return render(request, "changes/config_list.html", {"rows": config_history.rows(configs)})


@permission_required("hosts.view_engineconfig", raise_exception=True)
def deployment_configs(request, pk):
    """One deployment's config versions, newest first, each with how it ended and what it
    changed from the version it was made from; one that ran healthy (and is not running) can
    be the target of a rollback proposal."""
    deployment = get_object_or_404(Deployment.objects.select_related("host"), pk=pk)
    configs = list(
        EngineConfig.objects.filter(deployment=deployment)
        .select_related("created_by")
        .order_by("-version")
    )
    rows = config_history.rows(configs)
    # The change that created each version, in one query.
    made_by = dict(
        ChangeRequest.objects.filter(
            applied_config__in=configs, kind=ChangeKind.SETTINGS
        ).values_list("applied_config_id", "pk")
    )
    for row in rows:
        row["change"] = made_by.get(row["config"].pk)
    context = {"deployment": deployment, "rows": rows, "form": RollbackForm()}
    return render(request, "changes/deployment_configs.html", context)


@require_POST
@permission_required("changes.add_changerequest", raise_exception=True)
def propose_rollback(request, pk):
    target = get_object_or_404(EngineConfig.objects.select_related("deployment__host"), pk=pk)
    form = RollbackForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Say why you propose this rollback.")
        return redirect("changes:configs", target.deployment_id)
    try:
        change = review.propose_rollback(
            request.user, target, rationale=form.cleaned_data["rationale"]
        )
    except ChangeRefused as exc:
        messages.error(request, str(exc))
        return redirect("changes:configs", target.deployment_id)
    messages.success(request, f"Change #{change.pk} proposed: {change.title}.")
    return redirect(change)
