"""The review of a new deployment's first start on a production host
(``hosts.services.deployment_review``): one approval or rejection per reviewer."""

from __future__ import annotations

from django.db import models

from controlpanel.workflow import Decision, ReviewDecision
from hosts.models import Deployment


class DeploymentApproval(ReviewDecision):
    """One reviewer's decision on a new deployment's first start on a production host (as a
    change's approval: never its creator's, one per reviewer)."""

    Decision = Decision  # as the first-start review reads it: DeploymentApproval.Decision

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="approvals")

    class Meta(ReviewDecision.Meta):
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "reviewer"], name="deploymentapproval_one_per_reviewer"
            )
        ]

    def __str__(self) -> str:
        return f"{self.reviewer_name} {self.decision} {self.deployment}"
