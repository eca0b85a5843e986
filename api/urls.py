"""``/api/v1/``: the resources, the OpenAPI schema and its docs; ``/api/tokens/``: the page.

DRF marks its views exempt from the login middleware: it authenticates them itself (Bearer
token or the session) and answers 401/403 as problem details instead of redirecting."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from api import pages
from api.views import account, advisor, changes, fleet, quality, runs, scaling, sweeps

app_name = "api"


v1 = [
    path("me/", account.MeView.as_view(), name="me"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    *fleet.urlpatterns,
    *runs.urlpatterns,
    *changes.urlpatterns,
    *advisor.urlpatterns,
    *sweeps.urlpatterns,
    *quality.urlpatterns,
    *scaling.urlpatterns,
    # Last: whatever else is asked under /api/v1/ is a problem-details 404.
    re_path(r"^.*$", account.NotFoundView.as_view(), name="not-found"),
]

urlpatterns = [
    # A page for people: a signed-out visitor goes to the login page like everywhere else.
    # (DRF marks its views login_not_required: the redirect is asked for here.) Before the
    # resources, whose last pattern answers every other path under v1/.
    path(
        "v1/docs/",
        login_required(SpectacularSwaggerView.as_view(url_name="api:schema")),
        name="docs",
    ),
    path("v1/", include(v1)),
    path("tokens/", pages.token_list, name="tokens"),
    path("tokens/<int:pk>/revoke/", pages.token_revoke, name="token_revoke"),
]
