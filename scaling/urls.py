from django.urls import path, re_path

from scaling import views, views_whatif

app_name = "scaling"

urlpatterns = [
    path("", views.fleet, name="fleet"),
    path("deployments/<int:pk>/", views.deployment, name="deployment"),
    path("deployments/<int:pk>/policy/", views.policy_edit, name="policy"),
    path("deployments/<int:pk>/signals.json", views.signals_json, name="signals_json"),
    re_path(
        r"^deployments/(?P<pk>\d+)/export/(?P<kind>keda\.yaml|alerts\.yaml|grafana\.json)$",
        views.export,
        name="export",
    ),
    path("deployments/<int:pk>/what-if/", views_whatif.new, name="whatif_new"),
    path("what-if/<int:pk>/", views_whatif.detail, name="whatif"),
    path("what-if/<int:pk>/status.json", views_whatif.status, name="whatif_status"),
]
