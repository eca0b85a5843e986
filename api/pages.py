"""The "API tokens" page: each user makes, sees and revokes their own tokens."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from api import tokens
from api.models import ApiToken


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What uses it, e.g. “ci-nightly”.")
    expires_days = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=tokens.MAX_EXPIRY_DAYS,
        label="Expires after (days)",
        help_text="Empty: never (revoke it when it is no longer used).",
    )


def token_list(request):
    form = TokenForm(request.POST or None)
    created = None
    if request.method == "POST" and form.is_valid():
        try:
            token, raw = tokens.issue(
                request.user,
                form.cleaned_data["name"],
                form.cleaned_data["expires_days"],
                actor=request.user,
            )
        except tokens.TokenRefused as exc:
            form.add_error("name", str(exc))
        else:
            # Shown in this response only: the panel keeps its hash, not the token.
            created = {"token": token, "raw": raw}
            form = TokenForm()
    rows = ApiToken.objects.filter(user=request.user)
    return render(request, "api/tokens.html", {"form": form, "tokens": rows, "created": created})


@require_POST
def token_revoke(request, pk):
    token = get_object_or_404(ApiToken, pk=pk, user=request.user)
    tokens.revoke(request.user, token)
    messages.success(request, f"Token “{token.name}” revoked: it authenticates nothing from now.")
    return redirect("api:tokens")
