"""What ``GET /api/v1/deployments/{id}/scaling/`` answers: the deployment's live signals, a
replica's capacity at the SLO with the benchmark it came from, the desired replicas of its
replica group, the scaler thresholds, the policy, the engine start time, and the export links.

Read-only shapes over ``scaling.services.state.ScalingState``; units as the value types say
them (latencies ``*_ms`` in milliseconds, the signal windows and thresholds in seconds)."""

from __future__ import annotations

from rest_framework import serializers

NUM = {"allow_null": True}


class WindowSerializer(serializers.Serializer):
    seconds = serializers.FloatField(help_text="Span the window actually covers, s.")
    requests = serializers.FloatField(help_text="Observations in it.")
    p50 = serializers.FloatField(help_text="Seconds.", **NUM)
    p95 = serializers.FloatField(help_text="Seconds.", **NUM)


class SignalsSerializer(serializers.Serializer):
    at = serializers.FloatField(help_text="Epoch seconds of the scrape.")
    engine = serializers.CharField()
    requests_waiting = serializers.FloatField(**NUM)
    requests_running = serializers.FloatField(**NUM)
    pending_prompt_tokens = serializers.FloatField(**NUM)
    pending_basis = serializers.CharField(help_text="How pending prompt tokens are estimated.")
    kv_cache_usage_ratio = serializers.FloatField(**NUM)
    preemptions_per_s = serializers.FloatField(**NUM)
    input_tokens_per_s = serializers.FloatField(**NUM)
    output_tokens_per_s = serializers.FloatField(**NUM)
    finished_rps = serializers.FloatField(**NUM)
    arrival_rps = serializers.FloatField(**NUM)
    ttft = serializers.DictField(child=WindowSerializer(), help_text='By window: "1m", "5m".')
    itl = serializers.DictField(child=WindowSerializer(), help_text='By window: "1m", "5m".')


class SLOSerializer(serializers.Serializer):
    ttft_p95_ms = serializers.FloatField()
    itl_p95_ms = serializers.FloatField(**NUM)
    max_error_rate = serializers.FloatField()


class LoadPointSerializer(serializers.Serializer):
    """One measured load level: a benchmark run's stage or a sweep trial's limit."""

    source = serializers.ChoiceField(choices=["run", "sweep"])
    run_id = serializers.IntegerField(allow_null=True)
    run_url = serializers.CharField(allow_null=True, help_text="The run's page.")
    run_name = serializers.CharField()
    stage = serializers.CharField()
    sweep_id = serializers.IntegerField(allow_null=True)
    sweep_url = serializers.CharField(allow_null=True, help_text="The sweep's page.")
    mode = serializers.ChoiceField(choices=["rate", "concurrency"])
    offered = serializers.FloatField(help_text="req/s (rate) or clients (concurrency).")
    achieved_rps = serializers.FloatField(**NUM)
    ttft_p95_ms = serializers.FloatField(**NUM)
    itl_p95_ms = serializers.FloatField(**NUM)
    error_rate = serializers.FloatField()
    waiting_mean = serializers.FloatField(**NUM)
    waiting_max = serializers.FloatField(**NUM)
    running_mean = serializers.FloatField(**NUM)
    kv_usage_max = serializers.FloatField(**NUM)
    output_tokens_per_s = serializers.FloatField(**NUM)
    mean_prompt_tokens = serializers.FloatField(**NUM)
    mean_output_tokens = serializers.FloatField(**NUM)
    finished_at = serializers.FloatField(help_text="Epoch seconds.", **NUM)


class RefusedRunSerializer(serializers.Serializer):
    run_id = serializers.IntegerField()
    run_url = serializers.CharField(help_text="The run's page.")
    reason = serializers.CharField(
        help_text='Why it is not evidence, in the words every consumer uses ("client-limited: …").'
    )


