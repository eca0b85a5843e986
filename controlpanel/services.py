"""Cross-cutting workflows: writing and reading the audit log."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, time, timedelta

from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ObjectDoesNotExist
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.forms.models import model_to_dict
from django.urls import NoReverseMatch
from django.utils import timezone

from controlpanel.models import AuditEntry


def snapshot(obj: models.Model, fields: list[str] | None = None) -> dict:
    """A JSON-safe dict of ``obj``'s editable fields, for the before/after of an audit entry."""
    data = model_to_dict(obj, fields=fields)
    for key, value in data.items():
        if isinstance(value, list) and value and isinstance(value[0], models.Model):
            data[key] = [item.pk for item in value]
    # Round-trip through the encoder so Decimals, datetimes and UUIDs compare as stored.
    return json.loads(json.dumps(data, cls=DjangoJSONEncoder))


# --- Secrets: what the audit log never holds nor shows --------------------------------------

# The rules that say a value is secret by its key (``api_key``, ``env.HF_TOKEN``). This layer
# knows no engine: the hosts app registers its rule (hosts.engines.redaction.is_secret) when
# it is ready, so the audit log masks what the engines' specs mark secret.
_secret_rules: list[Callable[[str], bool]] = []
MASK = "•••"


def register_secret_rule(rule: Callable[[str], bool]) -> None:
    if rule not in _secret_rules:
        _secret_rules.append(rule)


def is_secret_key(key) -> bool:
    return isinstance(key, str) and any(rule(key) for rule in _secret_rules)


def _masked(value):
    if value is None:
        return None
    if isinstance(value, list | tuple):
        return [_masked(item) for item in value]
    return MASK


