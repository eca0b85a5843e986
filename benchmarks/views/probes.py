"""Quality probe pages: probe sets (list, upload, items, JSONL download), starting and
watching a probe run, comparing two runs of one set, and quality against throughput across a
deployment's config versions.

Operators have no probe-specific permissions in ``controlpanel.roles``: starting a probe and
uploading a set ask for ``add_benchmarkrun`` (a probe is a measurement of the engine like a
benchmark, and holds it the same way), cancelling for ``change_benchmarkrun``; reading asks
for the probe models' own ``view_*`` permissions, which every role holds.
"""

from __future__ import annotations

import json
import math

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.core.paginator import Paginator
from django.db.models import Count, Max
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from benchmarks.models import BenchmarkRun
from benchmarks.models_quality import ProbeRun, ProbeSet
from benchmarks.quality.stats import wilson
from benchmarks.services import probes as services
from benchmarks.services.probes import ProbeRefused, ProbeSetInvalid
from controlpanel.choices import OperationStatus
from hosts.models import Deployment, EngineConfig

# See the module docstring: the closest role permissions (none exist for probes yet).
START_PERMISSION = "benchmarks.add_benchmarkrun"
CANCEL_PERMISSION = "benchmarks.change_benchmarkrun"
ITEMS_PER_PAGE = 50
MAX_ANSWER_CHARS = 2000  # the page shows an answer's start; the API has it whole


# --- forms (here, not in benchmarks/forms/: they serve these views only) -----------------------
class UploadForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Uploading an existing name adds a version.")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    file = forms.FileField(required=False, help_text="JSONL: one item per line.")
    jsonl = forms.CharField(
        required=False,
        label="Or paste the lines",
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false"}),
    )

    def clean(self):
        data = super().clean()
        if not data.get("file") and not (data.get("jsonl") or "").strip():
            raise forms.ValidationError("Choose a JSONL file or paste its lines.")
        return data

    def content(self) -> bytes:
        upload = self.cleaned_data.get("file")
        if upload is not None:
            if upload.size > services.MAX_UPLOAD_BYTES:
                # Refused before reading: the service would refuse it too, after the read.
                raise ProbeRefused(f"The file is over {services.MAX_UPLOAD_BYTES // 2**20} MiB.")
            return upload.read()
        return self.cleaned_data["jsonl"].encode()


class ProbeForm(forms.Form):
    deployment = forms.ModelChoiceField(Deployment.objects.select_related("host"))
    probe_set = forms.ModelChoiceField(
        ProbeSet.objects.latest().defer("items"), label="Probe set (newest versions)"
    )
    structured_output = forms.BooleanField(
        required=False,
        help_text="Ask JSON items with the engine's structured output (guided decoding).",
    )
    concurrency = forms.IntegerField(min_value=1, max_value=256, initial=8)
    label = forms.CharField(max_length=100, required=False)


# --- probe sets --------------------------------------------------------------------------------
@permission_required("benchmarks.view_probeset", raise_exception=True)
def probe_sets(request):
    _builtin_sets_present()
    sets = (
        ProbeSet.objects.latest()
        .defer("items")
        .annotate(run_count=Count("runs"))
        .select_related("created_by")
    )
    versions = dict(
        ProbeSet.objects.values_list("name").annotate(n=Max("version")).values_list("name", "n")
    )
    runs = ProbeRun.objects.select_related("deployment__host", "probe_set", "requested_by")
    context = {
        "sets": sets,
        "versions": versions,
        "runs": runs.order_by("-created_at")[:20],
        "default_name": settings.QUALITY_PROBE_SET,
    }
    return render(request, "benchmarks/probe_sets.html", context)


