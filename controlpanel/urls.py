"""URL map of the whole panel (project wiring).

Every app's URLs are included by module name, so this base app imports none of them; the pages
that span the apps (the dashboard, the cost page) come from the top app, ``home``.
"""

from django.contrib import admin
from django.urls import include, path, re_path

from controlpanel import views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("audit/", views.audit_log, name="audit"),
    re_path(r"^audit/export\.(?P<fmt>csv|json)$", views.audit_export, name="audit_export"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("hosts/", include("hosts.urls")),
    path("benchmarks/", include("benchmarks.urls")),
    path("changes/", include("changes.urls")),
    path("", include("home.urls")),
]
