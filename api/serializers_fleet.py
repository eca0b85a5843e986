"""What the fleet endpoints answer: hosts with their GPUs and latest telemetry, deployments with
their active config, config versions with their diffs, load profiles, prices, audit entries.

Read-only shapes. Fields are named one by one (never ``__all__``) so a new model column, a
host's credentials above all, cannot appear in an answer by accident; every engine setting and
environment variable goes through the engines' one secret rule (``hosts.engines.redaction``)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.base import StrictSerializerMixin
from benchmarks.models import LoadProfile
from controlpanel import userjson
from hosts.engines.redaction import masked
from hosts.models import clock_events

MONEY = {"max_digits": None, "decimal_places": 4}


@extend_schema_field(OpenApiTypes.OBJECT)
class MaskedMapping(serializers.Field):
    """A mapping of settings or environment variables with the secret values masked."""

    def to_representation(self, value):
        return masked(value)


class Username(serializers.CharField):
    """A user as their username (null when there is none: the system, or a deleted user)."""

    def __init__(self, **kwargs):
        super().__init__(read_only=True, allow_null=True, **kwargs)

    def get_attribute(self, instance):
        user = super().get_attribute(instance)
        return user.get_username() if user is not None else None

    def to_representation(self, value):
        return value


# --- hosts -----------------------------------------------------------------------------------
class GpuSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    index = serializers.IntegerField()
    uuid = serializers.CharField()
    model = serializers.CharField(source="name", help_text="e.g. NVIDIA H100 80GB HBM3")
    memory_bytes = serializers.IntegerField()
    numa_node = serializers.IntegerField(allow_null=True)
    cpu_affinity = serializers.CharField()
    telemetry = serializers.DictField(
        source="last_sample",
        help_text="The newest reading as the host page shows it (utilization_gpu_pct, "
        "memory_used_bytes, power_w, power_limit_w, temperature_c, sm_clock_mhz, "
        "pcie_tx_kbps, pcie_rx_kbps, throttle_reasons, missing …); {} before the first.",
    )
    telemetry_at = serializers.DateTimeField(source="last_sample_at", allow_null=True)
    clock_events = serializers.SerializerMethodField(
        help_text="Clock-event (throttle) reasons worth showing: idle is not one."
    )

    def get_clock_events(self, gpu) -> list[str]:
        return clock_events((gpu.last_sample or {}).get("throttle_reasons"))


class DeploymentRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    engine = serializers.CharField()
    model = serializers.CharField()
    status = serializers.CharField()


class HostCheckSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    status = serializers.CharField(help_text="Whether the check ran (queued, running, …).")
    outcome = serializers.CharField(
        help_text="What it found once it ran: connected, unreachable, auth_failed, … "
        '("" while it has not finished).'
    )
    reachable = serializers.BooleanField(allow_null=True)
    latency_ms = serializers.FloatField(allow_null=True)
    detail = serializers.CharField()
    error = serializers.CharField()
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


class HostSerializer(serializers.Serializer):
    """A host as the list and its page show it; never a credential, only whether one is
    stored (``has_credentials``) and why it is not sent (``credential_problem``)."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    address = serializers.CharField()
    port = serializers.IntegerField()
    transport = serializers.CharField(help_text="agent or ssh")
    agent_tls = serializers.BooleanField()
    ssh_username = serializers.CharField()
    labels = serializers.DictField(child=serializers.CharField())
    protection = serializers.DictField(
        child=serializers.CharField(allow_null=True),
        help_text="The labels that set how much review the host's changes need.",
    )
    status = serializers.CharField()
    status_label = serializers.CharField(source="get_status_display")
    last_error = serializers.CharField()
    last_seen_at = serializers.DateTimeField(allow_null=True)
    last_poll_at = serializers.DateTimeField(allow_null=True)
    hourly_price = serializers.DecimalField(**MONEY)
    description = serializers.CharField()
    has_credentials = serializers.BooleanField()
    gpus = GpuSerializer(many=True)
    deployments = DeploymentRefSerializer(many=True)


