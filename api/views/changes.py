"""API resources: changes. The list (with the page's filters), proposing one (through the
page's own form and ``review.propose_change``), one change as its page shows it, and the
page's buttons as POST actions calling the same verbs.

Every rule stays where the page's does: permissions per action are the page views'
``permission_required``; who may act on this change, and when, is ``changes.rules`` checked by
the services, whose refusals come back as 409 (``ChangeRefused``: the change's state, the
deployment's lock, the window) or 403 (``PermissionDenied``: four eyes, proposer only, code
loading), each with the rule's own words."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import Prefetch
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from api.base import TokenAuditMixin
from api.errors import Conflict
from api.serializers_changes import (
    ChangeCommentBodySerializer,
    ChangeDetailSerializer,
    ChangeEmptyBodySerializer,
    ChangeItemSerializer,
    ChangeProposeSerializer,
    ChangeReasonBodySerializer,
    ChangeRequiredCommentSerializer,
    ChangeRequiredReasonSerializer,
    ChangeRollbackProposalSerializer,
)
from changes.choices import ChangeState
from changes.forms import FLAG_PREFIX, REMOVE_PREFIX, ChangeFilterForm, ProposeForm
from changes.models import Approval, ChangeRequest
from changes.rules import APPLY, APPROVE, PROPOSE, ChangeRefused
from changes.services import apply, facts, review, timeline
from changes.views import DETAIL_SELECT
from controlpanel.services import redact
from hosts.engines.environment import ENV_NAME, env_problem
from hosts.engines.launch import LaunchError

VIEW = "changes.view_changerequest"
# The change page's override button's permission (changes/views.py change_approve_override).
OVERRIDE = "changes.override_changerequest"
# The proposal form's placement fields, named placement.<field> in the API.
PLACEMENT_FIELDS = ("numa_node", "cpus")
# The list's query string: the page's filter form, plus the pages of the answer.
LIST_PARAMS = {"page", "page_size", "format"}

ERRORS = {
    400: OpenApiResponse(description="Invalid body: problem details naming each field."),
    403: OpenApiResponse(description="Your role (or the rule) does not allow it."),
    404: OpenApiResponse(description="No such change."),
    409: OpenApiResponse(description="The change's state (or its deployment) refuses it now."),
}
ACTION_RESPONSES = {200: ChangeDetailSerializer, **ERRORS}


def _problem_from_form(form) -> dict:
    """The form's errors keyed as the API names the fields: a flag's under ``settings.<dest>``
    with the flag's option first, as the page's error summary says it."""
    errors: dict[str, list[str]] = {}
    for name, messages in form.errors.items():
        if name == "__all__":
            errors.setdefault("non_field_errors", []).extend(messages)
            continue
        if name == "env" and form.env_problems:
            # By variable, as the launch rules name them (env.HF_HOME).
            for var, message in form.env_problems.items():
                key = "env" if var.startswith("line ") else f"env.{var}"
                errors.setdefault(key, []).append(f"{var}: {message}" if key == "env" else message)
            continue
        if name in PLACEMENT_FIELDS:
            errors.setdefault(f"placement.{name}", []).extend(messages)
            continue
        for prefix in (FLAG_PREFIX, REMOVE_PREFIX):
            if name.startswith(prefix):
                label = form.fields[name].label
                key = "settings." + name.removeprefix(prefix)
                errors.setdefault(key, []).extend(f"{label}: {m}" for m in messages)
                break
        else:
            errors.setdefault(name, []).extend(messages)
    return errors


def _env_text(form: ProposeForm, given: dict | None) -> str:
    """The environment field's text as the page shows it (the running variables, a secret
    as the keep mark) with the body's variables typed over it: a value sets, null removes;
    the mask, as a response shows a secret, is the keep mark."""
    lines = {}
    for raw in (form.fields["env"].initial or "").splitlines():
        name, _, value = raw.partition("=")
        lines[name] = value
    for name, value in (given or {}).items():
        # One variable a line: nothing in the body may make another line of the text.
        problem = None
        if not ENV_NAME.fullmatch(name):
            problem = env_problem(name, "") or f"invalid variable name {name!r}"
        if problem is None and value is not None and ("\n" in value or "\r" in value):
            problem = "invalid value: a value is one line"
        if problem:
            raise exceptions.ValidationError({f"env.{name}": [problem]})
        if value is None:
            lines.pop(name, None)
        else:
            lines[name] = value
    return "\n".join(f"{name}={value}" for name, value in lines.items())


def _refusal_errors(exc: ChangeRefused) -> dict:
    """A refused proposal's errors per field when the flag spec refused it (the service
    raises ChangeRefused from the spec's LaunchError, whose per-field messages it joined)."""
    cause = exc.__context__
    if isinstance(cause, LaunchError) and cause.errors:
        return {key: [message] for key, message in cause.errors.items()}
    return {"non_field_errors": [str(exc)]}


