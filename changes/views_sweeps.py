"""The tuning sweep pages: the list, making one (``?deployment=<pk>``), one sweep with its live
fragment (re-fetched by htmx on each ``sweep.updated`` event of ``/ws/sweeps/<pk>/``), and
its actions, each a POST of its own: approve, reject, start, cancel, propose the winner.

Who may do what lives in ``changes.rules_sweeps``, the verbs in ``changes.services.sweeps``:
a view checks access, calls one verb and says what happened."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.views.decorators.http import require_POST

from benchmarks.models import BenchmarkRun
from benchmarks.sweep import Prediction, SearchSpace, Slo, SloError
from changes.choices import Decision, LaneState
from changes.forms_sweeps import SweepCommentForm, SweepForm
from changes.models import Sweep
from changes.rules import ChangeRefused
from changes.rules_sweeps import SweepRefused, allowed_actions
from changes.services import sweep_figures, sweep_prediction, sweeps
from hosts.models import Deployment

VIEW = "changes.view_sweep"
PROPOSE = "changes.add_changerequest"
PAGE_SIZE = 25
TOP_PREDICTED = 10  # the predicted points the page lists; the rest are only counted


# --- the list and a new sweep ------------------------------------------------------------------
@permission_required(VIEW, raise_exception=True)
def sweep_list(request):
    queryset = Sweep.objects.select_related("deployment__host", "created_by", "winner")
    page = Paginator(queryset, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "changes/sweep_list.html", {"page": page})


@permission_required(PROPOSE, raise_exception=True)
def sweep_new(request):
    pk = request.GET.get("deployment", "")
    if not pk.isdigit():
        deployments = Deployment.objects.select_related("host", "active_config").order_by(
            "host__name", "name"
        )
        return render(request, "changes/sweep_form.html", {"deployments": deployments})
    deployment = get_object_or_404(
        Deployment.objects.select_related("host", "active_config"), pk=int(pk)
    )
    form = SweepForm(deployment, sweeps.twins(deployment), request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            sweep = sweeps.create_sweep(request.user, deployment, **form.sweep_kwargs())
        except sweeps.SweepInvalid as exc:
            form.add_service_errors(exc)
        except (PermissionDenied, SweepRefused, ChangeRefused) as exc:
            # Refused for what it varies (a code-loading flag needs an Admin): say so on the
            # form, with what was typed kept.
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Sweep #{sweep.pk} made: predicting its space.")
            return redirect(sweep)
    status = 400 if form.is_bound and form.errors else 200
    context = {"form": form, "deployment": deployment}
    return render(request, "changes/sweep_form.html", context, status=status)


# --- one sweep ---------------------------------------------------------------------------------
def _sweep(pk) -> Sweep:
    return get_object_or_404(
        Sweep.objects.select_related(
            "deployment__host", "created_by", "load_profile", "base_config", "winner"
        ),
        pk=pk,
    )


def _described(text_of, *args) -> str:
    # A sweep saved by another version of benchmarks.sweep must still render its page.
    try:
        return text_of(*args)
    except (AttributeError, SloError, ValueError, TypeError, KeyError):
        return ""


def _space_text(sweep: Sweep) -> str:
    # The sweep package loads the simulator's cost model: only this page's text needs it.
    from benchmarks.sweep import Dimension

    dims = tuple(Dimension(flag, tuple(values)) for flag, values in (sweep.space or {}).items())
    return SearchSpace(sweep.deployment.engine, dims).describe()


def _prediction(sweep: Sweep) -> dict | None:
    """What the page shows of the prediction: counts, time, the ranked top, the groups of
    points the engine refused, the closest point when none meets the SLO."""
    if not sweep.prediction:
        return None
    try:
        prediction = Prediction.from_dict(sweep.prediction)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    top = [p for p in prediction.points if p.feasible][:TOP_PREDICTED]
    return {
        "counts": prediction.counts,
        "elapsed_s": prediction.elapsed_s,
        "infeasible": prediction.infeasible,
        "no_point_meets": prediction.no_point_meets,
        "closest": prediction.closest,
        "top": top,
    }


def _probe_runs(trials) -> dict[int, BenchmarkRun]:
    ids = {p.get("run") for t in trials for p in (t.probes or []) if p.get("run")}
    return BenchmarkRun.objects.in_bulk([i for i in ids if isinstance(i, int)])


def _best_probe(trial) -> dict | None:
    """The probe at the trial's max load (its margin to the SLO), or None."""
    ok = [p for p in trial.probes or [] if p.get("ok")]
    at_max = [p for p in ok if p.get("load") == trial.max_load]
    return (at_max or sorted(ok, key=lambda p: p.get("load") or 0))[-1] if ok else None