class HostDetailSerializer(HostSerializer):
    """The host page: what the host reported, its latest connection test, its SSH host key."""

    credential_problem = serializers.CharField(
        help_text='Why the stored credentials are not sent to the host\'s address ("" if they are).'
    )
    ssh_host_key_fingerprint = serializers.CharField()
    ssh_offered_fingerprint = serializers.CharField()
    ssh_offered_key_type = serializers.CharField()
    agent_version = serializers.CharField()
    telemetry_source = serializers.CharField()
    telemetry_note = serializers.CharField()
    hostname = serializers.CharField()
    driver_version = serializers.CharField()
    cuda_version = serializers.CharField()
    libraries = serializers.DictField()
    cpu_count = serializers.IntegerField(allow_null=True)
    cpu_model = serializers.CharField()
    memory_total_bytes = serializers.IntegerField(allow_null=True)
    numa_nodes = serializers.ListField(child=serializers.DictField())
    host_readings = serializers.DictField()
    inventory_at = serializers.DateTimeField(allow_null=True)
    last_check = HostCheckSerializer(source="latest_check", allow_null=True)


# --- deployments and their configs -------------------------------------------------------------
class ConfigSerializer(serializers.Serializer):
    """One engine-config version, secret settings and environment variables masked."""

    id = serializers.IntegerField()
    version = serializers.IntegerField()
    settings = MaskedMapping()
    env = MaskedMapping()
    placement = serializers.DictField()
    note = serializers.CharField()
    created_at = serializers.DateTimeField()
    created_by = Username()


class GpuRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    index = serializers.IntegerField()
    model = serializers.CharField(source="name")


class LockSerializer(serializers.Serializer):
    change = serializers.IntegerField(source="pk")
    title = serializers.CharField()
    state = serializers.CharField()


class DeploymentSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    host = serializers.IntegerField(source="host_id")
    host_name = serializers.CharField(source="host.name")
    engine = serializers.CharField()
    engine_version = serializers.CharField()
    model = serializers.CharField()
    port = serializers.IntegerField()
    launch_style = serializers.CharField()
    runner = serializers.CharField(help_text="engine, or simulator (demo, tests)")
    docker_image = serializers.CharField()
    gpus = GpuRefSerializer(many=True)
    status = serializers.CharField()
    status_label = serializers.CharField(source="get_status_display")
    status_detail = serializers.CharField()
    status_at = serializers.DateTimeField(allow_null=True)
    active_config = ConfigSerializer(allow_null=True)
    required_approvals = serializers.IntegerField(
        help_text="Approvals its first start needs (a production host's); 0: none. While "
        'they are missing its status is "in_review" and nothing runs.'
    )


class DeploymentReviewBodySerializer(serializers.Serializer):
    decision = serializers.ChoiceField(choices=["approve", "reject"])
    comment = serializers.CharField(required=False, allow_blank=True, max_length=2000)


class DeploymentDetailSerializer(DeploymentSerializer):
    lock = LockSerializer(
        source="lock_holder",
        allow_null=True,
        help_text="The change holding the deployment's lock (applying or verifying), if any.",
    )


class DiffLineSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="A flag, env.NAME or placement.numa_node/.cpus")
    old = serializers.JSONField(allow_null=True)
    new = serializers.JSONField(allow_null=True)


class ConfigVersionSerializer(serializers.Serializer):
    """A row of the config history: the version, whether it runs now, the change that made
    it and how that change ended, and what it changed from the version before."""

    id = serializers.IntegerField(source="config.id")
    version = serializers.IntegerField(source="config.version")
    created_at = serializers.DateTimeField(source="config.created_at")
    created_by = Username(source="config.created_by")
    note = serializers.CharField(source="config.note")
    settings = MaskedMapping(source="config.settings")
    env = MaskedMapping(source="config.env")
    placement = serializers.DictField(source="config.placement")
    running = serializers.BooleanField()
    change = serializers.IntegerField(
        allow_null=True, help_text="The change that created this version, if one did."
    )
    change_state = serializers.CharField(
        allow_null=True, help_text="How that change ended: applied, rolled_back, failed …"
    )
    outcome = serializers.CharField(
        allow_null=True,
        help_text="Of the latest apply of this version: ready, rolled_back or failed; null "
        "if it was never applied.",
    )
    diff_from_version = serializers.IntegerField(allow_null=True)
    diff = serializers.SerializerMethodField()

    @extend_schema_field(DiffLineSerializer(many=True))
    def get_diff(self, row) -> list:
        return [{"key": k, "old": old, "new": new} for k, (old, new) in row["diff"].items()]


