"""The API asks for the same permission the matching page asks for."""

from __future__ import annotations

from rest_framework.permissions import BasePermission

READ_METHODS = ("GET", "HEAD", "OPTIONS")


def required_permission(view, request) -> str | None:
    """The permission ``view`` needs for this request: ``view.permissions`` maps a viewset's
    action (``list``, ``create``, ``cancel`` …) or, for plain views, the HTTP method to a
    permission codename; "" means any signed-in user. A request the map does not name is
    refused (fail closed), so a new action cannot slip out unguarded."""
    table = getattr(view, "permissions", None) or {}
    action = getattr(view, "action", None)
    if request.method == "OPTIONS":
        # DRF's metadata (what the endpoint accepts): whoever may read the resource.
        for key in ("list", "retrieve", "GET", "read"):
            if key in table:
                return table[key]
        return None
    if action and action in table:
        return table[action]
    if request.method in table:
        return table[request.method]
    if request.method in READ_METHODS and "read" in table:
        return table["read"]
    return None


class PanelPermission(BasePermission):
    """Signed in (token or session) and holding the page's permission."""

    message = "Your role does not allow this."

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not user or not user.is_authenticated:
            return False
        perm = required_permission(view, request)
        if perm is None:
            return False
        return perm == "" or user.has_perm(perm)
