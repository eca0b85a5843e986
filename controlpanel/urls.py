"""URL map of the whole panel (project wiring).

Every app's URLs are included by module name, so this base app imports none of them; the pages
that span the apps (the dashboard, the cost page) come from the top app, ``home``.
"""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path

from controlpanel import accounts, views

# django.contrib.auth.urls, spelled out: the reset pages exist only while mail goes out
# through a mail server (controlpanel/accounts.py).
account_patterns = [
    path("login/", accounts.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("password_change/", auth_views.PasswordChangeView.as_view(), name="password_change"),
    path(
        "password_change/done/",
        auth_views.PasswordChangeDoneView.as_view(),
        name="password_change_done",
    ),
    path("password_reset/", accounts.password_reset, name="password_reset"),
    path("password_reset/done/", accounts.password_reset_done, name="password_reset_done"),
    path(
        "reset/<uidb64>/<token>/",
        accounts.password_reset_confirm,
        name="password_reset_confirm",
    ),
    path("reset/done/", accounts.password_reset_complete, name="password_reset_complete"),
]

# An unexpected error under /api/v1/ outside a DRF view's handling is problem details too.
handler500 = "api.errors.server_error"

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("audit/", views.audit_log, name="audit"),
    re_path(r"^audit/export\.(?P<fmt>csv|json)$", views.audit_export, name="audit_export"),
    path("accounts/", include(account_patterns)),
    path("admin/", admin.site.urls),
    path("hosts/", include("hosts.urls")),
    path("benchmarks/", include("benchmarks.urls")),
    path("changes/", include("changes.urls")),
    path("scaling/", include("scaling.urls")),
    path("api/", include("api.urls")),
    path("", include("api.metrics_urls")),  # /metrics
    path("", include("home.urls")),
]
