"""What every API view shares: writes made with a token are audited as "via token NAME"."""

from __future__ import annotations

from contextlib import ExitStack

from api.models import ApiToken
from controlpanel.services import acting_via


class TokenAuditMixin:
    """Around the whole request (authentication happens inside DRF's ``initial``), audit
    entries written while serving a token's request name the token."""

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        if isinstance(request.auth, ApiToken):
            self._via_stack.enter_context(acting_via(f"token {request.auth.name}"))

    def dispatch(self, request, *args, **kwargs):
        self._via_stack = ExitStack()
        with self._via_stack:
            return super().dispatch(request, *args, **kwargs)


class StrictSerializerMixin:
    """Refuse fields the serializer does not know (a typo must not be silently dropped): 400
    with the unknown field named, before anything is created."""

    def to_internal_value(self, data):
        from rest_framework import serializers

        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)
