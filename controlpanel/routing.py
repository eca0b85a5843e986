"""WebSocket routes of every app, wired together here (the one place allowed to import upward)."""

from django.urls import path

from hosts.consumers import HostConsumer

websocket_urlpatterns = [
    path("ws/hosts/<int:pk>/", HostConsumer.as_asgi()),
]
