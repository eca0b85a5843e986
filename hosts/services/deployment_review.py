"""A new deployment's first start on a production host waits for review, like a change.

Starting an engine on a production host takes its GPUs, memory and port from whatever runs
there: it needs CHANGE_PRODUCTION_APPROVALS approvals (``Host.is_production``, the labels as
they are now) from reviewers other than its creator. Until then the deployment is *Awaiting
approval* (``DeploymentStatus.IN_REVIEW``) and nothing is sent to the host; the last approval
queues its first start, one rejection ends the request (the deployment is stopped, never
started, and may be deleted). Elsewhere a deployment starts at once, as before.
"""

from __future__ import annotations

from django.conf import settings as conf
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.utils import timezone

from controlpanel.services import audit
from controlpanel.workflow import four_eyes_problem
from hosts.choices import DeploymentStatus, OperationKind
from hosts.models import Deployment, DeploymentApproval, EngineConfig
from hosts.services.operations import request_operation

APPROVE_PERMISSION = "hosts.approve_deployment"


class ReviewRefused(Exception):
    """A review the rules do not allow now; the message says why."""


def first_start_approvals(host) -> int:
    """The approvals a new deployment's first start on ``host`` needs: 0 (start at once)
    unless the host is production."""
    return conf.CHANGE_PRODUCTION_APPROVALS if host.is_production else 0


def approvals_count(deployment: Deployment) -> int:
    return deployment.approvals.filter(decision=DeploymentApproval.Decision.APPROVE).count()


def review_problem(user, deployment: Deployment) -> str | None:
    """Why ``user`` may not review ``deployment``'s first start now, or None."""
    if deployment.status != DeploymentStatus.IN_REVIEW:
        return f"{deployment} is not awaiting approval."
    if not user.has_perm(APPROVE_PERMISSION):
        return "Only Approvers and Admins approve a deployment's first start."
    return four_eyes_problem(
        user,
        deployment.created_by_id,
        "this deployment",
        made="created",
        verb="approve its first start",
    )


def review_first_start(user, deployment: Deployment, decision: str, comment: str = ""):
    """Record ``user``'s decision. The approvals are counted against the host's labels as
    they are now (an Admin may label it production after the request); enough of them
    queue the first start of config v1, a rejection stops the deployment unstarted."""
    decision = DeploymentApproval.Decision(decision)
    with transaction.atomic():
        deployment = (
            Deployment.objects.select_for_update(of=("self",))
            .select_related("host")
            .get(pk=deployment.pk)
        )
        problem = review_problem(user, deployment)
        if problem:
            if deployment.status == DeploymentStatus.IN_REVIEW:
                raise PermissionDenied(problem)
            raise ReviewRefused(problem)
        try:
            with transaction.atomic():
                DeploymentApproval.objects.create(
                    deployment=deployment,
                    reviewer=user,
                    reviewer_name=user.get_username(),
                    decision=decision,
                    comment=comment.strip()[:2000],
                )
        except IntegrityError:
            raise ReviewRefused(f"You already reviewed {deployment}'s first start.") from None
        audit(
            user,
            f"deployment.{decision.value}",
            deployment,
            after={"comment": comment.strip()[:2000]},
        )
        if decision == DeploymentApproval.Decision.REJECT:
            _set_status(
                deployment,
                DeploymentStatus.STOPPED,
                f"first start rejected by {user.get_username()}"
                + (f": {comment.strip()[:300]}" if comment.strip() else ""),
            )
            return deployment
        needed = max(deployment.required_approvals, first_start_approvals(deployment.host))
        if needed != deployment.required_approvals:
            deployment.required_approvals = needed
            deployment.save(update_fields=["required_approvals", "updated_at"])
        count = approvals_count(deployment)
        if count < needed:
            _set_status(deployment, DeploymentStatus.IN_REVIEW, f"{count} of {needed} approvals")
            return deployment
        _set_status(deployment, DeploymentStatus.STARTING, "first start queued (approved)")
        config = EngineConfig.objects.filter(deployment=deployment).order_by("version").first()
        request_operation(user, deployment, OperationKind.APPLY, config, note="first start")
    return deployment


def _set_status(deployment: Deployment, status: DeploymentStatus, detail: str) -> None:
    deployment.status, deployment.status_detail = status, detail[:500]
    deployment.status_at = timezone.now()
    deployment.save(update_fields=["status", "status_detail", "status_at", "updated_at"])
