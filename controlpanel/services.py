"""Cross-cutting workflows: writing the audit log."""

from __future__ import annotations

import json

from django.contrib.contenttypes.models import ContentType
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.forms.models import model_to_dict

from controlpanel.models import AuditEntry


def snapshot(obj: models.Model, fields: list[str] | None = None) -> dict:
    """A JSON-safe dict of ``obj``'s editable fields, for the before/after of an audit entry."""
    data = model_to_dict(obj, fields=fields)
    for key, value in data.items():
        if isinstance(value, list) and value and isinstance(value[0], models.Model):
            data[key] = [item.pk for item in value]
    # Round-trip through the encoder so Decimals, datetimes and UUIDs compare as stored.
    return json.loads(json.dumps(data, cls=DjangoJSONEncoder))


def audit(
    actor,
    action: str,
    obj: models.Model | None = None,
    *,
    before: dict | None = None,
    after: dict | None = None,
    remote_addr: str | None = None,
) -> AuditEntry:
    """Append one entry to the audit log. ``actor`` None means the system (scheduler, worker)."""
    user = actor if getattr(actor, "is_authenticated", False) else None
    return AuditEntry.objects.create(
        actor=user,
        actor_name=user.get_username() if user else "",
        action=action,
        content_type=ContentType.objects.get_for_model(obj) if obj is not None else None,
        object_id=str(obj.pk) if obj is not None else "",
        object_repr=str(obj)[:200] if obj is not None else "",
        before=before,
        after=after,
        remote_addr=remote_addr,
    )