@permission_required(START_PERMISSION, raise_exception=True)
def probe_set_upload(request):
    form = UploadForm(request.POST or None, request.FILES or None)
    line_errors = []
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            probe_set = services.upload_set(
                request.user, data["name"], form.content(), data["description"]
            )
        except ProbeSetInvalid as exc:
            line_errors = exc.errors
            form.add_error(None, f"{len(exc.errors)} line(s) are not valid items: nothing saved.")
        except ProbeRefused as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(
                request, f"Probe set {probe_set} saved ({probe_set.item_count} items)."
            )
            return redirect(probe_set)
    context = {"form": form, "line_errors": line_errors}
    return render(request, "benchmarks/probe_set_upload.html", context)


@permission_required("benchmarks.view_probeset", raise_exception=True)
def probe_set(request, pk):
    probe_set = get_object_or_404(ProbeSet.objects.select_related("created_by"), pk=pk)
    if request.GET.get("download") == "jsonl":
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in probe_set.items)
        response = HttpResponse(text, content_type="application/x-ndjson; charset=utf-8")
        filename = f"{probe_set.name}-v{probe_set.version}.jsonl"
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
        return response
    category = request.GET.get("category", "")
    language = request.GET.get("language", "")
    items = [
        row
        for row in probe_set.items
        if (not category or row.get("category") == category)
        and (not language or row.get("language") == language)
    ]
    page = Paginator(items, ITEMS_PER_PAGE).get_page(request.GET.get("page"))
    context = {
        "set": probe_set,
        "coverage": _coverage_table(probe_set.coverage or {}),
        "page": page,
        "rows": [_item_row(row) for row in page],
        "category": category,
        "language": language,
        "versions": ProbeSet.objects.filter(name=probe_set.name).defer("items"),
        "runs": probe_set.runs.select_related("deployment").order_by("-created_at")[:10],
    }
    return render(request, "benchmarks/probe_set.html", context)


def _builtin_sets_present() -> None:
    """On a fresh install no built-in set is stored until a change is previewed (the
    service stores them on demand): store them before listing or offering sets. Only when
    none exists: bringing them up to date reads every file (a fifth of a second), which
    ``default_set`` does whenever a change needs the set."""
    if not ProbeSet.objects.filter(source="builtin").exists():
        services.sync_builtin_sets()


def _coverage_table(coverage: dict) -> dict:
    """``{"cat/lang": n}`` → rows of categories, columns of languages, with totals."""
    cells = {}
    for key, n in coverage.items():
        category, _, language = key.partition("/")
        cells[(category, language)] = n
    categories = sorted({c for c, _ in cells})
    languages = sorted({lang for _, lang in cells})
    rows = [
        {
            "category": c,
            "cells": [cells.get((c, lang), 0) for lang in languages],
            "total": sum(cells.get((c, lang), 0) for lang in languages),
        }
        for c in categories
    ]
    return {"languages": languages, "rows": rows}


def _item_row(row: dict) -> dict:
    prompt = row.get("prompt")
    if prompt is None:
        prompt = "\n".join(f"{m.get('role')}: {m.get('content')}" for m in row.get("messages", []))
    return {
        "id": row.get("id"),
        "category": row.get("category"),
        "language": row.get("language"),
        "prompt": prompt,
        "answer": json.dumps(row.get("answer"), ensure_ascii=False),
    }


# --- one probe run -----------------------------------------------------------------------------
@permission_required(START_PERMISSION, raise_exception=True)
def probe_new(request):
    _builtin_sets_present()
    initial = {"concurrency": 8, "deployment": _id(request.GET.get("deployment"))}
    default = ProbeSet.objects.filter(name=settings.QUALITY_PROBE_SET).order_by("-version")
    initial["probe_set"] = (
        _id(request.GET.get("set")) or default.values_list("pk", flat=True).first()
    )
    form = ProbeForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            run = services.start_probe(
                request.user,
                data["deployment"],
                data["probe_set"],
                structured_output=data["structured_output"],
                concurrency=data["concurrency"],
                label=data["label"],
            )
        except ProbeRefused as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Probe #{run.pk} queued.")
            return redirect(run)
    return render(request, "benchmarks/probe_new.html", {"form": form})


@permission_required("benchmarks.view_proberun", raise_exception=True)
def probe_run(request, pk):
    return render(request, "benchmarks/probe_run.html", _run_context(request, _run(pk)))


