"""URL map of the whole panel."""

from django.contrib import admin
from django.urls import include, path, re_path

from benchmarks.views import cost as cost_views
from controlpanel import views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("healthz", views.healthz, name="healthz"),
    path("audit/", views.audit_log, name="audit"),
    re_path(r"^audit/export\.(?P<fmt>csv|json)$", views.audit_export, name="audit_export"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("hosts/", include("hosts.urls")),
    path("benchmarks/", include("benchmarks.urls")),
    path("changes/", include("changes.urls")),
    path("cost/", cost_views.cost, name="cost"),
]
