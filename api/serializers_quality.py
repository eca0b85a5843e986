"""The shapes of the quality probe API: probe sets (with their items in the detail only), probe
runs (a row, one in full with its answers a page at a time), the bodies that start a probe or
upload a set, and the comparison of two runs of one set version."""

from __future__ import annotations

import math

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.base import StrictSerializerMixin
from benchmarks.models_quality import ProbeSet
from hosts.models import Deployment

# One detail answers at most this many items' answers; ``results_offset`` pages on.
RESULTS_PAGE = 500


# --- probe sets --------------------------------------------------------------------------------
class ProbeSetSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    version = serializers.IntegerField()
    description = serializers.CharField()
    source = serializers.CharField(help_text="builtin or uploaded")
    item_count = serializers.IntegerField()
    coverage = serializers.DictField(
        child=serializers.IntegerField(), help_text='{"category/language": items}'
    )
    sha256 = serializers.CharField()
    created_by = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    page = serializers.CharField(source="get_absolute_url")

    def get_created_by(self, probe_set) -> str | None:
        return probe_set.created_by.get_username() if probe_set.created_by_id else None


class ProbeSetDetailSerializer(ProbeSetSerializer):
    items = serializers.ListField(
        child=serializers.DictField(), help_text="The JSONL lines as objects."
    )


class ProbeSetUploadSerializer(StrictSerializerMixin, serializers.Serializer):
    """A new set, or the next version of ``name``: its JSONL as ``jsonl`` (JSON body) or
    ``file`` (multipart). A bad line is a 400 naming every bad line; nothing is stored."""

    name = serializers.CharField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    jsonl = serializers.CharField(
        required=False, allow_blank=True, trim_whitespace=False, help_text="One item a line."
    )
    file = serializers.FileField(required=False, help_text="Multipart: the JSONL file.")

    def validate(self, data):
        if not data.get("file") and not (data.get("jsonl") or "").strip():
            raise serializers.ValidationError({"jsonl": ["Give the items as jsonl or file."]})
        return data


# --- probe runs --------------------------------------------------------------------------------
class ProbeRunSerializer(serializers.Serializer):
    """A probe run as a list row."""

    id = serializers.IntegerField()
    status = serializers.CharField()
    label = serializers.CharField()
    deployment = serializers.IntegerField(source="deployment_id")
    deployment_name = serializers.CharField(source="deployment.name")
    probe_set = serializers.IntegerField(source="probe_set_id")
    set_name = serializers.CharField(source="probe_set.name")
    set_version = serializers.IntegerField(source="probe_set.version")
    config_version = serializers.SerializerMethodField()
    engine = serializers.CharField()
    engine_version = serializers.CharField()
    model_name = serializers.CharField()
    simulated = serializers.BooleanField(
        help_text="The simulator answered (its quality model), not a real model."
    )
    structured_output = serializers.BooleanField()
    concurrency = serializers.IntegerField()
    total = serializers.IntegerField()
    done = serializers.IntegerField()
    accuracy = serializers.FloatField(allow_null=True)
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)

    def get_config_version(self, run) -> int | None:
        return run.engine_config.version if run.engine_config_id else None


class ProbeResultSerializer(serializers.Serializer):
    item_id = serializers.CharField()
    category = serializers.CharField()
    language = serializers.CharField()
    answer = serializers.CharField()
    correct = serializers.BooleanField(allow_null=True)
    json_valid = serializers.BooleanField(allow_null=True)
    schema_ok = serializers.BooleanField(allow_null=True)
    prompt_tokens = serializers.IntegerField(allow_null=True)
    completion_tokens = serializers.IntegerField(allow_null=True)
    latency_ms = serializers.FloatField(allow_null=True)
    error = serializers.CharField()


class ProbeResultsPageSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="Answers stored (after the wrong filter).")
    offset = serializers.IntegerField()
    next_offset = serializers.IntegerField(allow_null=True, help_text="Ask again from here.")
    items = ProbeResultSerializer(many=True)


class ProbeRunDetailSerializer(ProbeRunSerializer):
    """One probe run in full: its summary (accuracy overall, by category, by language and by
    both; JSON validity), where it stands, and its answers a page at a time."""

    finished = serializers.BooleanField(source="is_finished")
    cancel_requested = serializers.BooleanField()
    progress = serializers.SerializerMethodField(help_text="0..1: done / total.")
    seed = serializers.IntegerField()
    summary = serializers.DictField()
    duration_s = serializers.FloatField(allow_null=True)
    requested_by = serializers.SerializerMethodField()
    started_at = serializers.DateTimeField(allow_null=True)
    error = serializers.CharField()
    page = serializers.CharField(source="get_absolute_url")
    results = serializers.SerializerMethodField()

    def get_progress(self, run) -> float:
        return run.done / run.total if run.total else 0.0

    def get_requested_by(self, run) -> str | None:
        return run.requested_by.get_username() if run.requested_by_id else None

    @extend_schema_field(ProbeResultsPageSerializer)
    def get_results(self, run) -> dict:
        query = self.context.get("results_query") or {}
        offset, wrong = query.get("results_offset", 0), query.get("wrong", False)
        results = run.results.all()
        if wrong:
            results = results.exclude(correct=True)
        count = results.count()
        page = list(results[offset : offset + RESULTS_PAGE])
        following = offset + RESULTS_PAGE
        return {
            "count": count,
            "offset": offset,
            "next_offset": following if following < count else None,
            "items": ProbeResultSerializer(page, many=True).data,
        }


