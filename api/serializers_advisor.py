"""What the advisor's API answers: a finding (the same fields in a deployment's diagnosis and
in the fleet-wide list), a deployment's diagnosis, and the body of a dismissal."""

from __future__ import annotations

from rest_framework import serializers

from api.base import StrictSerializerMixin
from changes.models_findings import Severity
from changes.services.diagnosis import DISMISS_REASON_CHARS


class SuggestionSerializer(serializers.Serializer):
    settings = serializers.DictField(
        help_text="Flag changes: the engine's flag name (as its spec names it) → new value."
    )
    action = serializers.CharField(help_text="A change outside the config, in words.")


class FindingSerializer(serializers.Serializer):
    """One finding, as the Advisor sections show it."""

    id = serializers.IntegerField()
    deployment = serializers.IntegerField(source="deployment_id")
    deployment_name = serializers.CharField(source="deployment.name")
    host_name = serializers.CharField(source="deployment.host.name")
    rule = serializers.CharField(help_text="The rule's stable id, e.g. queue-bound.")
    severity = serializers.ChoiceField(choices=Severity.choices)
    # Text, not an enum: "state" names the change requests' enum in the schema already.
    state = serializers.CharField(help_text="active, dismissed (still seen) or cleared.")
    title = serializers.CharField()
    seen = serializers.CharField(help_text="The numbers seen, with the window they cover.")
    why = serializers.CharField(help_text="Why it matters.")
    evidence = serializers.DictField(help_text="The same numbers as data.")
    suggestion = SuggestionSerializer(allow_null=True)
    source = serializers.CharField(help_text="Where the numbers came from: live, run N …")
    first_seen_at = serializers.DateTimeField()
    last_seen_at = serializers.DateTimeField()
    cleared_at = serializers.DateTimeField(allow_null=True)
    dismissed_at = serializers.DateTimeField(allow_null=True)
    dismissed_by = serializers.SerializerMethodField()
    dismiss_reason = serializers.CharField()

    def get_dismissed_by(self, finding) -> str | None:
        user = finding.dismissed_by
        return user.get_username() if user else None


class FreshnessSerializer(serializers.Serializer):
    """How current the findings are (the host page's line above them, as data)."""

    stale = serializers.BooleanField(
        help_text="True when the advisor failed since its last good pass, or has not run "
        "for three of its intervals."
    )
    as_of = serializers.DateTimeField(
        allow_null=True, help_text="The last good evaluation (else the newest sighting)."
    )
    age_s = serializers.IntegerField(allow_null=True, help_text="Seconds since as_of.")
    reason = serializers.CharField(help_text="Why they are stale, in words; empty if not.")
    failed_since = serializers.DateTimeField(
        allow_null=True, help_text="When the advisor's passes began to fail."
    )
    error_class = serializers.CharField(help_text="The failing pass's exception class.")
    text = serializers.CharField(
        help_text="The page's line: \"as of 14:02 (12 min ago): the advisor failed since "
        '14:03: TypeError".'
    )


class DiagnosisSerializer(serializers.Serializer):
    """A deployment's active findings and how the last evaluation went."""

    deployment = serializers.IntegerField()
    evaluated_at = serializers.DateTimeField(
        allow_null=True, help_text="The last evaluation; null: not evaluated recently."
    )
    engine_status = serializers.ChoiceField(
        choices=["live", "skipped", "unavailable", "unknown"],
        help_text="Whether the last evaluation read the engine's /metrics.",
    )
    engine_error = serializers.CharField(help_text="Why the engine could not be read.")
    freshness = FreshnessSerializer()
    findings = FindingSerializer(many=True)


class DiagnosisQuerySerializer(serializers.Serializer):
    refresh = serializers.BooleanField(
        required=False, default=False, help_text="Evaluate now (scrapes the engine) first."
    )


class FindingListQuerySerializer(serializers.Serializer):
    severity = serializers.ChoiceField(choices=Severity.choices, required=False)
    rule = serializers.CharField(required=False, max_length=60)
    deployment = serializers.IntegerField(required=False, min_value=1, max_value=2**63 - 1)
    include = serializers.MultipleChoiceField(
        choices=["dismissed", "cleared"],
        required=False,
        help_text="Also list dismissed and/or cleared findings (repeat or comma-separate).",
    )


class DismissSerializer(StrictSerializerMixin, serializers.Serializer):
    reason = serializers.CharField(max_length=DISMISS_REASON_CHARS)