@permission_required("benchmarks.view_proberun", raise_exception=True)
def probe_run_part(request, pk):
    """The live fragment of the run page (progress, accuracy, answers), re-fetched by htmx on
    each ``probe.updated`` event."""
    return render(request, "benchmarks/_probe_run_body.html", _run_context(request, _run(pk)))


@require_POST
@permission_required(CANCEL_PERMISSION, raise_exception=True)
def probe_cancel(request, pk):
    run = get_object_or_404(ProbeRun, pk=pk)
    try:
        services.cancel_probe(request.user, run)
    except ProbeRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.info(request, f"Cancelling probe #{run.pk}.")
    return redirect(run)


def _run(pk) -> ProbeRun:
    return get_object_or_404(
        ProbeRun.objects.select_related(
            "deployment__host", "probe_set", "engine_config", "requested_by"
        ).defer("probe_set__items"),
        pk=pk,
    )


def _run_context(request, run: ProbeRun) -> dict:
    summary = run.summary or {}
    wrong = request.GET.get("wrong") == "1"
    results = run.results.all()
    if wrong:
        results = results.exclude(correct=True)
    page = Paginator(results, ITEMS_PER_PAGE).get_page(request.GET.get("page"))
    return {
        "run": run,
        "percent": int(100 * run.done / run.total) if run.total else 0,
        "table": accuracy_rows(summary),
        "overall": _cell(summary.get("overall")),
        "json": summary.get("json"),
        "page": page,
        "wrong": wrong,
        "max_answer": MAX_ANSWER_CHARS,
        "query": request.GET.urlencode(),
    }


def accuracy_rows(summary: dict) -> dict:
    """The run's ``category/language`` cells as rows × columns, each with its Wilson 95 %
    interval; category and language totals on the margins."""
    crossed = {k: v for k, v in summary.items() if k.count("/") == 1}
    categories = sorted({k.split("/")[0] for k in crossed})
    languages = sorted({k.split("/")[1] for k in crossed})
    rows = [
        {
            "category": c,
            "cells": [_cell(crossed.get(f"{c}/{lang}")) for lang in languages],
            "total": _cell(summary.get(c)),
        }
        for c in categories
    ]
    totals = [_cell(summary.get(lang)) for lang in languages]
    return {"languages": languages, "rows": rows, "totals": totals}


def _cell(data: dict | None) -> dict | None:
    if not data or not data.get("n"):
        return None
    low, high = wilson(data["correct"], data["n"])
    return {**data, "low": low, "high": high}


# --- comparing two runs ------------------------------------------------------------------------
@permission_required("benchmarks.view_proberun", raise_exception=True)
def probe_compare(request, a, b):
    baseline, candidate = _run(a), _run(b)
    max_loss, problem = _max_loss(request.GET.get("max_loss"))
    result = None
    if problem is None:
        try:
            result = services.compare_runs(baseline, candidate, max_loss=max_loss)
        except ProbeRefused as exc:
            problem = str(exc)
    context = {
        "baseline": baseline,
        "candidate": candidate,
        "result": result,
        "problem": problem,
        "max_loss": max_loss,
        "unfinished": [r for r in (baseline, candidate) if r.status != OperationStatus.SUCCEEDED],
    }
    return render(request, "benchmarks/probe_compare.html", context, status=400 if problem else 200)


def _max_loss(raw: str | None) -> tuple[float, str | None]:
    if raw in (None, ""):
        return 0.01, None
    try:
        value = float(raw)
    except ValueError:
        return 0.01, "max_loss must be a number (0.01 = one point)."
    if not math.isfinite(value) or not 0 <= value <= 1:
        return 0.01, "max_loss must be between 0 and 1 (0.01 = one point)."
    return value, None


