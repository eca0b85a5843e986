"""WebSocket routes of every app, wired in the top app (the ASGI entry point reads them)."""

from django.urls import path, re_path

from benchmarks.consumers import ProbeConsumer, RunConsumer
from changes.consumers import (
    ChangeConsumer,
    DeploymentAdvisorConsumer,
    FleetAdvisorConsumer,
    SweepConsumer,
)
from controlpanel.consumers import NoRouteConsumer
from hosts.consumers import HostConsumer

websocket_urlpatterns = [
    path("ws/hosts/<int:pk>/", HostConsumer.as_asgi()),
    path("ws/benchmarks/<int:pk>/", RunConsumer.as_asgi()),
    path("ws/probes/<int:pk>/", ProbeConsumer.as_asgi()),
    path("ws/changes/<int:pk>/", ChangeConsumer.as_asgi()),
    path("ws/sweeps/<int:pk>/", SweepConsumer.as_asgi()),
    path("ws/deployments/<int:pk>/", DeploymentAdvisorConsumer.as_asgi()),
    path("ws/advisor/", FleetAdvisorConsumer.as_asgi(), {"pk": "fleet"}),
    # Last: any other path (a bad id such as /ws/hosts/abc/) is refused instead of raising.
    re_path(r"", NoRouteConsumer.as_asgi()),
]