class CapacitySerializer(serializers.Serializer):
    status = serializers.ChoiceField(
        choices=["measured", "above_tested", "none_meets", "no_evidence"]
    )
    slo = SLOSerializer()
    rps = serializers.FloatField(help_text="Requests/s one replica carried within the SLO.", **NUM)
    concurrency = serializers.FloatField(**NUM)
    best = LoadPointSerializer(allow_null=True, help_text="The heaviest level within the SLO.")
    breach = LoadPointSerializer(allow_null=True, help_text="The lightest heavier level out of it.")
    queue_at_breach = serializers.FloatField(**NUM)
    kv_at_breach = serializers.FloatField(**NUM)
    pending_tokens_at_breach = serializers.FloatField(**NUM)
    explanation = serializers.CharField()
    profile_id = serializers.IntegerField(allow_null=True, help_text="The profile measured by.")
    profile = serializers.CharField(help_text='"name vN"; empty without evidence.')
    points = serializers.IntegerField(help_text="Load levels that were judged.")
    refused_runs = RefusedRunSerializer(
        many=True,
        help_text="Runs of the profile left out of the capacity (benchmarks.evidence's rule: "
        "client-limited), newest first.",
    )


class ThresholdsSerializer(serializers.Serializer):
    requests_waiting = serializers.FloatField(**NUM)
    activation_requests_waiting = serializers.FloatField(**NUM)
    pending_prompt_tokens = serializers.FloatField(**NUM)
    requests_per_s = serializers.FloatField(**NUM)
    kv_cache_usage_ratio = serializers.FloatField(**NUM)
    ttft_p95_seconds = serializers.FloatField(**NUM)
    itl_p95_seconds = serializers.FloatField(**NUM)
    evidence = serializers.CharField()


class DecisionSerializer(serializers.Serializer):
    current = serializers.IntegerField(help_text="Running replicas in the group.")
    desired = serializers.IntegerField()
    raw_desired = serializers.IntegerField(help_text="Before hysteresis and bounds.")
    status = serializers.ChoiceField(choices=["ok", "under", "over", "unknown"])
    demand_rps = serializers.FloatField(**NUM)
    forecast_rps = serializers.FloatField(**NUM)
    warm_minimum = serializers.IntegerField()
    reason = serializers.CharField()


class PolicySerializer(serializers.Serializer):
    saved = serializers.BooleanField(help_text="False: the defaults (no policy saved yet).")
    slo = SLOSerializer()
    min_replicas = serializers.IntegerField()
    max_replicas = serializers.IntegerField()
    target = serializers.FloatField(help_text="Share of a replica's capacity planned for.")
    stabilisation_s = serializers.FloatField()
    cooldown_s = serializers.FloatField()
    polling_interval_s = serializers.FloatField()


class EngineStartSerializer(serializers.Serializer):
    seconds = serializers.FloatField()
    basis = serializers.CharField()


class GroupSerializer(serializers.Serializer):
    model = serializers.CharField()
    engine = serializers.CharField()
    deployments = serializers.ListField(
        child=serializers.IntegerField(), help_text="Running deployments of the model."
    )


class ScalingLinksSerializer(serializers.Serializer):
    page = serializers.CharField()
    keda = serializers.CharField(help_text="KEDA ScaledObject (YAML).")
    alerts = serializers.CharField(help_text="Prometheus alerting rules (YAML).")
    grafana = serializers.CharField(help_text="Grafana dashboard (JSON).")


class ScalingSerializer(serializers.Serializer):
    deployment = serializers.IntegerField()
    deployment_name = serializers.CharField()
    host_name = serializers.CharField()
    model = serializers.CharField()
    engine = serializers.CharField()
    status = serializers.CharField(help_text="The deployment's status.")
    signals = SignalsSerializer(allow_null=True, help_text="Null when none are fresh.")
    signals_age_s = serializers.FloatField(**NUM)
    signals_note = serializers.CharField()
    capacity = CapacitySerializer()
    decision = DecisionSerializer()
    thresholds = ThresholdsSerializer()
    policy = PolicySerializer()
    engine_start = EngineStartSerializer()
    group = GroupSerializer()
    links = ScalingLinksSerializer()
