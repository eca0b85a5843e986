"""API resources: quality probes. Probe sets (list, one with its items, upload as the next
version of a name) and probe runs (list, start as the page does, one with its answers, cancel,
and the comparison of a run against a baseline run of the same set version).

Permissions are the pages': reading asks for the probe models' ``view_*``; starting a probe
and uploading a set ``benchmarks.add_benchmarkrun``, cancelling
``benchmarks.change_benchmarkrun`` (the roles have no probe-specific permissions)."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from api.base import TokenAuditMixin
from api.errors import Conflict
from api.parsers import UserJSONParser
from api.serializers_quality import (
    ProbeCompareQuerySerializer,
    ProbeComparisonSerializer,
    ProbeDetailQuerySerializer,
    ProbeRunDetailSerializer,
    ProbeRunSerializer,
    ProbeSetDetailSerializer,
    ProbeSetSerializer,
    ProbeSetUploadSerializer,
    ProbeStartSerializer,
)
from benchmarks.models_quality import ProbeRun, ProbeSet
from benchmarks.services import probes as services
from controlpanel.choices import OperationStatus

START = "benchmarks.add_benchmarkrun"
MAX_ID = 2**63 - 1  # the database's bigint: a larger id is a 400, not an overflow
LIST_PARAMS = {"deployment", "set", "status", "page", "page_size", "format"}


def _ids(params, names: dict[str, str]) -> dict:
    """``?deployment=3`` → ``{"deployment_id": 3}``; a value that is not an id is a 400."""
    out, errors = {}, {}
    for name, column in names.items():
        value = params.get(name, "").strip()
        if not value:
            continue
        if value.isdigit() and int(value) <= MAX_ID:
            out[column] = int(value)
        else:
            errors[name] = ["Enter a whole number (an id)."]
    if errors:
        raise serializers.ValidationError(errors)
    return out


class ProbeRunViewSet(TokenAuditMixin, viewsets.GenericViewSet):
    """Quality probe runs: the pages' permissions, action by action."""

    queryset = ProbeRun.objects.all()
    serializer_class = ProbeRunDetailSerializer
    lookup_value_regex = r"[0-9]+"
    permissions = {
        "list": "benchmarks.view_proberun",
        "retrieve": "benchmarks.view_proberun",
        "compare": "benchmarks.view_proberun",
        "create": START,
        "cancel": "benchmarks.change_benchmarkrun",
    }

    @extend_schema(
        parameters=[
            OpenApiParameter("deployment", OpenApiTypes.INT, description="Deployment id."),
            OpenApiParameter("set", OpenApiTypes.INT, description="Probe set (version) id."),
            OpenApiParameter(
                "status",
                OpenApiTypes.STR,
                enum=list(OperationStatus.values),
                description="queued, running, succeeded, failed or cancelled.",
            ),
        ],
        responses=ProbeRunSerializer(many=True),
    )
    def list(self, request):
        """Probe runs, newest first."""
        params = request.query_params
        unknown = sorted(set(params) - LIST_PARAMS)
        if unknown:
            raise serializers.ValidationError({name: ["Unknown filter."] for name in unknown})
        filters = _ids(params, {"deployment": "deployment_id", "set": "probe_set_id"})
        if wanted := params.get("status", "").strip():
            if wanted not in OperationStatus.values:
                raise serializers.ValidationError(
                    {"status": [f"One of {', '.join(OperationStatus.values)}."]}
                )
            filters["status"] = wanted
        runs = (
            ProbeRun.objects.filter(**filters)
            .select_related("deployment", "probe_set", "engine_config")
            .defer("probe_set__items", "log")
            .order_by("-created_at", "-pk")
        )
        page = self.paginate_queryset(runs)
        return self.get_paginated_response(ProbeRunSerializer(page, many=True).data)

    @extend_schema(request=ProbeStartSerializer, responses={201: ProbeRunDetailSerializer})
    def create(self, request):
        """Queue a probe of ``deployment`` with ``probe_set`` on its active config (409 while
        the engine is busy: a benchmark, a change, another probe)."""
        body = ProbeStartSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            run = services.start_probe(
                request.user,
                data["deployment"],
                data["probe_set"],
                structured_output=data["structured_output"],
                concurrency=data["concurrency"],
                seed=data["seed"],
                label=data["label"],
            )
        except services.ProbeRefused as exc:
            raise Conflict(str(exc)) from None
        location = request.build_absolute_uri(reverse("api:probe-detail", args=[run.pk]))
        return Response(
            self._detail(run.pk, {}), status=status.HTTP_201_CREATED, headers={"Location": location}
        )

    @extend_schema(parameters=[ProbeDetailQuerySerializer], responses=ProbeRunDetailSerializer)
    def retrieve(self, request, pk=None):
        """One probe run: status, progress, summary, and its answers ``RESULTS_PAGE`` at a
        time from ``results_offset`` (only the wrong ones with ``wrong=true``)."""
        query = ProbeDetailQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(self._detail(pk, query.validated_data))

    @extend_schema(request=None, responses=ProbeRunDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel a queued probe, or ask a running one to stop (409 when it has finished)."""
        run = get_object_or_404(ProbeRun, pk=pk)
        try:
            services.cancel_probe(request.user, run)
        except services.ProbeRefused as exc:
            raise Conflict(str(exc)) from None
        return Response(self._detail(pk, {}))

    @extend_schema(parameters=[ProbeCompareQuerySerializer], responses=ProbeComparisonSerializer)
    @action(detail=True, methods=["get"])
    def compare(self, request, pk=None):
        """This run (the candidate) against ``baseline``, item by item: the verdict with its
        reason, every group's accuracies, loss interval and McNemar p, the changed items.
        400 when the two asked different set versions."""
        query = ProbeCompareQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        candidate = get_object_or_404(ProbeRun.objects.select_related("probe_set"), pk=pk)
        baseline = (
            ProbeRun.objects.select_related("probe_set")
            .filter(pk=query.validated_data["baseline"])
            .first()
        )
        if baseline is None:
            raise serializers.ValidationError({"baseline": ["No probe run has this id."]})
        try:
            result = services.compare_runs(
                baseline, candidate, max_loss=query.validated_data["max_loss"]
            )
        except services.ProbeRefused as exc:
            raise serializers.ValidationError({"baseline": [str(exc)]}) from None
        return Response(ProbeComparisonSerializer(result).data)

    def _detail(self, pk, query: dict) -> dict:
        run = get_object_or_404(
            ProbeRun.objects.select_related(
                "deployment", "probe_set", "engine_config", "requested_by"
            ).defer("probe_set__items"),
            pk=pk,
        )
        return ProbeRunDetailSerializer(run, context={"results_query": query}).data


class ProbeSetViewSet(TokenAuditMixin, viewsets.GenericViewSet):
    """Probe sets, every version: the list without items, one version with them."""

    queryset = ProbeSet.objects.all()
    serializer_class = ProbeSetDetailSerializer
    lookup_value_regex = r"[0-9]+"
    # JSON ({"jsonl": "..."}) or a file upload: both reach the same service.
    parser_classes = [UserJSONParser, MultiPartParser, FormParser]
    permissions = {
        "list": "benchmarks.view_probeset",
        "retrieve": "benchmarks.view_probeset",
        "create": START,
    }

    @extend_schema(
        parameters=[OpenApiParameter("name", OpenApiTypes.STR, description="Set name.")],
        responses=ProbeSetSerializer(many=True),
    )
    def list(self, request):
        sets = ProbeSet.objects.defer("items").select_related("created_by")
        if name := request.query_params.get("name", "").strip():
            sets = sets.filter(name=name)
        page = self.paginate_queryset(sets.order_by("name", "-version"))
        return self.get_paginated_response(ProbeSetSerializer(page, many=True).data)

    @extend_schema(responses=ProbeSetDetailSerializer)
    def retrieve(self, request, pk=None):
        probe_set = get_object_or_404(ProbeSet.objects.select_related("created_by"), pk=pk)
        return Response(ProbeSetDetailSerializer(probe_set).data)

    @extend_schema(request=ProbeSetUploadSerializer, responses={201: ProbeSetDetailSerializer})
    def create(self, request):
        """Store the items as the next version of ``name`` (version 1 for a new name); a
        400 lists every bad line as "line N: why" under ``jsonl`` (or ``file``)."""
        body = ProbeSetUploadSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        field = "file" if data.get("file") else "jsonl"
        if data.get("file"):
            upload = data["file"]
            if upload.size > services.MAX_UPLOAD_BYTES:
                raise serializers.ValidationError(
                    {"file": [f"Over {services.MAX_UPLOAD_BYTES // 2**20} MiB."]}
                )
            content = upload.read()
        else:
            content = data["jsonl"].encode()
        try:
            probe_set = services.upload_set(
                request.user, data["name"], content, data["description"]
            )
        except services.ProbeSetInvalid as exc:
            lines = [f"line {line}: {message}" for line, message in exc.errors]
            raise serializers.ValidationError({field: lines}) from None
        except services.ProbeRefused as exc:
            raise serializers.ValidationError({field: [str(exc)]}) from None
        location = request.build_absolute_uri(reverse("api:probe-set-detail", args=[probe_set.pk]))
        return Response(
            ProbeSetDetailSerializer(probe_set).data,
            status=status.HTTP_201_CREATED,
            headers={"Location": location},
        )


router = SimpleRouter()
router.register("quality-probes", ProbeRunViewSet, basename="probe")
router.register("probe-sets", ProbeSetViewSet, basename="probe-set")
urlpatterns = router.urls
