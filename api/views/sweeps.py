"""API resources: tuning sweeps. The list (by deployment and state), making one (through
``changes.services.sweeps.create_sweep``, its prediction queued at once), one sweep as its page
shows it, and the page's buttons as POST actions calling the same services.

The rules stay in ``changes.rules_sweeps``, checked by the services: a sweep takes the change
permissions (Viewers read, Operators make, start and cancel, Approvers review — never their
own), and the refusals come back as the changes API answers them: 409 for a state that does
not allow the action now (``SweepRefused``), 403 with the rule's own words for who may never
take it (``PermissionDenied``)."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db.models import Prefetch
from django.urls import reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from api.base import TokenAuditMixin
from api.errors import Conflict
from api.serializers_sweeps import (
    SweepCommentBodySerializer,
    SweepCreateSerializer,
    SweepDetailSerializer,
    SweepEmptyBodySerializer,
    SweepItemSerializer,
    SweepProposedChangeSerializer,
    SweepRequiredCommentSerializer,
    page_url,
)
from changes.choices import SweepState
from changes.models_sweeps import Sweep, SweepApproval, SweepLane, SweepTrial
from changes.rules import APPLY, APPROVE, PROPOSE, ChangeRefused
from changes.rules_sweeps import SweepRefused, allowed_actions
from changes.services import sweeps

VIEW = "changes.view_sweep"
# The list's query string: its filters, plus the pages of the answer.
LIST_PARAMS = {"deployment", "state", "page", "page_size", "format"}

ERRORS = {
    400: OpenApiResponse(description="Invalid body: problem details naming each field."),
    403: OpenApiResponse(description="Your role (or the rule) does not allow it."),
    404: OpenApiResponse(description="No such sweep."),
    409: OpenApiResponse(description="The sweep's state (or its deployments) refuses it now."),
}
ACTION_RESPONSES = {200: SweepDetailSerializer, **ERRORS}


class SweepListQuerySerializer(serializers.Serializer):
    deployment = serializers.IntegerField(required=False, help_text="A deployment's id.")
    state = serializers.ChoiceField(choices=SweepState.choices, required=False)


def _refusals(call):
    """Run a service call, answering its refusals as the changes API does."""
    try:
        return call()
    except (SweepRefused, ChangeRefused) as exc:
        raise Conflict(str(exc)) from None
    except PermissionDenied as exc:
        raise exceptions.PermissionDenied(str(exc) or None) from None


class SweepViewSet(TokenAuditMixin, viewsets.GenericViewSet):
    """Tuning sweeps: list, make, read, and act on them as the sweep page's buttons do."""

    # The change permissions, action by action (changes.rules_sweeps): cancelling is also the
    # author's, whom the rule lets through; the map only asks for the Operator's floor.
    permissions = {
        "list": VIEW,
        "retrieve": VIEW,
        "create": PROPOSE,
        "start": APPLY,
        "cancel": PROPOSE,
        "approve": APPROVE,
        "reject": APPROVE,
        "propose_winner": PROPOSE,
    }
    serializer_class = SweepDetailSerializer
    lookup_value_regex = r"\d+"  # /sweeps/abc/ is a 404, not a database error
    queryset = Sweep.objects.select_related(
        "deployment__host", "created_by", "load_profile", "base_config", "winner"
    ).prefetch_related(
        Prefetch("approvals", queryset=SweepApproval.objects.order_by("created_at", "pk")),
        Prefetch(
            "lanes",
            queryset=SweepLane.objects.select_related("deployment__host", "original_config"),
        ),
        Prefetch(
            "trials",
            queryset=SweepTrial.objects.select_related("lane", "config").prefetch_related("runs"),
        ),
    )

    # --- reading ---------------------------------------------------------------------------
    def detail_data(self, pk: int) -> dict:
        sweep = self.get_queryset().get(pk=pk)
        context = {
            "request": self.request,
            "progress": sweeps.progress(sweep),
            "actions": allowed_actions(self.request.user, sweep),
        }
        return SweepDetailSerializer(sweep, context=context).data

    @extend_schema(
        summary="Tuning sweeps, newest first",
        parameters=[SweepListQuerySerializer],
        responses={200: SweepItemSerializer(many=True), 400: ERRORS[400], 403: ERRORS[403]},
    )
    def list(self, request):
        unknown = sorted(set(request.query_params) - LIST_PARAMS)
        if unknown:
            raise exceptions.ValidationError({name: ["Unknown filter."] for name in unknown})
        query = SweepListQuerySerializer(
            data={k: v for k, v in request.query_params.items() if k in ("deployment", "state")}
        )
        query.is_valid(raise_exception=True)
        wanted = query.validated_data
        found = Sweep.objects.select_related("deployment__host", "created_by").prefetch_related(
            "approvals"
        )
        if "deployment" in wanted:
            found = found.filter(deployment_id=wanted["deployment"])
        if "state" in wanted:
            found = found.filter(state=wanted["state"])
        page = self.paginate_queryset(found.order_by("-created_at", "-pk"))
        return self.get_paginated_response(SweepItemSerializer(page, many=True).data)

    @extend_schema(
        summary="One sweep, as its page shows it",
        responses={200: SweepDetailSerializer, 403: ERRORS[403], 404: ERRORS[404]},
    )
    def retrieve(self, request, pk=None):
        return Response(self.detail_data(self.get_object().pk))

    # --- making one ------------------------------------------------------------------------
    @extend_schema(
        summary="Make a sweep (its prediction is queued at once; it touches nothing)",
        request=SweepCreateSerializer,
        responses={201: SweepDetailSerializer, 400: ERRORS[400], 403: ERRORS[403]},
    )
    def create(self, request):
        body = SweepCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            sweep = sweeps.create_sweep(
                request.user,
                data["deployment"],
                title=data["title"],
                profile=data["load_profile"],
                space=data["space"],
                slo=data["slo"],
                load_mode=data["load_mode"],
                objective=data["objective"],
                max_trials=data["max_trials"],
                max_minutes=data["max_minutes"],
                max_steps=data["max_steps"],
                twin_deployments=data["twins"],
            )
        except sweeps.SweepInvalid as exc:
            # Keyed by the body's own fields ("" is the sweep as a whole).
            raise exceptions.ValidationError(
                {(key or "non_field_errors"): [message] for key, message in exc.errors.items()}
            ) from None
        except PermissionDenied as exc:
            raise exceptions.PermissionDenied(str(exc) or None) from None
        return Response(
            self.detail_data(sweep.pk),
            status=status.HTTP_201_CREATED,
            headers={"Location": reverse("api:sweep-detail", args=[sweep.pk])},
        )

    # --- the buttons -----------------------------------------------------------------------
    def _act(self, request, verb, body_class, *args):
        sweep = self.get_object()
        body = body_class(data=request.data)
        body.is_valid(raise_exception=True)
        extra = [body.validated_data.get(name, "") for name in args]
        _refusals(lambda: verb(request.user, sweep, *extra))
        return Response(self.detail_data(sweep.pk))

    @extend_schema(
        summary="Approve the sweep as a whole (not your own: four eyes)",
        request=SweepCommentBodySerializer,
        responses=ACTION_RESPONSES,
    )
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        return self._act(
            request,
            lambda user, sweep, comment: sweeps.review_sweep(user, sweep, "approve", comment),
            SweepCommentBodySerializer,
            "comment",
        )

    @extend_schema(
        summary="Reject the sweep, saying why (it ends)",
        request=SweepRequiredCommentSerializer,
        responses=ACTION_RESPONSES,
    )
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        return self._act(
            request,
            lambda user, sweep, comment: sweeps.review_sweep(user, sweep, "reject", comment),
            SweepRequiredCommentSerializer,
            "comment",
        )

    @extend_schema(
        summary="Start the trials of a sweep ready to run (its deployments must be free)",
        request=SweepEmptyBodySerializer,
        responses=ACTION_RESPONSES,
    )
    @action(detail=True, methods=["post"])
    def start(self, request, pk=None):
        return self._act(request, sweeps.start_sweep, SweepEmptyBodySerializer)

    @extend_schema(
        summary="Cancel: before its trials it ends; while they run, every lane puts its "
        "deployment's original config back first",
        request=SweepEmptyBodySerializer,
        responses=ACTION_RESPONSES,
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        return self._act(request, sweeps.cancel_sweep, SweepEmptyBodySerializer)

    @extend_schema(
        summary="Propose the winner as a change of the deployment (reviewed like any other)",
        request=SweepEmptyBodySerializer,
        responses={201: SweepProposedChangeSerializer, **ERRORS},
    )
    @action(detail=True, methods=["post"], url_path="propose-winner")
    def propose_winner(self, request, pk=None):
        sweep = self.get_object()
        SweepEmptyBodySerializer(data=request.data).is_valid(raise_exception=True)
        change = _refusals(lambda: sweeps.propose_winner(request.user, sweep))
        location = reverse("api:change-detail", args=[change.pk])
        data = {
            "change_id": change.pk,
            "url": location,
            "page": page_url(change),
            "state": change.state,
        }
        return Response(
            SweepProposedChangeSerializer(data).data,
            status=status.HTTP_201_CREATED,
            headers={"Location": location},
        )


router = SimpleRouter()
router.register("sweeps", SweepViewSet, basename="sweep")
urlpatterns = router.urls
