"""What the agent agrees to execute: the allow-list, the placement wrappers, the environment."""

from __future__ import annotations

import shutil
import sys

import pytest

from hosts.agent.policy import (
    ExecPolicy,
    ExecRefused,
    check_config_env,
    child_env,
    mask_argv,
)

pytestmark = pytest.mark.integration

SIM = [sys.executable, "-m", "hosts.simulator", "vllm", "org/model", "--port", "8001"]
needs_wrappers = pytest.mark.skipif(
    not (shutil.which("numactl") and shutil.which("taskset")), reason="numactl/taskset missing"
)


def test_default_allows_the_simulator_with_this_python():
    assert ExecPolicy().check(SIM) == SIM


def test_default_refuses_other_programs_and_other_modules():
    policy = ExecPolicy()
    for argv in (
        ["/bin/sh", "-c", "echo hi"],
        [sys.executable, "-c", "print(1)"],
        [sys.executable, "-m", "http.server"],
        ["python3", "-m", "pip", "install", "x"],
        ["bash"],
    ):
        with pytest.raises(ExecRefused, match="not on this agent's allow-list"):
            policy.check(argv)


def test_a_name_entry_does_not_match_another_file_of_that_name(tmp_path):
    fake = tmp_path / "vllm"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    with pytest.raises(ExecRefused, match="allow-list"):
        ExecPolicy().check([str(fake), "serve", "m"])


def test_an_allowed_program_that_is_not_installed_says_so():
    if shutil.which("vllm"):
        pytest.skip("vllm is installed here")
    with pytest.raises(ExecRefused, match="'vllm' was not found on the agent's PATH"):
        ExecPolicy().check(["vllm", "serve", "org/model"])


def test_allow_exec_replaces_the_default_and_may_require_leading_args(tmp_path):
    true = shutil.which("true")
    policy = ExecPolicy([true, "python3 -m sglang.launch_server"])
    assert policy.check([true, "x"]) == [true, "x"]
    with pytest.raises(ExecRefused):
        policy.check(SIM)
    with pytest.raises(ExecRefused):
        policy.check(["python3", "-m", "other"])
    with pytest.raises(ValueError):
        ExecPolicy([""])


@needs_wrappers
def test_placement_wrappers_are_resolved_and_their_options_checked():
    policy = ExecPolicy()
    argv = ["numactl", "--cpunodebind=0", "--membind", "0", "taskset", "-c", "0-3,8", *SIM]
    out = policy.check(argv)
    assert out[0] == shutil.which("numactl") and out[4] == shutil.which("taskset")
    assert out[7:] == SIM
    for bad in (
        ["numactl", "--cpunodebind=0", "/bin/sh"],  # the wrapped program is checked too
        ["numactl", "--cpunodebind=$(id)", *SIM],
        ["numactl", "--preferred", "-x", *SIM],
        ["numactl", "--show", *SIM],
        ["taskset", "-p", "1", *SIM],
        ["taskset", "-c", "-x", *SIM],
        ["numactl", "--membind=0"],
    ):
        with pytest.raises(ExecRefused):
            policy.check(bad)


def test_config_env_may_not_change_what_gets_loaded():
    check_config_env({"CUDA_VISIBLE_DEVICES": "0,1", "HF_HUB_OFFLINE": "1"})
    for name in ("LD_PRELOAD", "PATH", "PYTHONPATH", "ld_library_path", "BASH_ENV"):
        with pytest.raises(ExecRefused, match=name):
            check_config_env({name: "x"})


def test_child_env_drops_secrets_and_loader_hooks():
    base = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "DJANGO_SECRET_KEY": "s",
        "AGENT_TOKEN": "t",
        "DB_PASSWORD": "p",
        "LD_PRELOAD": "/x.so",
        "HF_TOKEN": "hf",
    }
    env = child_env({"CUDA_VISIBLE_DEVICES": "1"}, base)
    assert env["PATH"] == "/usr/bin" and env["HF_TOKEN"] == "hf"
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    for gone in ("DJANGO_SECRET_KEY", "AGENT_TOKEN", "DB_PASSWORD", "LD_PRELOAD"):
        assert gone not in env


def test_mask_argv():
    """By the flag spec (Flag.secret), not by a substring of the option's name."""
    argv = [
        "vllm",
        "serve",
        "m",
        "--api-key",
        "sk-1",
        "--api-key=sk-2",
        "--max-num-batched-tokens",
        "8192",
    ]
    assert mask_argv(argv) == [
        "vllm",
        "serve",
        "m",
        "--api-key",
        "•••",
        "--api-key=•••",
        "--max-num-batched-tokens",
        "8192",
    ]
