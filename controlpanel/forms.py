"""Forms of the controlpanel app: the audit log's filters, and the form field for JSON that
users type (``UserJSONField``)."""

from __future__ import annotations

from django import forms
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ValidationError
from django.db import models
from django.forms.fields import InvalidJSONInput, JSONString

from controlpanel import userjson
from controlpanel.models import AuditEntry

ANY = [("", "any")]
# The choice value for entries without a user (scheduler, worker): their actor_name is "".
SYSTEM = "system"


class AuditFilterForm(forms.Form):
    """Filters of the audit log and its exports (all optional, combinable). Choices come
    from what the log holds, so every option finds something."""

    action = forms.CharField(
        required=False,
        max_length=64,
        label="Action starts with",
        widget=forms.TextInput(attrs={"placeholder": "host."}),
    )
    actor = forms.ChoiceField(required=False, label="Who")
    object_type = forms.ChoiceField(required=False, label="Object type")
    object_id = forms.CharField(required=False, max_length=64, label="Object id")
    q = forms.CharField(required=False, max_length=200, label="Object contains")
    date_from = forms.DateField(
        required=False, label="From", widget=forms.DateInput(attrs={"type": "date"})
    )
    date_to = forms.DateField(
        required=False, label="To", widget=forms.DateInput(attrs={"type": "date"})
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        names = (
            AuditEntry.objects.exclude(actor_name="")
            .order_by("actor_name")
            .values_list("actor_name", flat=True)
            .distinct()
        )
        self.fields["actor"].choices = ANY + [(SYSTEM, "system")] + [(n, n) for n in names]
        types = ContentType.objects.filter(
            pk__in=AuditEntry.objects.order_by().values("content_type").distinct()
        ).order_by("app_label", "model")
        self.fields["object_type"].choices = ANY + [
            (f"{ct.app_label}.{ct.model}", f"{ct.name} ({ct.app_label})") for ct in types
        ]

    def clean_actor(self) -> str | None:
        """None: anyone; "": the system; otherwise a username."""
        actor = self.cleaned_data.get("actor")
        if not actor:
            return None
        return "" if actor == SYSTEM else actor

    def clean(self):
        data = super().clean()
        if data.get("object_id") and not data.get("object_type"):
            self.add_error("object_id", "Choose the object type too: ids repeat across types.")
        start, end = data.get("date_from"), data.get("date_to")
        if start and end and end < start:
            self.add_error("date_to", "The end date is before the start date.")
        return data


class UserJSONField(forms.JSONField):
    """``forms.JSONField`` parsed by ``controlpanel.userjson``: Django's own field lets
    through what PostgreSQL cannot store (``\\u0000``) and lets 100k-deep nesting raise
    ``RecursionError`` (both a 500). Here both, and NaN/Infinity, are form errors that say
    what is wrong and where. ``what`` names the field in the message ("Labels")."""

    def __init__(self, *, what: str = "JSON", max_depth: int = userjson.DEFAULT_MAX_DEPTH, **kw):
        self.what = what
        self.max_depth = max_depth
        super().__init__(**kw)

    def to_python(self, value):
        if self.disabled:
            return value
        if value in self.empty_values:
            return None
        if isinstance(value, list | dict | int | float | JSONString):
            return value
        try:
            converted = userjson.parse(value, what=self.what, max_depth=self.max_depth)
        except userjson.UserJSONError as exc:
            raise ValidationError(str(exc), code="invalid") from None
        return JSONString(converted) if isinstance(converted, str) else converted

    def bound_data(self, data, initial):
        if self.disabled:
            return initial
        if data is None:
            return None
        try:
            return userjson.parse(data, what=self.what, max_depth=self.max_depth)
        except userjson.UserJSONError:
            return InvalidJSONInput(data)


# For ModelAdmin.formfield_overrides: JSON typed in the admin goes through the same parser as
# the pages' (no NUL, no deep nesting, no NaN).
ADMIN_JSON_FIELDS = {models.JSONField: {"form_class": UserJSONField}}
