"""The admin of models the panel edits under review and audit: view-only there.

An edit in Django's admin would skip the panel's approvals and leave nothing in /audit/ (a
deployment's model changed in the admin is a change nobody reviewed). So these models are
shown, searchable and filterable, but not added or changed in the admin; each page says where
to edit instead. The few that may still be deleted there (a host or deployment taken out of
service: the panel has no delete for them) are deleted with an audit entry, as the panel's own
deletes are."""

from __future__ import annotations

from django.contrib import admin

from controlpanel.forms import ADMIN_JSON_FIELDS
from controlpanel.services import acting_via, audit

READ_ONLY_NOTE = "Read-only here: edit in the panel, where it is reviewed and audited."


class AuditedReadOnlyAdmin(admin.ModelAdmin):
    """View-only; ``deletable``: an Admin may delete, audited as ``<model>.delete``."""

    change_form_template = "admin/audited_change_form.html"
    change_list_template = "admin/audited_change_list.html"
    deletable = False
    # Nothing is edited here today; should a subclass allow it, JSON typed in goes through the
    # pages' parser (no NUL, no deep nesting, no NaN).
    formfield_overrides = ADMIN_JSON_FIELDS

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return self.deletable and super().has_delete_permission(request, obj)

    def get_deleted_objects(self, objs, request):
        # The records that go with a deleted host (its GPUs, deployments, configs) are
        # view-only on their own, which would block the cascade: they go with it, under its
        # audit entry. What the database protects stays protected.
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        return deleted, counts, set() if self.deletable else perms_needed, protected

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        extra_context = {**(extra_context or {}), "readonly_note": READ_ONLY_NOTE}
        return super().changeform_view(request, object_id, form_url, extra_context)

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}), "readonly_note": READ_ONLY_NOTE}
        return super().changelist_view(request, extra_context)

    def delete_model(self, request, obj):
        self._audit_delete(request, [obj])
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        self._audit_delete(request, list(queryset))
        super().delete_queryset(request, queryset)

    def _audit_delete(self, request, objects) -> None:
        action = f"{self.model._meta.model_name}.delete"
        with acting_via("admin"):
            for obj in objects:
                audit(
                    request.user,
                    action,
                    obj,
                    before={"object": str(obj)},
                    remote_addr=request.META.get("REMOTE_ADDR"),
                )


class ReadOnlyInline(admin.TabularInline):
    """An inline of a view-only parent: shown, never edited there."""

    extra = 0

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
