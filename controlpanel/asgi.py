"""ASGI entry point: HTTP through Django, WebSockets through Channels.

Project wiring: the one module of the base app that reaches up, to the top app's WebSocket
routes (stated as an exception in the import-linter contracts of ``pyproject.toml``).
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")
# Django must be set up before the consumers (and the models they import) load; what
# django.core.asgi.get_asgi_application does, with the handler that runs each request's
# middleware chain and view in one thread hop (controlpanel.onethread).
django.setup(set_prefix=False)

from controlpanel.onethread import OneHopASGIHandler  # noqa: E402

django_asgi_app = OneHopASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from controlpanel.admission import Admission  # noqa: E402
from home.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # At most WEB_MAX_IN_FLIGHT requests in Django at once per process; the rest wait up to
        # WEB_QUEUE_SECONDS, then get a 503 (controlpanel.admission).
        "http": Admission(django_asgi_app, settings.WEB_MAX_IN_FLIGHT, settings.WEB_QUEUE_SECONDS),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
