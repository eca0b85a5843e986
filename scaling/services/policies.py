"""Saving a deployment's scaling policy: the one workflow behind the policy form, audited."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from controlpanel.services import audit, snapshot
from hosts.models import Deployment
from scaling.models import ScalingPolicy

FIELDS = [
    "slo_ttft_p95_ms",
    "slo_itl_p95_ms",
    "max_error_rate",
    "load_profile",
    "min_replicas",
    "max_replicas",
    "target",
    "stabilisation_s",
    "cooldown_s",
    "polling_interval_s",
]


def policy_of(deployment: Deployment) -> ScalingPolicy:
    """The deployment's stored policy, or an unsaved one holding the defaults (a deployment
    without a row scales by them; the settings' SLO included)."""
    try:
        return ScalingPolicy.objects.get(deployment=deployment)
    except ScalingPolicy.DoesNotExist:
        return ScalingPolicy(
            deployment=deployment, slo_ttft_p95_ms=settings.SCALING_SLO_TTFT_P95_MS
        )


def save_policy(actor, deployment: Deployment, form) -> ScalingPolicy:
    """Store the valid ``form`` (a ``PolicyForm`` bound to ``policy_of(deployment)``) and
    audit what changed ("scaling.policy.create" the first time, then ".update")."""
    with transaction.atomic():
        stored = ScalingPolicy.objects.select_for_update().filter(deployment=deployment).first()
        before = snapshot(stored, FIELDS) if stored else None
        policy = form.save(commit=False)
        if stored:
            policy.pk = stored.pk
        policy.deployment = deployment
        policy.updated_by = actor if getattr(actor, "is_authenticated", False) else None
        policy.save()
        after = snapshot(policy, FIELDS)
        if before != after:
            action = "scaling.policy.update" if stored else "scaling.policy.create"
            audit(actor, action, policy, before=before, after=after)
    return policy
