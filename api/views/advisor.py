"""API resources: the advisor. A deployment's diagnosis (its active findings, when the rules
last ran and whether the engine could be read; ``?refresh=1`` runs them now), the fleet's
findings worst first, and dismissing one with a reason, as the Advisor sections do."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from django.urls import path
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.views import APIView

from api.base import TokenAuditMixin
from api.errors import Conflict
from api.serializers_advisor import (
    DiagnosisQuerySerializer,
    DiagnosisSerializer,
    DismissSerializer,
    FindingListQuerySerializer,
    FindingSerializer,
)
from changes.models_findings import Finding
from changes.services import diagnosis
from hosts.models import Deployment

# Reading findings is reading the deployment (the page that shows them asks the same).
READ = "hosts.view_deployment"
# Dismissing is an operator's judgement, as proposing a change is.
DISMISS = "changes.add_changerequest"
LIST_PARAMS = {"severity", "rule", "deployment", "include", "page", "page_size", "format"}

ERRORS = {
    400: OpenApiResponse(description="Invalid query or body: problem details naming each field."),
    403: OpenApiResponse(description="Your role does not allow it."),
    404: OpenApiResponse(description="No such deployment or finding."),
}


def findings_query():
    return Finding.objects.select_related("deployment__host", "dismissed_by")


def diagnosis_data(deployment: Deployment) -> dict:
    """``DiagnosisSerializer``'s fields of ``deployment``: its active findings worst first."""
    status = diagnosis.last_evaluation(deployment) or {}
    findings = list(findings_query().filter(deployment=deployment).active().worst_first())
    newest = max((f.last_seen_at for f in findings), default=None)
    return {
        "deployment": deployment.pk,
        "evaluated_at": status.get("evaluated_at"),
        "engine_status": status.get("engine_status") or "unknown",
        "engine_error": status.get("engine_error") or "",
        "freshness": diagnosis.freshness(status, newest_seen=newest).as_dict(),
        "findings": findings,
    }


class DiagnosisView(TokenAuditMixin, APIView):
    """``/deployments/{id}/diagnosis/``."""

    permissions = {"GET": READ}

    @extend_schema(
        summary="A deployment's active findings and its last evaluation",
        parameters=[DiagnosisQuerySerializer],
        responses={200: DiagnosisSerializer, **ERRORS},
    )
    def get(self, request, pk: int):
        query = DiagnosisQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        deployment = get_object_or_404(Deployment.objects.select_related("host"), pk=pk)
        if query.validated_data["refresh"]:
            diagnosis.refresh(deployment)
        return Response(DiagnosisSerializer(diagnosis_data(deployment)).data)


class FindingViewSet(TokenAuditMixin, viewsets.GenericViewSet):
    """The fleet's findings; dismissing one."""

    permissions = {"list": READ, "dismiss": DISMISS}
    serializer_class = FindingSerializer
    lookup_value_regex = r"[0-9]+"

    def get_queryset(self):
        return findings_query()

    @extend_schema(
        summary="Findings across the fleet, worst first (active ones unless ?include=)",
        parameters=[FindingListQuerySerializer],
        responses={200: FindingSerializer(many=True), 400: ERRORS[400], 403: ERRORS[403]},
    )
    def list(self, request):
        params = request.query_params
        unknown = sorted(set(params) - LIST_PARAMS)
        if unknown:
            raise serializers.ValidationError({name: ["Unknown filter."] for name in unknown})
        data = {k: params[k] for k in ("severity", "rule", "deployment") if params.get(k)}
        include = [v for item in params.getlist("include") for v in item.split(",") if v]
        if include:
            data["include"] = include
        query = FindingListQuerySerializer(data=data)
        query.is_valid(raise_exception=True)
        wanted = query.validated_data
        findings = findings_query()
        included = wanted.get("include") or set()
        if "cleared" not in included:
            findings = findings.filter(cleared_at__isnull=True)
        if "dismissed" not in included:
            findings = findings.filter(dismissed_at__isnull=True)
        for name, column in (("severity", "severity"), ("rule", "rule")):
            if name in wanted:
                findings = findings.filter(**{column: wanted[name]})
        if "deployment" in wanted:
            findings = findings.filter(deployment_id=wanted["deployment"])
        page = self.paginate_queryset(findings.worst_first())
        return self.get_paginated_response(FindingSerializer(page, many=True).data)

    @extend_schema(
        summary="Dismiss a finding with a reason (audited); it stays dismissed while seen",
        request=DismissSerializer,
        responses={
            200: FindingSerializer,
            **ERRORS,
            409: OpenApiResponse(description="The finding has cleared or is dismissed already."),
        },
    )
    @action(detail=True, methods=["post"])
    def dismiss(self, request, pk=None):
        body = DismissSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        finding = get_object_or_404(Finding, pk=pk)
        try:
            diagnosis.dismiss(request.user, finding, body.validated_data["reason"])
        except diagnosis.DismissRefused as exc:
            raise Conflict(str(exc)) from None
        return Response(FindingSerializer(findings_query().get(pk=finding.pk)).data)


router = SimpleRouter()
router.register("findings", FindingViewSet, basename="finding")
urlpatterns = [
    path("deployments/<int:pk>/diagnosis/", DiagnosisView.as_view(), name="deployment-diagnosis"),
    *router.urls,
]
