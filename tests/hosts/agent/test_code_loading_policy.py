"""Issue 14 items 2 and 3 on a real agent (``python -m hosts.agent``) over its HTTP API: it
refuses the environment variables and the code-loading flags the attack got through, whatever
the panel sends, unless it was started with --allow-code-loading; and its log never holds the
engine's API key."""

from __future__ import annotations

import pytest

from hosts.engines.redaction import MASK
from tests.conftest import free_port
from tests.hosts.agent.test_engines import apply, apply_and_wait, sim_config

pytestmark = pytest.mark.integration

SECRET = "sk-live-S3CRET-agent-log"


def test_the_agent_refuses_variables_that_load_code(start_agent):
    agent = start_agent("--simulate", "h100-sxm:1")
    port = free_port()
    with agent.client() as client:
        for name in (
            "CUDA_INJECTION64_PATH",
            "VLLM_LOGGING_CONFIG_PATH",
            "NCCL_NET_PLUGIN",
            "HF_HOME",
            "LD_PRELOAD",
            "PYTHONPATH",
        ):
            response = apply(client, "llama", {**sim_config(port), "env": {name: "/tmp/x"}})
            assert response.status_code == 400, name
            assert f"{name} is not allowed" in response.json()["error"]
        assert client.get("/v1/engines").json() == {"engines": {}}


def test_trust_remote_code_needs_the_agents_opt_in(start_agent):
    config = sim_config(free_port(), trust_remote_code=True)
    default = start_agent("--simulate", "h100-sxm:1")
    with default.client() as client:
        response = apply(client, "llama", config)
        assert response.status_code == 400
        assert "--allow-code-loading" in response.json()["error"]
        assert client.get("/v1/engines").json() == {"engines": {}}

    opted_in = start_agent("--simulate", "h100-sxm:1", "--allow-code-loading")
    with opted_in.client() as client:
        assert apply_and_wait(client, "llama", config)["state"] == "ready"


def test_the_agents_log_never_holds_the_api_key(start_agent):
    agent = start_agent("--simulate", "h100-sxm:1")
    with agent.client() as client:
        op = apply_and_wait(client, "llama", sim_config(free_port(), api_key=SECRET))
        assert op["state"] == "ready", op
        steps = "\n".join(op["steps"])
        logs = "\n".join(client.get("/v1/engines/llama/logs").json()["lines"])
    log = agent.log()
    assert f"--api-key {MASK}" in log and f"--api-key {MASK}" in steps
    for where, text in {"agent log": log, "steps": steps, "engine log": logs}.items():
        assert SECRET not in text, where
