"""Issue 14 item 3: the environment a launch config may set is a list of named variables known
to be safe, and flags that load code are refused by the agent unless it opted in.

Each variable the attack got through (CUDA_INJECTION64_PATH, VLLM_LOGGING_CONFIG_PATH,
NCCL_NET_PLUGIN, HF_HOME) and the loader hooks are refused by the panel (the launch rules its
proposals go through) and by the agent, checked the way its server does (Supervisor.prepare,
which re-validates the config and checks the rendered environment and command again).
"""

from __future__ import annotations

import sys

import pytest

from changes.rules import ChangeRefused
from changes.services.facts import validate_proposal
from hosts.agent.engine import BadRequest
from hosts.agent.policy import ExecPolicy, ExecRefused, check_config_env
from hosts.agent.supervisor import Supervisor
from hosts.engines.environment import SAFE_ENV, env_problem
from hosts.engines.launch import LaunchConfig
from tests.factories import make_deployment, make_host
from tests.hosts.launch_configs import LLAMA, errors_of, vllm

# The variables the issue names (they reached the engine before), the loader hooks, and names
# a prefix rule (VLLM_*, NCCL_*, HF_*) used to let through.
REFUSED = {
    "CUDA_INJECTION64_PATH": "a library CUDA loads",
    "VLLM_LOGGING_CONFIG_PATH": "logging config file",
    "NCCL_NET_PLUGIN": "plugin library NCCL loads",
    "HF_HOME": "remote code are loaded from",
    "LD_PRELOAD": "libraries the engine loads",
    "LD_LIBRARY_PATH": "libraries the engine loads",
    "PYTHONPATH": "Python code",
    "PYTHONSTARTUP": "Python code",
    "VLLM_PLUGINS": "plugin packages",
    "HF_MODULES_CACHE": "remote code is imported from",
    "VLLM_SOMETHING_NEW": "not on the list of variables known to be safe",
    "NCCL_TOPO_FILE": "a topology file",
}


def sim_config(**kw) -> dict:
    return LaunchConfig(
        **{
            "engine": "vllm",
            "model": LLAMA,
            "settings": {"max_model_len": 8192},
            "port": 18001,
            "host": "127.0.0.1",
            "runner": "simulator",
            "simulator": {"gpu": "h100-sxm", "num_gpus": 1},
            **kw,
        }
    ).to_dict()


@pytest.fixture
def supervisor(tmp_path):
    """The agent's supervisor as its server builds it (the default policy), no process run."""
    return Supervisor(tmp_path / "state", ExecPolicy(), python=sys.executable)


@pytest.mark.parametrize(("name", "reason"), REFUSED.items())
def test_panel_refuses_variables_that_load_code_or_are_not_named(name, reason):
    errors = errors_of(vllm(env={name: "/opt/x/libhook.so"}).validated)
    assert reason in errors[f"env.{name}"]


@pytest.mark.django_db
@pytest.mark.parametrize("name", list(REFUSED))
def test_panel_refuses_them_in_a_proposal(name):
    deployment = make_deployment(make_host())
    with pytest.raises(ChangeRefused, match=f"env.{name}"):
        validate_proposal(deployment, {"max_num_seqs": 64}, {name: "/tmp/x"}, {})


@pytest.mark.parametrize(("name", "reason"), REFUSED.items())
def test_agent_refuses_them_whatever_the_panel_sends(supervisor, name, reason):
    with pytest.raises(BadRequest, match=name) as refused:
        supervisor.prepare("llama", sim_config(env={name: "/opt/x/libhook.so"}))
    assert reason in str(refused.value)
    # The agent's own check of the rendered environment, on its own.
    with pytest.raises(ExecRefused, match=name):
        check_config_env({name: "/opt/x/libhook.so"})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CUDA_VISIBLE_DEVICES", "0,1"),
        ("VLLM_ATTENTION_BACKEND", "FLASHINFER"),
        ("VLLM_USE_V1", "1"),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_P2P_DISABLE", "1"),
        ("NCCL_IB_DISABLE", "1"),
        ("OMP_NUM_THREADS", "8"),
        ("HF_HUB_OFFLINE", "1"),
        ("TOKENIZERS_PARALLELISM", "false"),
        ("HF_TOKEN", "hf_abc123"),
    ],
)
def test_named_safe_variables_pass_the_panel_and_the_agent(supervisor, name, value):
    assert name in SAFE_ENV
    assert vllm(env={name: value}).validated().env == {name: value}
    assert supervisor.prepare("llama", sim_config(env={name: value})).env == {name: value}


def test_safe_variables_still_have_their_values_checked():
    assert "expected one of VERSION, WARN, INFO, TRACE, ABORT" in env_problem("NCCL_DEBUG", "/x")
    assert "a number" in env_problem("OMP_NUM_THREADS", "eight")
    # A secret's refused value is not repeated.
    assert "hf a" not in env_problem("HF_TOKEN", "hf a")


def test_agent_refuses_code_loading_flags_unless_it_opted_in(tmp_path, supervisor):
    config = sim_config(settings={"max_model_len": 8192, "trust_remote_code": True})
    # The panel's launch rules accept it (an Admin approved the change) ...
    assert LaunchConfig.from_dict(config).validated().settings["trust_remote_code"] is True
    # ... the agent does not, unless whoever runs the host said so.
    with pytest.raises(BadRequest, match="--trust-remote-code .*--allow-code-loading"):
        supervisor.prepare("llama", config)
    opted_in = Supervisor(
        tmp_path / "opted-in", ExecPolicy(allow_code_loading=True), python=sys.executable
    )
    assert "--trust-remote-code" in opted_in.prepare("llama", config).argv
    # Turning it off, or leaving it unset, loads nothing: allowed everywhere.
    off = sim_config(settings={"max_model_len": 8192, "trust_remote_code": False})
    assert "--trust-remote-code" not in supervisor.prepare("llama", off).argv


@pytest.mark.parametrize("name", ["NCCL_DEBUG\n", "NCCL_DEBUG\nX=1", "\nNCCL_DEBUG"])
def test_a_name_with_a_line_break_is_not_a_name(name):
    """A name is matched whole: `$` alone would let a trailing newline through into a unit file
    or an environment block."""
    from hosts.engines.environment import env_problem

    assert "invalid variable name" in env_problem(name, "INFO")