def redact(value):
    """``value`` (audit data: nested dicts and lists) with the value of every secret key
    masked; "not set" (None) stays visible so a diff still says a key was added or removed."""
    if isinstance(value, dict):
        return {k: (_masked(v) if is_secret_key(k) else redact(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(item) for item in value]
    return value


# How the current request reached the panel ("token NAME" for an API token), written on every
# audit entry made while it is set (``acting_via``). A context variable, not a thread-local:
# it follows the request through asgiref's thread hops and is never left behind for the next
# request a worker thread serves.
_via: ContextVar[str] = ContextVar("audit_via", default="")


@contextmanager
def acting_via(how: str):
    """Within this block, audit entries say the actor acted via ``how``."""
    reset = _via.set(how)
    try:
        yield
    finally:
        _via.reset(reset)


def audit(
    actor,
    action: str,
    obj: models.Model | None = None,
    *,
    before: dict | None = None,
    after: dict | None = None,
    remote_addr: str | None = None,
) -> AuditEntry:
    """Append one entry to the audit log. ``actor`` None means the system (scheduler, worker).
    Secret values in ``before``/``after`` are masked before they are written: the log, its
    pages and its exports never hold them."""
    user = actor if getattr(actor, "is_authenticated", False) else None
    return AuditEntry.objects.create(
        actor=user,
        actor_name=user.get_username() if user else "",
        action=action,
        content_type=ContentType.objects.get_for_model(obj) if obj is not None else None,
        object_id=str(obj.pk) if obj is not None else "",
        object_repr=str(obj)[:200] if obj is not None else "",
        before=redact(before),
        after=redact(after),
        remote_addr=remote_addr,
        via=_via.get(),
    )


# --- Reading the audit log: filters, page rows, exports -------------------------------------

AUDIT_EXPORT_COLUMNS = (
    "id",
    "created_at",
    "actor",
    "action",
    "object_type",
    "object_id",
    "object",
    "before",
    "after",
    "remote_addr",
    "via",
)
AUDIT_EXPORT_LIMIT = 100_000  # the JSON export is built in memory
AUDIT_VALUE_CHARS = 80
# A spreadsheet runs a cell that starts with one of these as a formula (OWASP CSV injection).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def audit_entries(criteria: dict) -> models.QuerySet:
    """Audit entries matching ``criteria`` (the cleaned filters, every key optional), newest
    first. ``actor``: a username, "" for the system, None for anyone; ``object_type``:
    "app_label.model"; ``date_from``/``date_to``: dates, both inclusive, in the current zone.
    """
    entries = AuditEntry.objects.select_related("content_type")
    if criteria.get("action"):
        entries = entries.filter(action__startswith=criteria["action"])
    if criteria.get("actor") is not None:
        entries = entries.filter(actor_name=criteria["actor"])
    if criteria.get("object_type"):
        app_label, _, model = criteria["object_type"].partition(".")
        entries = entries.filter(content_type__app_label=app_label, content_type__model=model)
        if criteria.get("object_id"):
            entries = entries.filter(object_id=criteria["object_id"])
    if criteria.get("q"):
        entries = entries.filter(object_repr__icontains=criteria["q"])
    tz = timezone.get_current_timezone()
    if criteria.get("date_from"):
        entries = entries.filter(
            created_at__gte=datetime.combine(criteria["date_from"], time.min, tz)
        )
    if criteria.get("date_to"):
        # Before the next midnight: the whole "to" day, however fine the timestamps.
        next_day = criteria["date_to"] + timedelta(days=1)
        entries = entries.filter(created_at__lt=datetime.combine(next_day, time.min, tz))
    return entries.order_by("-created_at", "-pk")


def _object_type(entry: AuditEntry) -> str:
    ct = entry.content_type
    return f"{ct.app_label}.{ct.model}" if ct else ""


def audit_object_url(entry: AuditEntry) -> str | None:
    """The page of the entry's object, or None (no page, or no object).

    The object's own ``get_absolute_url()``, called on a stand-in that carries only the stored
    id, so the log knows no app's pages and a page of entries needs no query per row. A model
    whose URL needs more than its pk raises here and stays unlinked.
    """
    ct = entry.content_type
    model = ct.model_class() if ct else None
    if model is None or not entry.object_id or not hasattr(model, "get_absolute_url"):
        return None
    try:
        return model(pk=entry.object_id).get_absolute_url()
    except (NoReverseMatch, ObjectDoesNotExist):
        return None


def _short(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, cls=DjangoJSONEncoder)
    if len(text) > AUDIT_VALUE_CHARS:
        return text[: AUDIT_VALUE_CHARS - 1] + "…"
    return text


def audit_changes(entry: AuditEntry) -> list[dict]:
    """The changed fields as {field, before, after}, values shortened for a table cell;
    None where the field is absent on that side (created, deleted, or not recorded)."""

    def as_dict(value) -> dict:
        if value is None:
            return {}
        return value if isinstance(value, dict) else {"value": value}

    # Masked again when read: entries written before secrets were masked at write time.
    before, after = as_dict(redact(entry.before)), as_dict(redact(entry.after))
    missing = object()
    rows = []
    for field in sorted(set(before) | set(after)):
        old, new = before.get(field, missing), after.get(field, missing)
        if old == new:
            continue
        rows.append(
            {
                "field": field,
                "before": None if old is missing else _short(old),
                "after": None if new is missing else _short(new),
            }
        )
    return rows


def audit_page_rows(entries) -> list[AuditEntry]:
    """Entries of one page, each given ``url`` and ``changes`` for the table (no queries)."""
    rows = list(entries)
    for entry in rows:
        entry.url = audit_object_url(entry)
        entry.changes = audit_changes(entry)
    return rows


def audit_export_record(entry: AuditEntry) -> dict:
    """One entry as exported; ``actor`` is "" for the system, as stored."""
    return {
        "id": entry.pk,
        "created_at": entry.created_at.isoformat(),
        "actor": entry.actor_name,
        "action": entry.action,
        "object_type": _object_type(entry),
        "object_id": entry.object_id,
        "object": entry.object_repr,
        "before": redact(entry.before),
        "after": redact(entry.after),
        "remote_addr": entry.remote_addr,
        "via": entry.via,
    }


def _csv_cell(value) -> str:
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text


class _Echo:
    """A file-like that hands back what csv.writer writes, so rows stream one by one."""

    def write(self, value: str) -> str:
        return value


def audit_csv_lines(entries: models.QuerySet) -> Iterator[str]:
    """CSV text of ``entries``, header first, one line at a time; before/after as JSON."""
    writer = csv.writer(_Echo())
    yield writer.writerow(AUDIT_EXPORT_COLUMNS)
    for entry in entries.iterator(chunk_size=2000):
        record = audit_export_record(entry)
        for key in ("before", "after"):
            value = record[key]
            record[key] = "" if value is None else json.dumps(value, cls=DjangoJSONEncoder)
        yield writer.writerow([_csv_cell(record[col]) for col in AUDIT_EXPORT_COLUMNS])


def audit_json_export(entries: models.QuerySet, filters: dict) -> dict:
    """The JSON export: the filters, the entries (at most AUDIT_EXPORT_LIMIT, newest first)
    and whether the limit cut some off."""
    records = []
    truncated = False
    for entry in entries[: AUDIT_EXPORT_LIMIT + 1].iterator(chunk_size=2000):
        if len(records) == AUDIT_EXPORT_LIMIT:
            truncated = True
            break
        records.append(audit_export_record(entry))
    return {
        "filters": filters,
        "count": len(records),
        "truncated": truncated,
        "limit": AUDIT_EXPORT_LIMIT,
        "entries": records,
    }


def audit_export_filename(extension: str) -> str:
    return f"audit-{timezone.localtime():%Y%m%d-%H%M}.{extension}"
