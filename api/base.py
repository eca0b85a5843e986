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