class ProbeStartSerializer(StrictSerializerMixin, serializers.Serializer):
    """What starts a probe, as the page asks: the engine, the set version, how to ask."""

    deployment = serializers.PrimaryKeyRelatedField(
        queryset=Deployment.objects.select_related("host", "active_config")
    )
    probe_set = serializers.PrimaryKeyRelatedField(queryset=ProbeSet.objects.defer("items"))
    structured_output = serializers.BooleanField(required=False, default=False)
    concurrency = serializers.IntegerField(min_value=1, max_value=256, required=False, default=8)
    seed = serializers.IntegerField(required=False, default=0, min_value=0, max_value=2**31 - 1)
    label = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")


class ProbeDetailQuerySerializer(serializers.Serializer):
    results_offset = serializers.IntegerField(min_value=0, max_value=10**9, default=0)
    wrong = serializers.BooleanField(default=False, help_text="Only the wrong or failed answers.")


# --- comparing ---------------------------------------------------------------------------------
class ProbeCompareQuerySerializer(serializers.Serializer):
    baseline = serializers.IntegerField(
        min_value=1, max_value=2**63 - 1, help_text="The probe run to judge this one against."
    )
    max_loss = serializers.FloatField(
        required=False, default=0.01, help_text="The largest loss allowed: 0.01 = one point."
    )

    def validate_max_loss(self, value: float) -> float:
        if not math.isfinite(value) or not 0 <= value <= 1:
            raise serializers.ValidationError("A fraction between 0 and 1 (0.01 = one point).")
        return value


def _pair():
    return serializers.ListField(child=serializers.FloatField(), min_length=2, max_length=2)


class ProbeGroupSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="overall, category:X, language:Y or X/Y.")
    category = serializers.CharField(allow_null=True)
    language = serializers.CharField(allow_null=True)
    n = serializers.IntegerField()
    baseline_correct = serializers.IntegerField()
    candidate_correct = serializers.IntegerField()
    both_correct = serializers.IntegerField()
    only_baseline = serializers.IntegerField()
    only_candidate = serializers.IntegerField()
    baseline_accuracy = serializers.FloatField()
    candidate_accuracy = serializers.FloatField()
    baseline_ci = _pair()
    candidate_ci = _pair()
    mcnemar_p = serializers.FloatField()
    loss = serializers.FloatField(help_text="Baseline accuracy minus candidate accuracy.")
    loss_ci = _pair()
    verdict = serializers.CharField(
        help_text='This group\'s statistics: "loss", "no loss" or "cannot tell".'
    )
    reason = serializers.CharField()
    agreement = serializers.FloatField(allow_null=True)
    json_items = serializers.IntegerField()
    baseline_json_valid = serializers.FloatField(allow_null=True)
    candidate_json_valid = serializers.FloatField(allow_null=True)
    baseline_schema_ok = serializers.FloatField(allow_null=True)
    candidate_schema_ok = serializers.FloatField(allow_null=True)
    baseline_errors = serializers.IntegerField()
    candidate_errors = serializers.IntegerField()


class ProbeComparisonSerializer(serializers.Serializer):
    """``benchmarks.quality.compare``'s result: the overall verdict, every group (overall
    first), the items whose correctness changed side by side, and the unpaired ids."""

    baseline = serializers.IntegerField()
    candidate = serializers.IntegerField()
    simulated = serializers.BooleanField(help_text="Either side ran on a simulated engine.")
    max_loss = serializers.FloatField()
    confidence = serializers.FloatField()
    verdict = serializers.CharField(
        help_text='The one quality verdict (as a change\'s page and timeline say it): "loss", '
        '"no loss", "no significant loss" or "cannot tell" (too few items, or a baseline '
        "that answers under 20 % or fewer than 10 items right)."
    )
    reason = serializers.CharField()
    text = serializers.CharField(help_text='"<verdict>: <reason>", the words the pages show.')
    groups = ProbeGroupSerializer(many=True)
    changed = serializers.ListField(child=serializers.DictField())
    only_in_baseline = serializers.ListField(child=serializers.CharField())
    only_in_candidate = serializers.ListField(child=serializers.CharField())
