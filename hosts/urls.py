from django.urls import path

from hosts import views

app_name = "hosts"
urlpatterns = [
    path("", views.host_list, name="list"),
    path("new/", views.host_create, name="create"),
    path("<int:pk>/", views.host_detail, name="detail"),
    path("<int:pk>/edit/", views.host_edit, name="edit"),
    path("<int:pk>/check/", views.host_check, name="check"),
    path("<int:pk>/checks/", views.host_checks, name="checks"),
    path("<int:pk>/part/<slug:part>/", views.host_part, name="part"),
    path("<int:pk>/telemetry/", views.host_telemetry, name="telemetry"),
    path("<int:pk>/accept-key/", views.host_accept_key, name="accept_key"),
    path("deployments/<int:pk>/restart/", views.deployment_restart, name="restart"),
    path("operations/<int:pk>/", views.operation_detail, name="operation"),
]
