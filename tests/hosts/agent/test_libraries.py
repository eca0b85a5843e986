"""The agent's /v1/info names the versions of the engines' Python packages it can see."""

from __future__ import annotations

import pytest

from tests.hosts.agent.packages import FAKE, expected, fake_site

pytestmark = pytest.mark.integration


def test_info_reports_the_library_versions_of_its_interpreter(start_agent, tmp_path, monkeypatch):
    # The agent's interpreter sees these packages (as a venv with vLLM and torch would).
    monkeypatch.setenv("PYTHONPATH", str(fake_site(tmp_path / "site")))
    agent = start_agent()
    with agent.client() as client:
        info = client.get("/v1/info").json()
    assert info["libraries"] == expected()
    assert {name: info["libraries"][name] for name in FAKE} == FAKE
