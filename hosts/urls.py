from django.urls import path

from hosts import views, views_deployments, views_onboarding

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
    path("<int:pk>/deployments/new/", views_deployments.deployment_new, name="deployment_new"),
    path(
        "deployments/<int:pk>/review/",
        views_deployments.deployment_review,
        name="deployment_review",
    ),
    path("<int:pk>/onboard/", views_onboarding.onboard, name="onboard"),
    path("<int:pk>/onboard/status/", views_onboarding.onboard_status, name="onboard_status"),
    path("<int:pk>/onboard/token/", views_onboarding.onboard_token, name="onboard_token"),
    path(
        "<int:pk>/onboard/fetch-certificate/",
        views_onboarding.onboard_fetch_certificate,
        name="onboard_fetch_certificate",
    ),
    path("<int:pk>/onboard/pin/", views_onboarding.onboard_pin, name="onboard_pin"),
    path("<int:pk>/onboard/ssh-key/", views_onboarding.onboard_ssh_key, name="onboard_ssh_key"),
    path(
        "<int:pk>/onboard/accept-key/",
        views_onboarding.onboard_accept_key,
        name="onboard_accept_key",
    ),
    path("<int:pk>/agent.pyz", views_onboarding.agent_download, name="agent_download"),
    path("deployments/<int:pk>/restart/", views.deployment_restart, name="restart"),
    path("operations/<int:pk>/", views.operation_detail, name="operation"),
]
