"""The fleet, read: hosts, deployments and their config history, load profiles, prices and the
audit log. Each asks for the permission its page asks for and reads through the page's own
helpers (the config history's diffs, the price list's rows, the audit log's filter form)."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import IntegrityError
from django.db.models import Prefetch
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import MethodNotAllowed, PermissionDenied, ValidationError
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from api import serializers_deployments as sd
from api import serializers_fleet as s
from api.base import TokenAuditMixin
from api.errors import Conflict
from benchmarks.loadgen.spec import SpecError
from benchmarks.models import LoadProfile, Price
from benchmarks.services import profiles as profile_services
from benchmarks.services.prices import price_rows
from changes.choices import ChangeKind
from changes.models import ChangeRequest
from changes.services.apply import lock_holder
from changes.services.facts import configs_with_diffs
from controlpanel import services as audit_services
from controlpanel.forms import AuditFilterForm
from controlpanel.models import AuditEntry
from hosts.choices import EngineKind, HostStatus, OperationKind
from hosts.models import LABEL_KEY, Deployment, EngineConfig, EngineOperation, Gpu, Host
from hosts.services import deployment_review as review
from hosts.services import deployments as deployment_services
from hosts.services import fleet_list


def _param(name: str, description: str, enum=None) -> OpenApiParameter:
    return OpenApiParameter(name, OpenApiTypes.STR, description=description, enum=enum)


def _choice(request, name: str, choices) -> str | None:
    """``?name=`` if given; a value outside ``choices`` is a 400 naming the parameter (a typo
    must not read as "nothing matches")."""
    value = request.query_params.get(name)
    if value in (None, ""):
        return None
    if value not in choices:
        raise ValidationError({name: [f"{value!r} is not one of: {', '.join(choices)}."]})
    return value


def _label_filter(queryset, terms: list[str]):
    """``?label=key`` (has the label) or ``?label=key=value``; several are all required
    (the hosts list's rule: ``hosts.services.fleet_list.with_labels``)."""
    labels = []
    for term in terms:
        key, eq, value = term.partition("=")
        if not LABEL_KEY.match(key):
            raise ValidationError({"label": [f"{key!r} is not a label key (key or key=value)."]})
        labels.append((key, value if eq else None))
    return fleet_list.with_labels(queryset, labels)


class ReadViewSet(TokenAuditMixin, viewsets.ReadOnlyModelViewSet):
    """List and detail, both under the page's view permission (``permission``)."""

    permission = ""

    @property
    def permissions(self) -> dict:
        return {"list": self.permission, "retrieve": self.permission}

    def check_permissions(self, request):
        # A write to a read-only resource is 405 for anyone signed in (there is no such
        # action to allow); the permission map still refuses everything else it does not name.
        signed_in = request.user and request.user.is_authenticated
        if signed_in and self.action is None and request.method != "OPTIONS":
            raise MethodNotAllowed(request.method)
        super().check_permissions(request)


# --- hosts -------------------------------------------------------------------------------------
@extend_schema_view(
    list=extend_schema(
        summary="Hosts",
        parameters=[
            _param("label", "key or key=value; repeat to require several"),
            _param("status", "Host status", enum=HostStatus.values),
            _param("gpu", "GPU model contains, e.g. H100"),
            _param("q", "Name contains"),
        ],
    ),
    retrieve=extend_schema(summary="A host with its GPUs, latest telemetry and deployments"),
)
class HostViewSet(ReadViewSet):
    """The fleet's GPU servers. Credentials are never part of an answer."""

    permission = "hosts.view_host"

    def get_serializer_class(self):
        return s.HostDetailSerializer if self.action == "retrieve" else s.HostSerializer

    def get_queryset(self):
        hosts = Host.objects.prefetch_related(
            Prefetch("gpus", queryset=Gpu.objects.order_by("index")),
            Prefetch("deployments", queryset=Deployment.objects.order_by("name")),
        ).order_by("name")
        if self.action != "list":
            return hosts
        query = self.request.query_params
        hosts = _label_filter(hosts, query.getlist("label"))
        status = _choice(self.request, "status", HostStatus.values)
        if status:
            hosts = hosts.filter(status=status)
        if query.get("gpu"):
            hosts = hosts.filter(gpus__name__icontains=query["gpu"]).distinct()
        if query.get("q"):
            hosts = hosts.filter(name__icontains=query["q"])
        return hosts


# --- deployments and their config history ------------------------------------------------------
@extend_schema_view(
    list=extend_schema(
        summary="Deployments",
        parameters=[
            _param("name", "Deployment name (exact)"),
            _param("host", "Host name (exact)"),
            _param("engine", "Engine", enum=EngineKind.values),
            _param("model", "Model (exact), e.g. meta-llama/Llama-3.1-8B-Instruct"),
        ],
    ),
    retrieve=extend_schema(summary="A deployment with its active config and lock"),
)
class DeploymentViewSet(ReadViewSet):
    """Engines on the hosts, each with the settings it runs now (secrets masked); a POST
    creates one as the host page's "New deployment" form does."""

    permission = "hosts.view_deployment"

    @property
    def permissions(self) -> dict:
        # The config history is its own page, under its own permission; creating asks for
        # what the "New deployment" page asks for.
        return {
            **super().permissions,
            "configs": "hosts.view_engineconfig",
            "create": "hosts.add_deployment",
            # Who may decide is the review rule's (hosts.services.deployment_review): it says
            # why in its 403, for the creator as for a role without the permission.
            "review": "hosts.view_deployment",
        }

    @extend_schema(
        summary="A new deployment: config v1 is created and its first start queued",
        request=sd.DeploymentCreateSerializer,
        responses={201: sd.DeploymentCreatedSerializer},
    )
    def create(self, request, *args, **kwargs):
        body = sd.DeploymentCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        host = data.pop("host")
        if data.get("port") is None:
            data["port"] = deployment_services.free_port(host, data["engine"])
        try:
            deployment, fit = deployment_services.create_deployment(request.user, host, data)
        except deployment_services.DeploymentRefused as refused:
            raise ValidationError(refused.errors) from None
        except DjangoPermissionDenied as denied:  # options only an Admin may set, said why
            raise PermissionDenied(str(denied)) from None
        deployment = self.get_queryset().get(pk=deployment.pk)
        deployment.lock_holder = None  # just created: nothing holds it
        deployment.fit = fit
        return Response(sd.DeploymentCreatedSerializer(deployment).data, status=201)

    def get_serializer_class(self):
        if self.action == "configs":
            return s.ConfigVersionSerializer
        return s.DeploymentDetailSerializer if self.action == "retrieve" else s.DeploymentSerializer

    def get_queryset(self):
        deployments = Deployment.objects.select_related(
            "host", "active_config__created_by"
        ).prefetch_related(Prefetch("gpus", queryset=Gpu.objects.order_by("index")))
        deployments = deployments.order_by("host__name", "name")
        if self.action != "list":
            return deployments
        query = self.request.query_params
        for param, field in (("name", "name"), ("host", "host__name"), ("model", "model")):
            if query.get(param):
                deployments = deployments.filter(**{field: query[param]})
        engine = _choice(self.request, "engine", EngineKind.values)
        if engine:
            deployments = deployments.filter(engine=engine)
        return deployments

    def retrieve(self, request, *args, **kwargs):
        deployment = self.get_object()
        deployment.lock_holder = lock_holder(deployment)
        return Response(s.DeploymentDetailSerializer(deployment).data)

    @extend_schema(
        summary="Approve or reject a new deployment's first start on a production host",
        request=s.DeploymentReviewBodySerializer,
        responses={200: s.DeploymentDetailSerializer},
    )
    @action(detail=True, methods=["post"])
    def review(self, request, pk=None):
        deployment = self.get_object()
        body = s.DeploymentReviewBodySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            review.review_first_start(
                request.user,
                deployment,
                body.validated_data["decision"],
                body.validated_data.get("comment", ""),
            )
        except DjangoPermissionDenied as denied:
            raise PermissionDenied(str(denied)) from None
        except review.ReviewRefused as refused:
            raise Conflict(str(refused)) from None
        deployment = self.get_queryset().get(pk=deployment.pk)
        deployment.lock_holder = lock_holder(deployment)
        return Response(s.DeploymentDetailSerializer(deployment).data)

    @extend_schema(
        summary="A deployment's config versions, newest first, each with its diff",
        responses=s.ConfigVersionSerializer(many=True),
    )
    @action(detail=True, methods=["get"])
    def configs(self, request, pk=None):
        deployment = self.get_object()
        configs = (
            EngineConfig.objects.filter(deployment=deployment)
            .select_related("created_by")
            .order_by("-version")
        )
        page = self.paginate_queryset(configs)
        rows = configs_with_diffs(page)
        _add_history_facts(deployment, rows)
        return self.get_paginated_response(s.ConfigVersionSerializer(rows, many=True).data)


def _add_history_facts(deployment: Deployment, rows: list[dict]) -> None:
    """What the config history page says of each version (running, the change that made it),
    and how its latest apply ended: two queries for the whole page."""
    configs = [row["config"] for row in rows]
    made_by = {
        config_id: (pk, state)
        for config_id, pk, state in ChangeRequest.objects.filter(
            applied_config__in=configs, kind=ChangeKind.SETTINGS
        ).values_list("applied_config_id", "pk", "state")
    }
    outcomes = {}
    applies = EngineOperation.objects.filter(config__in=configs, kind=OperationKind.APPLY)
    for config_id, outcome in (
        applies.exclude(outcome="").order_by("created_at", "pk").values_list("config_id", "outcome")
    ):
        outcomes[config_id] = outcome  # the newest wins
    for row in rows:
        config = row["config"]
        change, state = made_by.get(config.pk, (None, None))
        row.update(
            running=config.pk == deployment.active_config_id,
            change=change,
            change_state=state,
            outcome=outcomes.get(config.pk),
            # The version the diff is against: the one it was made from (config_history).
            diff_from_version=row["parent"].version if row.get("parent") else None,
        )


# --- load profiles and prices ------------------------------------------------------------------
@extend_schema_view(
    list=extend_schema(
        summary="Load profiles, newest version first within a name",
        parameters=[_param("name", "Profile name (exact)")],
    ),
    retrieve=extend_schema(summary="One load profile version"),
)
class ProfileViewSet(ReadViewSet):
    """Load profiles; a POST saves a new one or the next version of one, as the page does."""

    permission = "benchmarks.view_loadprofile"
    serializer_class = s.ProfileSerializer

    @property
    def permissions(self) -> dict:
        add = "benchmarks.add_loadprofile"
        return {**super().permissions, "create": add, "versions": add}

    @extend_schema(
        summary="A new load profile (version 1)",
        request=s.ProfileCreateBodySerializer,
        responses={201: s.ProfileSerializer},
    )
    def create(self, request, *args, **kwargs):
        body = s.ProfileCreateBodySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        return self._saved(
            profile_services.create_profile,
            data["name"],
            data["spec"],
            description=data["description"],
            note=data["note"],
        )

    @extend_schema(
        summary="The next version of a load profile (this one stays as it is)",
        request=s.ProfileVersionBodySerializer,
        responses={201: s.ProfileSerializer},
    )
    @action(detail=True, methods=["post"])
    def versions(self, request, pk=None):
        base = self.get_object()
        body = s.ProfileVersionBodySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        return self._saved(
            profile_services.edit_profile,
            base,
            data["spec"],
            description=data.get("description", base.description),
            note=data["note"],
        )

    def _saved(self, service, *args, **kwargs) -> Response:
        try:
            profile = service(self.request.user, *args, **kwargs)
        except SpecError as exc:
            raise ValidationError({"spec": [str(exc)]}) from None
        except IntegrityError:
            # Another version of the same name was saved at the same moment.
            raise Conflict("Another version of this profile was just saved: try again.") from None
        return Response(s.ProfileSerializer(profile).data, status=201)

    def get_queryset(self):
        profiles = LoadProfile.objects.select_related("created_by").order_by("name", "-version")
        name = self.request.query_params.get("name")
        if self.action == "list" and name:
            profiles = profiles.filter(name=name)
        return profiles


@extend_schema_view(
    list=extend_schema(summary="Prices (the cost page's price list)"),
    retrieve=extend_schema(summary="One price"),
)
class PriceViewSet(ReadViewSet):
    permission = "benchmarks.view_price"
    serializer_class = s.PriceSerializer

    def get_queryset(self):
        return Price.objects.prefetch_related(
            Prefetch("hosts", queryset=Host.objects.order_by("name"))
        )

    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(s.PriceSerializer(price_rows(page), many=True).data)

    def retrieve(self, request, *args, **kwargs):
        return Response(s.PriceSerializer(price_rows([self.get_object()])[0]).data)


# --- the audit log -----------------------------------------------------------------------------
def _audit_record(entry: AuditEntry) -> dict:
    record = audit_services.audit_export_record(entry)
    record["created_at"] = entry.created_at
    record["changes"] = audit_services.audit_changes(entry)
    return record


@extend_schema_view(
    list=extend_schema(
        summary="The audit log, newest first",
        parameters=[
            _param("action", "Action starts with, e.g. host."),
            _param("actor", 'Username, or "system"'),
            _param("object_type", '"app_label.model", e.g. hosts.host'),
            _param("object_id", "Object id (with object_type)"),
            _param("q", "Object contains"),
            OpenApiParameter("date_from", OpenApiTypes.DATE, description="From (inclusive)"),
            OpenApiParameter("date_to", OpenApiTypes.DATE, description="To (inclusive)"),
        ],
    ),
    retrieve=extend_schema(summary="One audit entry"),
)
class AuditViewSet(ReadViewSet):
    """The audit log, filtered by the page's own form (a bad filter is a 400, never an
    unfiltered log that could pass for the filtered one)."""

    permission = "controlpanel.view_auditentry"
    serializer_class = s.AuditEntrySerializer
    queryset = AuditEntry.objects.select_related("content_type")

    def list(self, request, *args, **kwargs):
        form = AuditFilterForm(request.query_params)
        if not form.is_valid():
            raise ValidationError({k: [str(m) for m in v] for k, v in form.errors.items()})
        page = self.paginate_queryset(audit_services.audit_entries(form.cleaned_data))
        data = s.AuditEntrySerializer([_audit_record(e) for e in page], many=True).data
        return self.get_paginated_response(data)

    def retrieve(self, request, *args, **kwargs):
        return Response(s.AuditEntrySerializer(_audit_record(self.get_object())).data)


router = SimpleRouter()
router.register("hosts", HostViewSet, basename="host")
router.register("deployments", DeploymentViewSet, basename="deployment")
router.register("profiles", ProfileViewSet, basename="profile")
router.register("prices", PriceViewSet, basename="price")
router.register("audit", AuditViewSet, basename="audit")

urlpatterns = router.urls