# --- load profiles and prices ------------------------------------------------------------------
class ProfileSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    version = serializers.IntegerField()
    description = serializers.CharField()
    note = serializers.CharField()
    source = serializers.CharField()
    spec = serializers.DictField()
    created_at = serializers.DateTimeField()
    created_by = Username()


def _storable_spec(value):
    """A profile document PostgreSQL can store (no NUL, no lone surrogate); whether it is a
    runnable load is the service's to say (``benchmarks.loadgen.profile.validate``)."""
    if not isinstance(value, dict):
        raise serializers.ValidationError("A load profile document (a JSON object).")
    try:
        userjson.check_value(value, what="The document")
    except userjson.UserJSONError as exc:
        raise serializers.ValidationError(str(exc)) from None
    return value


class ProfileVersionBodySerializer(StrictSerializerMixin, serializers.Serializer):
    """The next version of a profile, as the page's editor saves it: the whole document."""

    spec = serializers.JSONField(validators=[_storable_spec])
    description = serializers.CharField(
        required=False, allow_blank=True, help_text="Omitted: the edited version's."
    )
    note = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class ProfileCreateBodySerializer(ProfileVersionBodySerializer):
    """A new profile (version 1 of a name nobody uses yet), as the page's "New" form."""

    name = serializers.CharField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True, default="")

    def validate_name(self, value: str) -> str:
        # The page's rule (ProfileForm.clean_name): a new profile takes a new name; the
        # next version of an existing one is made from that version.
        if LoadProfile.objects.filter(name=value).exists():
            raise serializers.ValidationError(
                "A profile of this name exists: POST its next version to "
                "/api/v1/profiles/{id}/versions/."
            )
        return value


class HostRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()


class PriceSerializer(serializers.Serializer):
    """A row of the price list (``benchmarks.services.prices.price_rows``)."""

    id = serializers.IntegerField(source="price.pk")
    name = serializers.CharField(source="price.name", help_text="Instance type")
    pricing = serializers.CharField(source="price.pricing")
    hourly_price = serializers.DecimalField(source="price.hourly_price", **MONEY)
    currency = serializers.CharField(source="price.currency")
    per_gpu_hour = serializers.DecimalField(allow_null=True, **MONEY)
    per_month = serializers.DecimalField(**MONEY)
    gpu_model = serializers.CharField(source="price.gpu_model")
    gpu_count = serializers.IntegerField(source="price.gpu_count", allow_null=True)
    hosts = HostRefSerializer(source="price.hosts.all", many=True)
    note = serializers.CharField(source="price.note")
    updated_at = serializers.DateTimeField(source="price.updated_at")


# --- the audit log -----------------------------------------------------------------------------
class AuditChangeSerializer(serializers.Serializer):
    field = serializers.CharField()
    before = serializers.CharField(allow_null=True)
    after = serializers.CharField(allow_null=True)


class AuditEntrySerializer(serializers.Serializer):
    """An entry as the log's export writes it (secrets masked), with the changed fields as
    the page lists them."""

    id = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    actor = serializers.CharField(help_text='The username; "" for the system.')
    via = serializers.CharField(help_text='"token NAME" for a write through the API.')
    action = serializers.CharField()
    object_type = serializers.CharField(help_text='"app_label.model"')
    object_id = serializers.CharField()
    object = serializers.CharField()
    before = serializers.JSONField(allow_null=True)
    after = serializers.JSONField(allow_null=True)
    changes = AuditChangeSerializer(many=True)
    remote_addr = serializers.CharField(allow_null=True)