def _context(request, sweep: Sweep) -> dict:
    trials = list(sweep.trials.select_related("lane__deployment").prefetch_related("runs"))
    runs = _probe_runs(trials)
    currency = (sweep.target or {}).get("currency") or ""
    for trial in trials:
        trial.probe_rows = [{**p, "run_obj": runs.get(p.get("run"))} for p in trial.probes or []]
        trial.prediction_errors = sweep_prediction.prediction_errors(
            trial, sweep.load_mode, currency
        )
    winner = next((t for t in trials if t.pk == sweep.winner_id), None)
    control = next((t for t in trials if t.is_control), None)
    compare = []
    for trial in (winner, control):
        best = _best_probe(trial) if trial is not None else None
        if best and best.get("run"):
            compare.append(best["run"])
    actions = allowed_actions(request.user, sweep)
    lanes = list(sweep.lanes.select_related("deployment__host", "original_config"))
    for lane in lanes:
        lane.colour = LaneState(lane.state).colour
    approvals = list(sweep.approvals.all())
    return {
        "sweep": sweep,
        "trials": trials,
        "lanes": lanes,
        "approvals": approvals,
        "reviewed": any(a.reviewer_id == request.user.pk for a in approvals),
        "actions": actions,
        "progress": sweeps.progress(sweep),
        "slo_text": _described(lambda s: Slo.from_dict(s).describe(), sweep.slo),
        "space_text": _described(_space_text, sweep),
        "prediction": _prediction(sweep),
        "winner": winner,
        "winner_probe": _best_probe(winner) if winner else None,
        "control": control,
        "compare_runs": compare if len(compare) == 2 else [],
        "figures": sweep_figures.figures(sweep, trials),
        "reach_warning": sweep_prediction.reach_warning(sweep, trials),
        "load_unit": "req/s" if sweep.load_mode == "rate" else "users",
        "currency": currency,
        "finished": sweep.is_finished,
        "proposals": list(sweep.proposals.all()),
    }


@permission_required(VIEW, raise_exception=True)
def sweep_detail(request, pk):
    sweep = _sweep(pk)
    return render(request, "changes/sweep_detail.html", _context(request, sweep))


@permission_required(VIEW, raise_exception=True)
def sweep_part(request, pk):
    """The live part of the page, fetched again on each ``sweep.updated`` event."""
    return render(request, "changes/_sweep_live.html", _context(request, _sweep(pk)))


# --- actions: each a POST that calls one verb and goes back to the sweep -----------------------
def _act(request, pk, verb, done: str):
    sweep = get_object_or_404(Sweep, pk=pk)
    try:
        verb(sweep)
    except SweepRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, done)
    return redirect(sweep)


def _review(request, pk, decision: Decision, done: str):
    form = SweepCommentForm(request.POST)
    comment = form.cleaned_data["comment"] if form.is_valid() else ""
    if not form.is_valid():
        messages.error(request, "; ".join(form.errors["comment"]))
        return redirect(get_object_or_404(Sweep, pk=pk))
    return _act(
        request,
        pk,
        lambda s: sweeps.review_sweep(request.user, s, decision, comment),
        done,
    )


@require_POST
@permission_required(VIEW, raise_exception=True)
def sweep_approve(request, pk):
    return _review(request, pk, Decision.APPROVE, "Approved.")


@require_POST
@permission_required(VIEW, raise_exception=True)
def sweep_reject(request, pk):
    return _review(request, pk, Decision.REJECT, "Rejected.")


@require_POST
@permission_required(VIEW, raise_exception=True)
def sweep_start(request, pk):
    return _act(request, pk, lambda s: sweeps.start_sweep(request.user, s), "Trials started.")


@require_POST
@permission_required(VIEW, raise_exception=True)
def sweep_cancel(request, pk):
    return _act(request, pk, lambda s: sweeps.cancel_sweep(request.user, s), "Cancelling.")


@require_POST
@permission_required(PROPOSE, raise_exception=True)
def sweep_propose(request, pk):
    """The winner as a change pending review, with the sweep as its evidence."""
    sweep = get_object_or_404(Sweep.objects.select_related("deployment__active_config"), pk=pk)
    try:
        change = sweeps.propose_winner(request.user, sweep)
    except (SweepRefused, ChangeRefused) as exc:
        messages.error(request, str(exc))
        return redirect(sweep)
    messages.success(request, f"Change #{change.pk} proposes the winner: pending review.")
    return redirect(change)


urlpatterns = [
    path("", sweep_list, name="sweeps"),
    path("new/", sweep_new, name="sweep_new"),
    path("<int:pk>/", sweep_detail, name="sweep"),
    path("<int:pk>/part/", sweep_part, name="sweep_part"),
    path("<int:pk>/approve/", sweep_approve, name="sweep_approve"),
    path("<int:pk>/reject/", sweep_reject, name="sweep_reject"),
    path("<int:pk>/start/", sweep_start, name="sweep_start"),
    path("<int:pk>/cancel/", sweep_cancel, name="sweep_cancel"),
    path("<int:pk>/propose/", sweep_propose, name="sweep_propose"),
]
