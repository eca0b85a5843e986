"""A change that sets the engine's API key is checked for health with the key it just set:
the engine refuses the old one, so asking with the running config's key rolled every such
change back (issue 38)."""

from __future__ import annotations

import json

import pytest

from changes.services import verification
from tests.factories import make_config, make_deployment, make_host
from tests.httpserver import Handler, serve

pytestmark = pytest.mark.django_db


@pytest.fixture
def engine_with_key():
    """An engine that answers /health and /v1/models only with ``Bearer new-key``."""

    class Engine(Handler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            if self.headers.get("Authorization") != "Bearer new-key":
                self.reply(401)
            elif self.path == "/health":
                self.reply(200)
            else:
                models = {"object": "list", "data": [{"id": "m", "object": "model"}]}
                self.reply(200, json.dumps(models).encode())

    with serve(Engine) as port:
        yield port


def test_health_asks_with_the_key_of_the_config_just_applied(engine_with_key, settings):
    settings.CHANGE_HEALTH_TIMEOUT = 1
    deployment = make_deployment(make_host(address="127.0.0.1"), port=engine_with_key, model="m")
    running = make_config(deployment, {"api_key": "old-key"})
    deployment.active_config = running
    deployment.save()
    applied = make_config(deployment, {"api_key": "new-key"})
    assert verification.health_problem(deployment, applied) is None
    # The running config's key, as before: the engine refuses it.
    assert "401" in (verification.health_problem(deployment) or "")
