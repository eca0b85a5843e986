"""Forms of the scaling pages: a deployment's scaling policy, and the parameters of the
export downloads (validated here so that nothing unchecked reaches a YAML file a cluster
will apply)."""

from __future__ import annotations

import re

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

from benchmarks.models import LoadProfile
from scaling.models import ScalingPolicy
from scaling.services import policies

# Kubernetes object names: a DNS-1123 subdomain (a Deployment's name) and label (a
# namespace), as the API server checks them.
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DEFAULT_PROMETHEUS_URL = "http://prometheus.monitoring.svc:9090"
SCALE_TARGET_KINDS = ("Deployment", "StatefulSet")


class PolicyForm(forms.ModelForm):
    """The scaling policy of one deployment; the model's validators bound every number."""

    class Meta:
        model = ScalingPolicy
        fields = policies.FIELDS  # what the audited save writes, one list
        labels = {
            "slo_ttft_p95_ms": "p95 TTFT ≤ (ms)",
            "slo_itl_p95_ms": "p95 ITL ≤ (ms)",
            "max_error_rate": "Max error rate",
            "load_profile": "Load profile",
            "min_replicas": "Min replicas",
            "max_replicas": "Max replicas",
            "target": "Target share of capacity",
            "stabilisation_s": "Scale-down stabilisation (s)",
            "cooldown_s": "Cooldown (s)",
            "polling_interval_s": "Polling interval (s)",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["load_profile"].queryset = LoadProfile.objects.order_by("name", "-version")
        self.fields["load_profile"].empty_label = "the newest finished run's profile"

    def clean(self):
        data = super().clean()
        low, high = data.get("min_replicas"), data.get("max_replicas")
        if low is not None and high is not None and low > high:
            self.add_error("max_replicas", "Must be at least the minimum.")
        return data


def _dns_name(pattern: re.Pattern, limit: int, what: str):
    def check(value: str) -> None:
        if len(value) > limit or not pattern.match(value):
            raise ValidationError(
                f"Not a Kubernetes {what}: lower-case letters, digits and '-'"
                f"{' and dots' if pattern is DNS1123_SUBDOMAIN else ''}, starting and ending "
                f"with a letter or digit, at most {limit} characters."
            )

    return check


class ExportForm(forms.Form):
    """The query parameters of an export download; all optional, each with its default."""

    name = forms.CharField(
        required=False,
        max_length=253,
        validators=[_dns_name(DNS1123_SUBDOMAIN, 253, "object name (DNS-1123 subdomain)")],
        help_text="The Kubernetes Deployment/StatefulSet to scale (default: the deployment's "
        "name).",
    )
    namespace = forms.CharField(
        required=False,
        max_length=63,
        validators=[_dns_name(DNS1123_LABEL, 63, "namespace (DNS-1123 label)")],
    )
    kind = forms.ChoiceField(
        required=False, choices=[(k, k) for k in SCALE_TARGET_KINDS], label="Target kind"
    )
    prometheus = forms.CharField(
        required=False,
        max_length=500,
        validators=[URLValidator(schemes=["http", "https"])],
        label="Prometheus URL",
        help_text="Where KEDA queries the panel's series.",
    )

    def target_params(self, deployment_name: str) -> dict:
        """The cleaned values with their defaults filled in (call after ``is_valid``)."""
        data = self.cleaned_data
        return {
            "scale_target": data.get("name") or deployment_name,
            "namespace": data.get("namespace") or "default",
            "scale_target_kind": data.get("kind") or "Deployment",
            "prometheus_url": data.get("prometheus")
            or getattr(settings, "SCALING_PROMETHEUS_URL", "")
            or DEFAULT_PROMETHEUS_URL,
        }

    def problems(self) -> list[str]:
        """One line per invalid parameter, named as in the query string."""
        return [f"{field}: {' '.join(messages)}" for field, messages in self.errors.items()]
