"""The panel's short-lived HTTP clients verify against one TLS context a process
(hosts.transport.tls): building one per client loaded certifi's CA bundle each time, about 20 ms
of CPU, and the engine-signal poll alone built one every few seconds per panel."""

from __future__ import annotations

import ssl
from types import SimpleNamespace

import httpx
import pytest

from benchmarks.gate import Panel
from benchmarks.loadgen.transport import FastTransport
from hosts.transport.tls import system_trust
from scaling.services import signals


@pytest.fixture
def contexts_built(monkeypatch):
    """How many SSL contexts were made from here on (the shared one made first)."""
    system_trust()
    made = []
    real = ssl.create_default_context

    def counting(*args, **kwargs):
        made.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    return made


def test_the_context_is_made_once_a_process_and_verifies():
    context = system_trust()
    assert context is system_trust()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_a_stock_httpx_client_builds_a_context_each_time(contexts_built):
    # What the shared context saves: the check below would pass vacuously if httpx stopped.
    httpx.Client().close()
    assert len(contexts_built) == 1


def test_the_signal_poll_builds_no_context(contexts_built, monkeypatch):
    deployment = SimpleNamespace(api_key=lambda: None, metrics_url="http://127.0.0.1:9/metrics")
    (answer,) = signals._scrape_all([deployment])
    assert answer[1] is None and answer[2][0] == "ConnectError"
    assert contexts_built == []


def test_the_gate_and_the_load_generator_build_no_context(contexts_built):
    Panel("http://127.0.0.1:9", "token").close()
    FastTransport()
    assert contexts_built == []
