"""The history of runs, comparing runs, exporting one and importing a result from elsewhere."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import permission_required
from django.core.paginator import Paginator
from django.http import HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.functional import SimpleLazyObject

from benchmarks.forms.history import HistoryForm, RunImportForm
from benchmarks.models import BenchmarkRun, ImportJob, RunRequestLog
from benchmarks.services import compare as comparing
from benchmarks.services import export, history
from benchmarks.services.imports import start_import


@permission_required("benchmarks.view_benchmarkrun", raise_exception=True)
def run_list(request):
    form = HistoryForm(request.GET)
    if not form.is_valid():
        return render(request, "benchmarks/run_list.html", {"form": form, "page": None}, status=400)
    runs = history.filtered_runs(form.cleaned_data)
    # Read lazily: the template shares the rendered list between viewers (pagecache), and a
    # list taken from there runs none of its queries.
    page = SimpleLazyObject(
        lambda: Paginator(runs, form.cleaned_data["per_page"]).get_page(request.GET.get("page"))
    )
    query = request.GET.copy()
    query.pop("page", None)
    sorts = history.sort_links(form.cleaned_data["sort"], request.GET)
    context = {
        "form": form,
        "page": page,
        "query": query.urlencode(),
        "sorts": sorts,
        "columns": history.columns(sorts),
    }
    return render(request, "benchmarks/run_list.html", context)


@permission_required("benchmarks.view_benchmarkrun", raise_exception=True)
def compare(request):
    try:
        runs = comparing.runs_to_compare(request.GET.getlist("runs"))
        ref = comparing.reference_index(runs, request.GET.get("ref"))
    except comparing.CompareRefused as exc:
        return render(request, "benchmarks/compare.html", {"refused": str(exc)}, status=400)
    return render(request, "benchmarks/compare.html", comparing.compare(runs, ref))


@permission_required("benchmarks.add_benchmarkrun", raise_exception=True)
def run_import(request):
    """Upload a result file: it is saved and read in the background; the job's page follows."""
    form = RunImportForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        job = start_import(
            request.user,
            data["file"],
            data["deployment"],
            data["engine_config"],
            data["label"],
            benchmark=data["benchmark"],
        )
        return redirect(job)
    status = 400 if form.is_bound else 200
    return render(request, "benchmarks/run_import.html", {"form": form}, status=status)


@permission_required("benchmarks.add_benchmarkrun", raise_exception=True)
def import_job(request, pk):
    """An import's progress, then the run it made or why there is none."""
    job = get_object_or_404(ImportJob.objects.select_related("deployment__host", "run"), pk=pk)
    return render(request, "benchmarks/import_job.html", {"job": job})


@permission_required("benchmarks.add_benchmarkrun", raise_exception=True)
def import_job_progress(request, pk):
    """The job's progress fragment, polled by htmx while the job is not finished."""
    job = get_object_or_404(ImportJob.objects.select_related("run"), pk=pk)
    return render(request, "benchmarks/_import_progress.html", {"job": job})


@permission_required("benchmarks.view_benchmarkrun", raise_exception=True)
def export_json(request, pk):
    run = get_object_or_404(BenchmarkRun.objects.select_related(*comparing.COMPARE_SELECT), pk=pk)
    body = json.dumps(export.export_document(run), indent=1, default=str)
    response = HttpResponse(body, content_type="application/json")
    response["Content-Disposition"] = (
        f'attachment; filename="{export.export_filename(run, ".json")}"'
    )
    return response


@permission_required("benchmarks.view_benchmarkrun", raise_exception=True)
def export_csv(request, pk):
    run = get_object_or_404(BenchmarkRun.objects.only("pk", "label"), pk=pk)
    blob = RunRequestLog.objects.filter(run_id=pk).values_list("data", flat=True).first()
    if blob is None:
        return render(request, "benchmarks/no_request_log.html", {"run": run}, status=404)
    response = StreamingHttpResponse(export.request_csv(bytes(blob)), content_type="text/csv")
    response["Content-Disposition"] = (
        f'attachment; filename="{export.export_filename(run, "-requests.csv")}"'
    )
    return response
