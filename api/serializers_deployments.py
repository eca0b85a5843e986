"""What ``POST /api/v1/deployments/`` takes and answers: a new deployment as the host page's
"New deployment" form takes it, checked by the same service (hosts.services.deployments), and
the created deployment with its fit check."""

from __future__ import annotations

from rest_framework import serializers

from api.base import StrictSerializerMixin
from api.serializers_fleet import DeploymentDetailSerializer
from hosts.choices import EngineKind, LaunchStyle
from hosts.models import Host


class DeploymentCreateSerializer(StrictSerializerMixin, serializers.Serializer):
    """The shapes only; every rule (free name, port and GPUs, engine version, model, settings,
    the weights fitting the GPUs) is the service's, answered as errors by field."""

    host = serializers.PrimaryKeyRelatedField(queryset=Host.objects.all())
    name = serializers.CharField(max_length=63, help_text="Lower-case letters, digits and '-'.")
    engine = serializers.ChoiceField(choices=EngineKind.values)
    engine_version = serializers.CharField(max_length=40, help_text="e.g. 0.11.0")
    model = serializers.CharField(
        max_length=200,
        help_text="A catalogue model, a Hugging Face repo id or an absolute path on the host.",
    )
    gpus = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=1023),
        max_length=64,
        help_text="GPU indexes on the host (as the host page numbers them).",
    )
    port = serializers.IntegerField(
        required=False, help_text="Omitted: a free port (the engine's default when free)."
    )
    launch_style = serializers.ChoiceField(choices=LaunchStyle.values, default=LaunchStyle.PROCESS)
    settings = serializers.DictField(
        required=False,
        default=dict,
        help_text='Engine flags by name without dashes, e.g. {"max_num_seqs": 256}; several '
        "GPUs set the tensor-parallel size unless given.",
    )


class FitSerializer(serializers.Serializer):
    fits = serializers.BooleanField(
        allow_null=True, help_text="null: the model's size is unknown, the fit was not checked."
    )
    message = serializers.CharField()
    weights_gib = serializers.FloatField(allow_null=True, help_text="Per GPU.")
    budget_gib = serializers.FloatField(allow_null=True, help_text="Usable memory per GPU.")
    kv_cache_gib = serializers.FloatField(allow_null=True, help_text="All GPUs together.")
    kv_tokens = serializers.IntegerField(allow_null=True)


class DeploymentCreatedSerializer(DeploymentDetailSerializer):
    fit = FitSerializer()
