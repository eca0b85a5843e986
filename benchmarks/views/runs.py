"""Launching a benchmark, watching it live, cancelling it."""

from __future__ import annotations

import math
from functools import cache

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.functional import SimpleLazyObject
from django.utils.html import json_script
from django.views.decorators.http import require_POST

from benchmarks.evidence import usable_as_evidence
from benchmarks.forms.runs import RunForm
from benchmarks.models import RUN_DOCUMENTS, BenchmarkRun, LoadProfile, RunRequestLog
from benchmarks.services import runs as services
from benchmarks.services.results import (
    LATENCY_COLUMNS,
    error_causes,
    latency_rows,
    status_badge,
)
from benchmarks.services.runs import RunRefused
from benchmarks.services.shards import shard_health
from benchmarks.services.timeline import (
    BACKFILL_PAGE,
    points_after,
)
from hosts.credentials import SECRET_FIELDS

PARTS = {
    "results": "benchmarks/_run_results.html",
    "facts": "benchmarks/_run_facts.html",
    "shards": "benchmarks/_run_shards.html",
}


@permission_required("benchmarks.add_benchmarkrun", raise_exception=True)
def run_new(request):
    profile = None
    if pk := request.GET.get("profile", "").strip():
        profile = LoadProfile.objects.filter(pk=pk).first() if pk.isdigit() else None
    initial = {"load_profile": profile, "deployment": request.GET.get("deployment")}
    form = RunForm(request.POST or None, initial=initial, extra_profile=profile)
    if request.method == "POST" and form.is_valid():
        try:
            run = services.start_benchmark(
                request.user,
                form.cleaned_data["deployment"],
                form.cleaned_data["load_profile"],
                label=form.cleaned_data["label"],
                shards=form.cleaned_data["shards"],
            )
        except RunRefused as exc:
            form.add_error(None, str(exc))
        else:
            return redirect(run)
    return render(request, "benchmarks/run_new.html", {"form": form})


@permission_required("benchmarks.view_benchmarkrun", raise_exception=True)
def run_detail(request, pk):
    """A running run's page is read whole; a finished one's never changes, so its body is a
    shared part (pagecache): the view reads only the run's status and label, and the run, its
    documents, points, the previous run ... are read only when the part is rendered."""
    head = get_object_or_404(BenchmarkRun.objects.only("pk", "status", "label"), pk=pk)
    if not head.is_finished:
        run = _run(pk)  # all of it: the page is live and not shared
        points, _ = points_after(run)
        context = {**_context(run), "points": points, "title": str(run)}
        return render(request, "benchmarks/run_detail.html", context)
    full = cache(lambda: _run(pk))
    body = cache(lambda: _context(full()))
    points = cache(lambda: points_after(full())[0])
    context = {
        **{key: SimpleLazyObject(lambda key=key: body()[key]) for key in BODY_KEYS},
        "shared_page": True,
        "title": str(head),
        "run": SimpleLazyObject(lambda: _run(pk, documents=False)),
        "full_run": SimpleLazyObject(full),
        "points": SimpleLazyObject(points),
        "points_script": lambda: json_script(points(), "run-points"),
    }
    return render(request, "benchmarks/run_detail.html", context)


@permission_required("benchmarks.view_benchmarkrun", raise_exception=True)
def run_part(request, pk, part):
    """One fragment of the run page, re-fetched by htmx when the run's status changes."""
    if part not in PARTS:
        raise Http404("no such part")
    return render(request, PARTS[part], _context(_run(pk)))


@permission_required("benchmarks.view_benchmarkrun", raise_exception=True)
def run_timeline(request, pk):
    """Points after ``?since=`` (seconds on the run's clock), at most BACKFILL_PAGE of them:
    the live charts' backfill. ``more`` says to ask again from the last point's ``t``. The
    run's status comes along, so a page whose socket was down when the run ended learns it."""
    run = get_object_or_404(BenchmarkRun, pk=pk)
    try:
        since = float(request.GET.get("since", "-1"))
    except ValueError:
        return JsonResponse({"error": "since must be a number of seconds"}, status=400)
    if not math.isfinite(since):
        return JsonResponse({"error": "since must be a number of seconds"}, status=400)
    points, more = points_after(run, since=since, limit=BACKFILL_PAGE)
    badge = status_badge(run)
    return JsonResponse(
        {
            "status": run.status,
            "label": badge.label,
            "colour": badge.colour,
            "title": badge.title,
            "finished": run.is_finished,
            "cancel_requested": run.cancel_requested,
            "progress": run.progress,
            "points": points,
            "more": more,
        }
    )


@require_POST
@permission_required("benchmarks.change_benchmarkrun", raise_exception=True)
def run_cancel(request, pk):
    run = get_object_or_404(BenchmarkRun, pk=pk)
    try:
        services.cancel_benchmark(request.user, run)
    except RunRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.info(request, f"Cancelling {run}: requests in flight are aborted.")
    return redirect(run)


def _run(pk, documents: bool = True) -> BenchmarkRun:
    """The run with what its page names; without ``documents`` its JSON documents (but the
    load override the heading shows) stay in the database. Never the host's credentials."""
    runs = BenchmarkRun.objects.select_related(
        "deployment__host", "load_profile", "engine_config", "requested_by"
    ).defer(*(f"deployment__host__{name}" for name in SECRET_FIELDS))
    if not documents:
        runs = runs.defer(*(name for name in RUN_DOCUMENTS if name != "load_override"))
    return get_object_or_404(runs, pk=pk)


# What _context() gives the run page's body.
BODY_KEYS = (
    "previous",
    "stages",
    "server",
    "errors",
    "causes",
    "latencies",
    "latency_columns",
    "has_log",
    "shards",
    "evidence",
)


def _context(run: BenchmarkRun) -> dict:
    previous = (
        BenchmarkRun.objects.filter(
            deployment_id=run.deployment_id,
            load_profile__name=run.load_profile.name if run.load_profile else None,
            status="succeeded",
            created_at__lt=run.created_at,
        )
        .order_by("-created_at")
        .only("pk")
        .first()
        if run.load_profile
        else None
    )
    return {
        "run": run,
        "previous": previous,
        "stages": run.stages or {},
        "server": run.server or {},
        "errors": (run.summary or {}).get("errors_by_class") or {},
        "causes": error_causes(run),
        "latencies": latency_rows(run.summary),
        "latency_columns": [label for label, _ in LATENCY_COLUMNS],
        # exists(), not run.request_log: that would read the whole blob.
        "has_log": RunRequestLog.objects.filter(run=run).exists(),
        "shards": shard_health(run) if run.shards > 1 else [],
        "evidence": usable_as_evidence(run),
    }
