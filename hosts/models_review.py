"""The review of a new deployment's first start on a production host
(``hosts.services.deployment_review``): one approval or rejection per reviewer."""

from __future__ import annotations

from django.conf import settings as conf
from django.db import models
from django.utils import timezone

from hosts.models import Deployment


class DeploymentApproval(models.Model):
    """One reviewer's decision on a new deployment's first start on a production host (as a
    change's approval: never its creator's, one per reviewer)."""

    class Decision(models.TextChoices):
        APPROVE = "approve", "Approved"
        REJECT = "reject", "Rejected"

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="approvals")
    reviewer = models.ForeignKey(
        conf.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    reviewer_name = models.CharField(max_length=150)
    decision = models.CharField(max_length=8, choices=Decision.choices)
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "reviewer"], name="deploymentapproval_one_per_reviewer"
            )
        ]

    def __str__(self) -> str:
        return f"{self.reviewer_name} {self.decision} {self.deployment}"