def _form_value(flag, value):
    """A JSON value as the page's form field for ``flag`` receives it typed in."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        if not flag.nargs:
            raise exceptions.ValidationError(
                {f"settings.{flag.dest}": [f"{flag.option}: takes one value, not a list."]}
            )
        value = " ".join(map(str, value))
    if isinstance(value, dict):
        raise exceptions.ValidationError(
            {f"settings.{flag.dest}": [f"{flag.option}: expected a value, not an object."]}
        )
    return str(value)


def proposal_form(data: dict) -> tuple[ProposeForm, dict]:
    """The page's ProposeForm filled as a person would submit it: every field starts at what
    the page shows (the running values, the default thresholds), the body's values typed over
    them. Also the settings the form has no field for, which go on to the service so that its
    flag spec names them (an unknown flag, one the engine version lacks, a reserved one)."""
    deployment = data["deployment"]
    shown = ProposeForm(deployment)
    given = data["settings"]
    form_data: dict = {}
    for name, field in shown.fields.items():
        if name.startswith(FLAG_PREFIX):
            flag = field.flag
            if flag.dest not in given:
                # Left out: what the page's field shows (a secret's field is empty: kept).
                initial = field.initial
                form_data[name] = "" if initial is None else str(initial)
            elif given[flag.dest] is None:
                form_data[name] = ""
                if flag.secret:
                    form_data[REMOVE_PREFIX + flag.dest] = "on"
            else:
                form_data[name] = _form_value(flag, given[flag.dest])
        elif name.startswith(REMOVE_PREFIX):
            continue
        elif name == "env":
            form_data[name] = _env_text(shown, data.get("env"))
        elif name in PLACEMENT_FIELDS:
            if "placement" in data and data["placement"] is None:
                value = None  # null: no placement at all
            else:
                placement = data.get("placement") or {}
                value = placement[name] if name in placement else field.initial
            form_data[name] = "" if value is None else str(value)
        elif name in data:
            value = data[name]
            form_data[name] = "" if value is None else value
        elif field.initial is not None:
            form_data[name] = field.initial
    unknown = {k: v for k, v in given.items() if FLAG_PREFIX + k not in shown.fields}
    return ProposeForm(deployment, form_data), unknown


class ChangeViewSet(TokenAuditMixin, viewsets.GenericViewSet):
    """Change requests: list, propose, read, and act on them as the change page's buttons do."""

    # The page views' permission_required, action by action (changes/views.py).
    permissions = {
        "list": VIEW,
        "retrieve": VIEW,
        "create": PROPOSE,
        "propose_rollback": PROPOSE,
        "submit": PROPOSE,
        "approve": APPROVE,
        "approve_override": OVERRIDE,
        "reject": APPROVE,
        "withdraw": PROPOSE,
        "comment": PROPOSE,
        "rebase": PROPOSE,
        "apply": APPLY,
        "resume": APPLY,
        "rollback": APPLY,
    }
    serializer_class = ChangeDetailSerializer
    lookup_value_regex = r"\d+"
    queryset = ChangeRequest.objects.select_related(
        *DETAIL_SELECT, "snapshot_config", "applied_by", "finding"
    ).prefetch_related(Prefetch("approvals", queryset=Approval.objects.order_by("created_at")))

    # --- reading ---------------------------------------------------------------------------
    def detail_data(self, pk: int) -> dict:
        change = self.get_queryset().get(pk=pk)
        context = {
            "request": self.request,
            "diff": facts.shown_diff(change.diff()),
            # Secrets are masked when an entry is written, and again here for older entries
            # (as the page does).
            "timeline": [redact(item) for item in timeline.timeline(change)],
            "lock": apply.lock_holder(change.deployment),
            "actions": change.allowed_actions(self.request.user),
        }
        return ChangeDetailSerializer(change, context=context).data

    @extend_schema(
        summary="Change requests, newest first",
        parameters=[
            OpenApiParameter("state", str, enum=ChangeState.values),
            OpenApiParameter("host", int, description="A host's id."),
            OpenApiParameter("deployment", int, description="A deployment's id."),
            OpenApiParameter("proposer", str, description="The proposer's user id or username."),
        ],
        responses={200: ChangeItemSerializer(many=True), 400: ERRORS[400], 403: ERRORS[403]},
    )
    def list(self, request):
        unknown = sorted(
            set(request.query_params) - set(ChangeFilterForm.base_fields) - LIST_PARAMS
        )
        if unknown:
            raise exceptions.ValidationError({name: ["Unknown filter."] for name in unknown})
        query = request.query_params.copy()
        proposer = query.get("proposer", "")
        if proposer and not proposer.isdigit():
            # A script knows usernames; the page's form takes the user's id.
            found = get_user_model().objects.filter(username=proposer).first()
            query["proposer"] = str(found.pk) if found else proposer
        form = ChangeFilterForm(query)
        if not form.is_valid():
            raise exceptions.ValidationError(form.errors)
        changes = form.filter(
            ChangeRequest.objects.select_related("deployment__host", "proposed_by")
            .prefetch_related("approvals")
            .order_by("-created_at", "-pk")
        )
        page = self.paginate_queryset(changes)
        return self.get_paginated_response(ChangeItemSerializer(page, many=True).data)

    @extend_schema(
        summary="One change, as its page shows it",
        responses={200: ChangeDetailSerializer, 403: ERRORS[403], 404: ERRORS[404]},
    )
    def retrieve(self, request, pk=None):
        return Response(self.detail_data(self.get_object().pk))

    # --- proposing -------------------------------------------------------------------------
    @extend_schema(
        summary="Propose a change (the page's new-change form)",
        request=ChangeProposeSerializer,
        responses={201: ChangeDetailSerializer, 400: ERRORS[400], 403: ERRORS[403]},
    )
    def create(self, request):
        body = ChangeProposeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        form, unknown = proposal_form(data)
        if not form.is_valid():
            raise exceptions.ValidationError(_problem_from_form(form))
        proposal = form.proposal()
        proposal["settings"].update(unknown)
        try:
            change = review.propose_change(
                request.user, data["deployment"], submit=data["submit"], **proposal
            )
        except ChangeRefused as exc:
            # Refused for what it holds (a flag, nothing to change, the window): the page
            # shows these on the form, so they are the body's errors here.
            raise exceptions.ValidationError(_refusal_errors(exc)) from None
        except PermissionDenied as exc:
            raise exceptions.PermissionDenied(str(exc) or None) from None
        return self._created(change)

    @extend_schema(
        summary="Propose going back to an earlier config version (the config history's button)",
        request=ChangeRollbackProposalSerializer,
        responses={201: ChangeDetailSerializer, **ERRORS},
    )
    @action(detail=False, methods=["post"], url_path="propose-rollback")
    def propose_rollback(self, request):
        body = ChangeRollbackProposalSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            change = review.propose_rollback(
                request.user, data["config"], rationale=data["rationale"]
            )
        except ChangeRefused as exc:
            raise Conflict(str(exc)) from None
        except PermissionDenied as exc:
            raise exceptions.PermissionDenied(str(exc) or None) from None
        return self._created(change)

    def _created(self, change: ChangeRequest) -> Response:
        location = reverse("api:change-detail", args=[change.pk])
        return Response(
            self.detail_data(change.pk),
            status=status.HTTP_201_CREATED,
            headers={"Location": location},
        )

    # --- the buttons -----------------------------------------------------------------------
    def _act(self, request, verb, body_class, *, field: str | None = None):
        change = self.get_object()
        body = body_class(data=request.data)
        body.is_valid(raise_exception=True)
        args = () if field is None else (body.validated_data.get(field, ""),)
        try:
            verb(request.user, change, *args)
        except ChangeRefused as exc:
            raise Conflict(str(exc)) from None
        except PermissionDenied as exc:
            raise exceptions.PermissionDenied(str(exc) or None) from None
        return Response(self.detail_data(change.pk))

    @extend_schema(
        summary="Submit a draft for review",
        request=ChangeEmptyBodySerializer,
        responses=ACTION_RESPONSES,
    )
    @action(detail=True, methods=["post"])
    def submit(self, request, pk=None):
        return self._act(request, review.submit_change, ChangeEmptyBodySerializer)

    @extend_schema(
        summary="Approve (not your own change: four eyes)",
        request=ChangeCommentBodySerializer,
        responses=ACTION_RESPONSES,
    )
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        return self._act(
            request, review.approve_change, ChangeCommentBodySerializer, field="comment"
        )

    @extend_schema(
        summary="Approve a change predicted not to start (Admins, not your own), saying why",
        description=(
            "The simulator predicts the proposed config would not start, so a plain approve is "
            "refused (409). An Admin who knows better (the prediction may be wrong for this "
            "engine build) approves it with a written reason, recorded on the change's timeline "
            "as 'Predicted start failure overridden' before the approval."
        ),
        request=ChangeRequiredReasonSerializer,
        responses=ACTION_RESPONSES,
    )
    @action(detail=True, methods=["post"], url_path="approve-override")
    def approve_override(self, request, pk=None):
        return self._act(
            request,
            review.override_start_and_approve,
            ChangeRequiredReasonSerializer,
            field="reason",
        )

    @extend_schema(
        summary="Reject, saying why",
        request=ChangeRequiredCommentSerializer,
        responses=ACTION_RESPONSES,
    )
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        return self._act(
            request, review.reject_change, ChangeRequiredCommentSerializer, field="comment"
        )

    @extend_schema(
        summary="Withdraw (the proposer, or an Admin)",
        request=ChangeReasonBodySerializer,
        responses=ACTION_RESPONSES,
    )
    @action(detail=True, methods=["post"])
    def withdraw(self, request, pk=None):
        return self._act(
            request, review.withdraw_change, ChangeReasonBodySerializer, field="reason"
        )

    @extend_schema(
        summary="Comment on the change",
        request=ChangeRequiredCommentSerializer,
        responses=ACTION_RESPONSES,
    )
    @action(detail=True, methods=["post"])
    def comment(self, request, pk=None):
        return self._act(
            request, review.comment_on_change, ChangeRequiredCommentSerializer, field="comment"
        )

    @extend_schema(
        summary="Rebase a stale change onto the running config",
        request=ChangeEmptyBodySerializer,
        responses=ACTION_RESPONSES,
    )
    @action(detail=True, methods=["post"])
    def rebase(self, request, pk=None):
        return self._act(request, review.rebase_change, ChangeEmptyBodySerializer)

    @extend_schema(
        summary="Apply an approved change (queues its pipeline)",
        request=ChangeEmptyBodySerializer,
        responses=ACTION_RESPONSES,
    )
    @action(detail=True, methods=["post"])
    def apply(self, request, pk=None):
        return self._act(request, apply.apply_change, ChangeEmptyBodySerializer)

    @extend_schema(
        summary="Resume a pipeline whose worker was lost",
        request=ChangeEmptyBodySerializer,
        responses=ACTION_RESPONSES,
    )
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        return self._act(request, apply.resume_change, ChangeEmptyBodySerializer)

    @extend_schema(
        summary="Roll back a change being applied, saying why",
        request=ChangeRequiredReasonSerializer,
        responses=ACTION_RESPONSES,
    )
    @action(detail=True, methods=["post"])
    def rollback(self, request, pk=None):
        return self._act(
            request, apply.request_rollback, ChangeRequiredReasonSerializer, field="reason"
        )


router = SimpleRouter()
router.register("changes", ChangeViewSet, basename="change")
urlpatterns = router.urls
