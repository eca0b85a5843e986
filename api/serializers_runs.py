"""The shapes of the runs API: a run in the history list, one run in full, the body that
starts one, its timeline page and a verdict against a baseline."""

from __future__ import annotations

import math

from rest_framework import serializers

from api.base import StrictSerializerMixin
from benchmarks.evidence import usable_as_evidence
from benchmarks.metrics import HISTORY
from benchmarks.models import MAX_SHARDS, LoadProfile
from hosts.models import Deployment

# ``?ttft_p95=…`` of the verdict → the ``changes.verdict.Thresholds`` field it sets.
THRESHOLD_PARAMS = {
    "ttft_p95": "ttft_p95_regression",
    "itl_p95": "itl_p95_regression",
    "error_rate": "error_rate_increase",
}
# A threshold beyond this is a typo (10 = ten times slower, or +1000 points of errors).
MAX_THRESHOLD = 10.0


class _RunRowSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    status = serializers.CharField()
    label = serializers.CharField()
    source = serializers.CharField()
    deployment = serializers.IntegerField(source="deployment_id")
    deployment_name = serializers.CharField(source="deployment.name")
    host_name = serializers.CharField(source="deployment.host.name")
    profile = serializers.IntegerField(source="load_profile_id", allow_null=True)
    profile_name = serializers.SerializerMethodField()
    profile_version = serializers.SerializerMethodField()
    config_version = serializers.SerializerMethodField()
    engine = serializers.CharField()
    engine_version = serializers.CharField()
    model_name = serializers.CharField()
    gpu_model = serializers.CharField()
    gpu_count = serializers.IntegerField(allow_null=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    completed = serializers.IntegerField(allow_null=True)
    failed = serializers.IntegerField(allow_null=True)
    currency = serializers.CharField(help_text="Of cost_per_million_output.")
    client_limited = serializers.SerializerMethodField(
        help_text="benchmarks.evidence's rule: {state: usable|client_limited|unknown, limited, "
        "checked, reasons, unchecked} (no health numbers in a list row)."
    )

    def get_profile_name(self, run) -> str | None:
        return run.load_profile.name if run.load_profile_id else None

    def get_profile_version(self, run) -> int | None:
        return run.load_profile.version if run.load_profile_id else None

    def get_config_version(self, run) -> int | None:
        return run.engine_config.version if run.engine_config_id else None

    def get_client_limited(self, run) -> dict:
        return {k: v for k, v in usable_as_evidence(run).to_dict().items() if k != "health"}


# A run as a row of the history: what it ran on and the history table's number columns,
# each under its column name (ttft_p95_ms, …). Reads only the columns
# ``benchmarks.services.history`` loads (plus the ids and the finish time).
RunListItemSerializer = type(
    "RunListItemSerializer",
    (_RunRowSerializer,),
    {
        metric.key: serializers.FloatField(
            allow_null=True, help_text=f"{metric.label} ({metric.unit or 'fraction'})"
        )
        for metric in HISTORY
    },
)


class RunLinksSerializer(serializers.Serializer):
    page = serializers.CharField()
    timeline = serializers.CharField()
    export_json = serializers.CharField()
    export_csv = serializers.CharField(help_text="The request log; 404 when the run has none.")


class RunCostSerializer(serializers.Serializer):
    priced = serializers.CharField(
        help_text='Always "when the run finished": the host\'s price of that moment, for the GPUs '
        "the run used. The cost page (and its API) re-prices runs at today's prices."
    )
    hourly_price = serializers.FloatField(allow_null=True)
    currency = serializers.CharField()
    per_million_output = serializers.FloatField(
        allow_null=True, help_text="At the measured output throughput, fully utilised."
    )


class RunDetailSerializer(serializers.Serializer):
    """One run: where it stands, what it ran, and ``results``: its numbers under the names of
    the result JSON the panel exports (``p95_ttft_ms``, ``error_rate``, ``completed`` …),
    null until it has finished with results."""

    id = serializers.IntegerField()
    status = serializers.CharField()
    finished = serializers.BooleanField()
    cancel_requested = serializers.BooleanField()
    progress = serializers.FloatField(help_text="0..1")
    label = serializers.CharField()
    source = serializers.CharField()
    deployment = serializers.IntegerField()
    deployment_name = serializers.CharField()
    host_name = serializers.CharField()
    profile = serializers.IntegerField(allow_null=True)
    profile_name = serializers.CharField(allow_null=True)
    profile_version = serializers.IntegerField(allow_null=True)
    config_version = serializers.IntegerField(allow_null=True)
    engine = serializers.CharField()
    engine_version = serializers.CharField()
    model_name = serializers.CharField()
    requested_by = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    error = serializers.CharField()
    stopped_early = serializers.CharField()
    notes = serializers.ListField(child=serializers.CharField())
    results = serializers.DictField(allow_null=True)
    shards = serializers.IntegerField(help_text="Load generators that sent the run's load.")
    cost = RunCostSerializer(help_text="The run's own cost, priced when it finished.")
    client_limited = serializers.DictField(
        help_text="Whether the run may be evidence (benchmarks.evidence): state usable, "
        "client_limited (refused by verdicts, the gate, the advisor, capacity, sweeps and the "
        "cost ranking; reasons say why, with numbers) or unknown (no health measured: allowed, "
        "not checked); health: the load generator's own numbers and the engine's view."
    )
    shard_health = serializers.ListField(
        child=serializers.DictField(),
        help_text="Per shard of a sharded run: worker, sent/done/failed, clock offset ± "
        "uncertainty (ms), send lateness p99 (ms), behind, status and error; empty for 1.",
    )
    links = RunLinksSerializer()


class RunStartSerializer(StrictSerializerMixin, serializers.Serializer):
    """What starts a run, as the New run page asks: the engine, the profile version and how
    many load generators send it."""

    deployment = serializers.PrimaryKeyRelatedField(
        queryset=Deployment.objects.select_related("host", "active_config")
    )
    profile = serializers.PrimaryKeyRelatedField(queryset=LoadProfile.objects.all())
    label = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    shards = serializers.IntegerField(
        min_value=1,
        max_value=MAX_SHARDS,
        required=False,
        default=1,
        help_text=f"Load generators (workers of the loadgen queue) splitting the profile's one "
        f"schedule, 1 to {MAX_SHARDS}; more than 1 needs request-rate stages and production "
        "mode (409 otherwise, saying why).",
    )


class RunTimelineSerializer(serializers.Serializer):
    status = serializers.CharField()
    finished = serializers.BooleanField()
    cancel_requested = serializers.BooleanField()
    progress = serializers.FloatField()
    points = serializers.ListField(child=serializers.DictField())
    more = serializers.BooleanField(help_text="Ask again from the last point's t.")


class RunTimelineQuerySerializer(serializers.Serializer):
    since = serializers.FloatField(
        required=False, default=-1.0, help_text="Seconds on the run's clock."
    )

    def validate_since(self, value: float) -> float:
        if not math.isfinite(value):
            raise serializers.ValidationError("since must be a number of seconds.")
        return value


class RunVerdictQuerySerializer(serializers.Serializer):
    """The baseline and the thresholds: relative for the latencies (0.1 = 10 % slower),
    absolute for the error rate (0.005 = half a point). Unset: the panel's defaults for a
    change."""

    baseline = serializers.IntegerField(min_value=1)
    ttft_p95 = serializers.FloatField(required=False)
    itl_p95 = serializers.FloatField(required=False)
    error_rate = serializers.FloatField(required=False)

    def validate(self, data):
        errors = {}
        for name in THRESHOLD_PARAMS:
            value = data.get(name)
            if value is not None and not (math.isfinite(value) and 0 < value <= MAX_THRESHOLD):
                errors[name] = [f"must be a number above 0 and at most {MAX_THRESHOLD:g}."]
        if errors:
            raise serializers.ValidationError(errors)
        return data


class RunVerdictCheckSerializer(serializers.Serializer):
    metric = serializers.CharField()
    label = serializers.CharField()
    baseline = serializers.FloatField(allow_null=True)
    after = serializers.FloatField(allow_null=True)
    change = serializers.FloatField(
        allow_null=True, required=False, help_text="Relative (latency) or in points (errors)."
    )
    limit = serializers.CharField()
    limit_applied = serializers.CharField(
        required=False,
        help_text="The limit on this baseline, as a change's page says it "
        "(``changes.verdict.applied_limit``).",
    )
    ok = serializers.BooleanField(allow_null=True, help_text="null: not judged (see note).")
    note = serializers.CharField(required=False)
    noise = serializers.ListField(
        child=serializers.FloatField(), required=False, help_text="Change's noise band."
    )


class RunConditionSerializer(serializers.Serializer):
    key = serializers.CharField()
    label = serializers.CharField()
    baseline = serializers.JSONField(allow_null=True)
    after = serializers.JSONField(allow_null=True)
    percent = serializers.BooleanField(required=False)


class RunVerdictSerializer(serializers.Serializer):
    """``changes.verdict.verdict`` of the run against the baseline, as a change's
    verification is judged: ``inconclusive`` is never "within limits"."""

    outcome = serializers.ChoiceField(choices=["verified", "regressed", "inconclusive"])
    reason = serializers.CharField()
    text = serializers.CharField(help_text="The verdict in one line, as a change shows it.")
    run = serializers.IntegerField()
    baseline = serializers.IntegerField()
    thresholds = serializers.DictField(child=serializers.FloatField())
    checks = RunVerdictCheckSerializer(many=True)
    throughput_change = serializers.FloatField(allow_null=True)
    conditions = RunConditionSerializer(many=True)
    notes = serializers.ListField(child=serializers.CharField())
    guards = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="Hard guards that fired (preemptions or a saturated KV cache new in the run, "
        "an engine restart during it): a regression whatever the noise.",
    )