# --- quality against throughput ----------------------------------------------------------------
@permission_required("benchmarks.view_proberun", raise_exception=True)
def quality(request):
    deployments = Deployment.objects.select_related("host").order_by("host__name", "name")
    deployment = None
    if pk := _id(request.GET.get("deployment")):
        deployment = Deployment.objects.filter(pk=pk).select_related("host").first()
        if deployment is None:
            raise Http404("no such deployment")
    points = quality_points(deployment) if deployment else []
    figure = quality_figure(points) if any(p["plotted"] for p in points) else None
    context = {
        "deployments": deployments,
        "deployment": deployment,
        "points": points,
        "figure": figure,
        "set_name": settings.QUALITY_PROBE_SET,
    }
    return render(request, "benchmarks/probe_quality.html", context)


def quality_points(deployment: Deployment) -> list[dict]:
    """One row per config version of ``deployment``: the output tok/s of its newest successful
    benchmark and the accuracy of its newest successful probe of the default set (any version
    of it, named in the hover text)."""
    rows = []
    configs = EngineConfig.objects.filter(deployment=deployment).order_by("version")
    for config in configs:
        bench = (
            BenchmarkRun.objects.filter(
                engine_config=config, status="succeeded", output_tokens_per_s__isnull=False
            )
            .order_by("-created_at")
            .only("pk", "output_tokens_per_s", "label", "created_at")
            .first()
        )
        probe = (
            ProbeRun.objects.filter(
                engine_config=config,
                status=OperationStatus.SUCCEEDED,
                probe_set__name=settings.QUALITY_PROBE_SET,
            )
            .select_related("probe_set")
            .defer("probe_set__items")
            .order_by("-created_at")
            .first()
        )
        accuracy = probe.accuracy if probe else None
        rows.append(
            {
                "config": config,
                "bench": bench,
                "probe": probe,
                "accuracy": accuracy,
                "plotted": bench is not None and accuracy is not None,
            }
        )
    return rows


def quality_figure(points: list[dict]) -> dict:
    """A plotly scatter: real engines as circles, simulated ones as open diamonds."""
    traces = []
    for simulated in (False, True):
        chosen = [p for p in points if p["plotted"] and p["probe"].simulated == simulated]
        if not chosen:
            continue
        traces.append(
            {
                "type": "scatter",
                "mode": "markers+text",
                "name": "simulated engine" if simulated else "config version",
                "x": [p["bench"].output_tokens_per_s for p in chosen],
                "y": [p["accuracy"] * 100 for p in chosen],
                "text": [f"v{p['config'].version}" for p in chosen],
                "textposition": "top center",
                "hovertext": [_hover(p) for p in chosen],
                "hoverinfo": "text",
                "marker": {
                    "size": 12,
                    "symbol": "diamond-open" if simulated else "circle",
                    "color": "#9333ea" if simulated else "#2563eb",
                },
            }
        )
    return {
        "data": traces,
        "layout": {
            "title": {"text": "Quality against throughput, per config version"},
            "xaxis": {
                "title": {"text": "output tokens/s (newest benchmark)"},
                "rangemode": "tozero",
            },
            "yaxis": {"title": {"text": "accuracy % (newest probe)"}},
            "margin": {"l": 60, "r": 20, "t": 40, "b": 60},
            "height": 420,
        },
    }


def _hover(point: dict) -> str:
    config, bench, probe = point["config"], point["bench"], point["probe"]
    low, high = wilson(probe.summary["overall"]["correct"], max(1, probe.summary["overall"]["n"]))
    text = (
        f"config v{config.version}{' — ' + config.note if config.note else ''}<br>"
        f"{bench.output_tokens_per_s:,.0f} tok/s (run #{bench.pk})<br>"
        f"accuracy {point['accuracy']:.1%} [{low:.1%}, {high:.1%}] "
        f"(probe #{probe.pk}, {probe.probe_set})"
    )
    return text + ("<br>simulated engine" if probe.simulated else "")


def _id(raw) -> int | None:
    raw = (raw or "").strip() if isinstance(raw, str) else raw
    return int(raw) if isinstance(raw, str) and raw.isdigit() and len(raw) < 18 else None
