"""A deployment's scaling picture: ``GET /api/v1/deployments/{id}/scaling/``. Read under the
deployments' own permission; the numbers are ``scaling.services.state``'s, the same the
Scaling page and ``/metrics`` show."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import MethodNotAllowed
from rest_framework.response import Response
from rest_framework.views import APIView

from api.base import TokenAuditMixin
from api.serializers_scaling import ScalingSerializer
from hosts.models import Deployment
from scaling.services.state import ScalingState, scaling_state


class ScalingView(TokenAuditMixin, APIView):
    """Signals, capacity at the SLO (with the run it came from), desired replicas, scaler
    thresholds, policy, engine start and the export downloads of one deployment."""

    permissions = {"GET": "hosts.view_deployment"}

    def check_permissions(self, request):
        # A write is 405 for anyone signed in (there is nothing to write), as on the other
        # read-only resources; the permission map refuses everything else it does not name.
        signed_in = request.user and request.user.is_authenticated
        if signed_in and request.method not in ("GET", "HEAD", "OPTIONS"):
            raise MethodNotAllowed(request.method)
        super().check_permissions(request)

    @extend_schema(
        summary="A deployment's scaling: signals, capacity, desired replicas, thresholds",
        responses=ScalingSerializer,
    )
    def get(self, request, id: int):
        deployment = get_object_or_404(Deployment.objects.select_related("host"), pk=id)
        return Response(ScalingSerializer(answer(scaling_state(deployment))).data)


def answer(state: ScalingState) -> dict:
    data = state.as_dict()
    capacity = dict(data["capacity"])
    for key in ("best", "breach"):
        if capacity.get(key) is not None:
            capacity[key] = _point(capacity[key])
    capacity.update(
        profile_id=state.profile_id,
        profile=state.profile,
        points=state.evidence_points,
        refused_runs=[
            {"run_id": pk, "run_url": reverse("benchmarks:detail", args=[pk]), "reason": why}
            for pk, why in state.refused_runs
        ],
    )
    decision = {k: v for k, v in data["decision"].items() if k != "thresholds"}
    pk = state.deployment_id

    def export(kind: str) -> str:
        return reverse("scaling:export", kwargs={"pk": pk, "kind": kind})

    return {
        "deployment": pk,
        "deployment_name": state.deployment,
        "host_name": state.host,
        "model": state.model,
        "engine": state.engine,
        "status": state.status,
        "signals": data["signals"],
        "signals_age_s": state.signals_age_s,
        "signals_note": state.signals_note,
        "capacity": capacity,
        "decision": decision,
        "thresholds": data["decision"]["thresholds"],
        "policy": {"saved": state.policy_saved, "slo": data["slo"], **data["policy"]},
        "engine_start": {"seconds": state.engine_start_s, "basis": state.engine_start_basis},
        "group": {"model": state.model, "engine": state.engine, "deployments": state.group},
        "links": {
            "page": reverse("scaling:deployment", args=[pk]),
            "keda": export("keda.yaml"),
            "alerts": export("alerts.yaml"),
            "grafana": export("grafana.json"),
        },
    }


def _point(point: dict) -> dict:
    run, sweep = point.get("run_id"), point.get("sweep_id")
    return {
        **point,
        "run_url": reverse("benchmarks:detail", args=[run]) if run else None,
        "sweep_url": reverse("changes:sweep", args=[sweep]) if sweep else None,
    }


urlpatterns = [
    path("deployments/<int:id>/scaling/", ScalingView.as_view(), name="deployment-scaling"),
]
