"""API resources: benchmark runs. The history's list (its filters and sorts), starting and
cancelling a run as the pages do, its live timeline, and the panel's verdict of a run against
a baseline (the rule a change's verification uses)."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from api.base import TokenAuditMixin
from api.errors import Conflict
from api.serializers_runs import (
    THRESHOLD_PARAMS,
    RunDetailSerializer,
    RunListItemSerializer,
    RunStartSerializer,
    RunTimelineQuerySerializer,
    RunTimelineSerializer,
    RunVerdictQuerySerializer,
    RunVerdictSerializer,
)
from benchmarks.evidence import usable_as_evidence
from benchmarks.forms.history import HistoryForm
from benchmarks.models import BenchmarkRun
from benchmarks.services import export, history
from benchmarks.services import runs as services
from benchmarks.services.shards import shard_health
from benchmarks.services.timeline import BACKFILL_PAGE
from benchmarks.services.timeline import points_after as timeline_points
from changes import verdict
from changes.services import verification

# The history form's filters the list takes under the same names; ``profile_name`` is the
# form's ``profile`` (a name) since ``profile`` here is an id, and ``ordering`` its ``sort``.
FORM_FILTERS = (
    "q",
    "host",
    "gpu",
    "engine",
    "model",
    "config",
    "status",
    "requested_by",
    "source",
    "date_from",
    "date_to",
)
RENAMED = {"profile_name": "profile", "ordering": "sort"}
ID_FILTERS = {"deployment": "deployment_id", "profile": "load_profile_id"}
KNOWN_PARAMS = {*FORM_FILTERS, *RENAMED, *ID_FILTERS, "page", "page_size", "format"}
MAX_ID = 2**63 - 1  # the database's bigint: a larger "id" is a 400, not an overflow
# What a list row reads beyond the history page's columns.
LIST_EXTRA = ("finished_at", "load_profile", "engine_config")
# A run's detail never reads these: its page size, not its numbers.
DETAIL_DEFERRED = ("distributions", "stages", "server", "log")

LIST_PARAMETERS = [
    OpenApiParameter(name, OpenApiTypes.STR, description=text)
    for name, text in (
        ("q", "Label contains."),
        ("host", "Host id."),
        ("gpu", "GPU model (one whole name of a mixed host's list)."),
        ("engine", "vllm or sglang."),
        ("model", "Model name."),
        ("config", "Config version."),
        ("status", "queued, running, succeeded, failed or cancelled."),
        ("requested_by", "User id."),
        ("source", "Where the run came from (panel, loadgen, vllm-bench …)."),
        ("date_from", "Created on or after (YYYY-MM-DD)."),
        ("date_to", "Created on or before (YYYY-MM-DD)."),
        ("profile_name", "Load profile name (any version)."),
        ("ordering", "A history sort key: date, ttft_p95_ms …; '-' first for descending."),
    )
] + [
    OpenApiParameter("deployment", OpenApiTypes.INT, description="Deployment id."),
    OpenApiParameter("profile", OpenApiTypes.INT, description="Load profile (version) id."),
]


class RunViewSet(TokenAuditMixin, viewsets.GenericViewSet):
    """Benchmark runs: the pages' permissions, action by action."""

    queryset = BenchmarkRun.objects.all()
    serializer_class = RunDetailSerializer
    lookup_value_regex = r"[0-9]+"  # /runs/abc/ is a 404, not a database error
    permissions = {
        "list": "benchmarks.view_benchmarkrun",
        "retrieve": "benchmarks.view_benchmarkrun",
        "timeline": "benchmarks.view_benchmarkrun",
        "verdict": "benchmarks.view_benchmarkrun",
        "create": "benchmarks.add_benchmarkrun",
        "cancel": "benchmarks.change_benchmarkrun",
    }

    @extend_schema(parameters=LIST_PARAMETERS, responses=RunListItemSerializer(many=True))
    def list(self, request):
        """The history of runs, filtered and sorted as the history page does."""
        runs = self._filtered(request.query_params)
        page = self.paginate_queryset(runs)
        return self.get_paginated_response(RunListItemSerializer(page, many=True).data)

    @extend_schema(request=RunStartSerializer, responses={201: RunDetailSerializer})
    def create(self, request):
        """Start a run of ``profile`` on ``deployment`` with its active config (409 while
        the engine is busy)."""
        body = RunStartSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            run = services.start_benchmark(
                request.user,
                data["deployment"],
                data["profile"],
                label=data["label"],
                shards=data["shards"],
            )
        except services.RunRefused as exc:
            raise Conflict(str(exc)) from None
        location = request.build_absolute_uri(reverse("api:run-detail", args=[run.pk]))
        return Response(
            self._detail(run.pk), status=status.HTTP_201_CREATED, headers={"Location": location}
        )

    @extend_schema(responses=RunDetailSerializer)
    def retrieve(self, request, pk=None):
        return Response(self._detail(pk))

    @extend_schema(request=None, responses=RunDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel a queued run, or ask a running one to stop (409 when it has finished)."""
        run = get_object_or_404(BenchmarkRun, pk=pk)
        try:
            services.cancel_benchmark(request.user, run)
        except services.RunRefused as exc:
            raise Conflict(str(exc)) from None
        return Response(self._detail(pk))

    @extend_schema(parameters=[RunTimelineQuerySerializer], responses=RunTimelineSerializer)
    @action(detail=True, methods=["get"])
    def timeline(self, request, pk=None):
        """The run's per-second points after ``since``, a page at a time (``more``)."""
        query = RunTimelineQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        run = get_object_or_404(BenchmarkRun, pk=pk)
        points, more = timeline_points(
            run, since=query.validated_data["since"], limit=BACKFILL_PAGE
        )
        return Response(
            {
                "status": run.status,
                "finished": run.is_finished,
                "cancel_requested": run.cancel_requested,
                "progress": run.progress,
                "points": points,
                "more": more,
            }
        )

    @extend_schema(parameters=[RunVerdictQuerySerializer], responses=RunVerdictSerializer)
    @action(detail=True, methods=["get"])
    def verdict(self, request, pk=None):
        """The verdict on this run against ``baseline``, judged as a change's verification
        is (same numbers, conditions, noise bands and rule)."""
        query = RunVerdictQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        run = get_object_or_404(BenchmarkRun.objects.select_related("load_profile"), pk=pk)
        baseline = (
            BenchmarkRun.objects.select_related("load_profile")
            .filter(pk=query.validated_data["baseline"])
            .first()
        )
        if baseline is None:
            raise serializers.ValidationError({"baseline": ["No run has this id."]})
        for which in (baseline, run):
            if not which.is_finished:
                raise Conflict(f"{which} is {which.get_status_display().lower()}: no verdict yet.")
        limits = verdict.Thresholds(
            **{
                THRESHOLD_PARAMS[name]: value
                for name, value in query.validated_data.items()
                if name in THRESHOLD_PARAMS
            }
        )
        judged = verification.judge_runs(baseline, run, limits)
        judged.pop("regressed", None)
        return Response(
            {
                **judged,
                "text": verification.verdict_text(judged),
                "run": run.pk,
                "baseline": baseline.pk,
                "thresholds": {name: getattr(limits, f) for name, f in THRESHOLD_PARAMS.items()},
            }
        )

    def _filtered(self, params):
        """The history's runs for the query: its form validates the filters and sort (400
        naming the field otherwise); the ids filter on top."""
        unknown = sorted(set(params) - KNOWN_PARAMS)
        if unknown:
            raise serializers.ValidationError({name: ["Unknown filter."] for name in unknown})
        data = {name: params[name] for name in FORM_FILTERS if name in params}
        data.update({field: params[name] for name, field in RENAMED.items() if name in params})
        form = HistoryForm(data)
        ids, errors = {}, {}
        for name, column in ID_FILTERS.items():
            value = params.get(name, "").strip()
            if value:
                if value.isdigit() and int(value) <= MAX_ID:
                    ids[column] = int(value)
                else:
                    errors[name] = ["Enter a whole number (an id)."]
        if not form.is_valid():
            renamed = {form_name: api for api, form_name in RENAMED.items()}
            for name, messages in form.errors.items():
                errors[renamed.get(name, name)] = list(messages)
        if errors:
            raise serializers.ValidationError(errors)
        runs = history.filtered_runs(form.cleaned_data).filter(**ids)
        return runs.only(*history.LIST_FIELDS, *LIST_EXTRA)

    def _detail(self, pk) -> dict:
        run = get_object_or_404(
            BenchmarkRun.objects.select_related(
                "deployment__host", "load_profile", "engine_config", "requested_by"
            ).defer(*DETAIL_DEFERRED),
            pk=pk,
        )
        return RunDetailSerializer(detail(run)).data


def detail(run: BenchmarkRun) -> dict:
    """``RunDetailSerializer``'s fields of ``run``; ``results`` from the export's summary."""
    profile, config = run.load_profile, run.engine_config
    finished_with_results = run.is_finished and (run.completed is not None or run.summary)
    return {
        "id": run.pk,
        "status": run.status,
        "finished": run.is_finished,
        "cancel_requested": run.cancel_requested,
        "progress": run.progress,
        "label": run.label,
        "source": run.source,
        "deployment": run.deployment_id,
        "deployment_name": run.deployment.name,
        "host_name": run.deployment.host.name,
        "profile": run.load_profile_id,
        "profile_name": profile.name if profile else None,
        "profile_version": profile.version if profile else None,
        "config_version": config.version if config else None,
        "engine": run.engine,
        "engine_version": run.engine_version,
        "model_name": run.model_name,
        "requested_by": run.requested_by.get_username() if run.requested_by else None,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "error": run.error,
        "stopped_early": run.stopped_early,
        "notes": list(run.notes or []),
        "results": results(run) if finished_with_results else None,
        "shards": run.shards,
        "shard_health": shard_health(run) if run.shards > 1 else [],
        "client_limited": usable_as_evidence(run).to_dict(),
        "cost": run_cost(run),
        "links": {
            "page": run.get_absolute_url(),
            "timeline": reverse("api:run-timeline", args=[run.pk]),
            "export_json": reverse("benchmarks:export_json", args=[run.pk]),
            "export_csv": reverse("benchmarks:export_csv", args=[run.pk]),
        },
    }


def run_cost(run: BenchmarkRun) -> dict:
    """The run's own cost: priced once, when it finished, at its host's price of that moment
    (the GPUs it used); the cost page re-prices runs at today's prices and says so."""
    return {
        "priced": "when the run finished",
        "hourly_price": float(run.hourly_price) if run.hourly_price is not None else None,
        "currency": run.currency,
        "per_million_output": run.cost_per_million_output,
    }


def results(run: BenchmarkRun) -> dict:
    """The run's numbers as its exported result JSON names them (the summary part of
    ``export.export_document``, without the timeline it would read point by point)."""
    return export.summary(run, export.export_spec(run))


router = SimpleRouter()
router.register("runs", RunViewSet, basename="run")
urlpatterns = router.urls
