"""Launch configs and their renderers refuse anything that could smuggle an option or a
command: every engine flag, config field, environment name and renderer argument, and nothing
they build goes through a shell."""

import os
import subprocess

import pytest

from hosts.engines import get_spec, launch
from hosts.engines.launch import (
    LaunchError,
    Placement,
    render_docker,
    render_process,
    render_systemd,
)
from tests.hosts.launch_configs import errors_of, sglang, vllm

# --- injection ----------------------------------------------------------------------------------

BAD = ["x; rm -rf /", "$(reboot)", "`id`", "a b", "--evil", "-x", "foo\nbar", "a|b", "a&&b", ">out"]
ALL_FLAGS = [(engine, flag) for engine in ("vllm", "sglang") for flag in get_spec(engine).flags]


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize(("engine", "flag"), ALL_FLAGS, ids=[f"{e}-{f.dest}" for e, f in ALL_FLAGS])
def test_every_flag_refuses_injection(engine, flag, bad):
    """Parametrized over the tables: a flag added tomorrow is covered too."""
    make = vllm if engine == "vllm" else sglang
    # The flag's own version range, so the refusal is about the value, not the version.
    version = flag.since or ("0.10.0" if flag.until else None)
    field = f"settings.{flag.dest}"
    errors = errors_of(
        lambda: render_process(make(settings={flag.dest: bad}, engine_version=version))
    )
    assert field in errors
    # The engine's own wording names the option (argument --x: ...); reserved names say whose
    # field they are.
    assert flag.option in errors[field] or flag.dest in launch.RESERVED_SETTINGS


CONFIG_FIELDS = {
    "model": lambda bad: vllm(model=bad),
    "host": lambda bad: vllm(host=bad),
    "port": lambda bad: vllm(port=bad),
    "engine_version": lambda bad: vllm(engine_version=bad),
    "runner": lambda bad: vllm(runner=bad),
    "engine": lambda bad: vllm(engine=bad),
    "placement.cpus": lambda bad: vllm(placement=Placement(cpus=bad)),
    "placement.numa_node": lambda bad: vllm(placement=Placement(numa_node=bad)),
    "env.NCCL_SOCKET_IFNAME": lambda bad: vllm(env={"NCCL_SOCKET_IFNAME": bad}),
    "env.CUDA_VISIBLE_DEVICES": lambda bad: vllm(env={"CUDA_VISIBLE_DEVICES": bad}),
    "simulator.gpu": lambda bad: vllm(runner="simulator", simulator={"gpu": bad}),
    "simulator.num_gpus": lambda bad: vllm(runner="simulator", simulator={"num_gpus": bad}),
    "simulator.startup_seconds": lambda bad: vllm(
        runner="simulator", simulator={"startup_seconds": bad}
    ),
    "simulator.time_scale": lambda bad: vllm(runner="simulator", simulator={"time_scale": bad}),
    "simulator.seed": lambda bad: sglang(runner="simulator", simulator={"seed": bad}),
}


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("field", CONFIG_FIELDS)
def test_every_config_field_refuses_injection(field, bad):
    cfg = CONFIG_FIELDS[field](bad)
    for render in (
        lambda: render_process(cfg),
        lambda: render_docker(cfg, name="a"),
        lambda: render_systemd(cfg, unit_name="a.service", env_file="/etc/a.env"),
    ):
        with pytest.raises(LaunchError) as exc:
            render()
        assert field in exc.value.errors and field in str(exc.value)


@pytest.mark.parametrize("bad", BAD)
def test_env_names_refuse_injection(bad):
    errors = errors_of(lambda: render_process(vllm(env={bad: "1", f"VLLM_{bad}": "1"})))
    assert {f"env.{bad}", f"env.VLLM_{bad}"} <= set(errors)


RENDERER_FIELDS = {
    "python": lambda bad: render_process(vllm(), python=bad),
    "name": lambda bad: render_docker(vllm(), name=bad),
    "image": lambda bad: render_docker(vllm(), name="a", image=bad),
    "unit_name": lambda bad: render_systemd(vllm(), unit_name=bad, env_file="/etc/a.env"),
    "unit_name.service": lambda bad: render_systemd(
        vllm(), unit_name=f"{bad}.service", env_file="/etc/a.env"
    ),
    "env_file": lambda bad: render_systemd(vllm(), unit_name="a.service", env_file=bad),
    "env_file.abs": lambda bad: render_systemd(vllm(), unit_name="a.service", env_file=f"/{bad}"),
    "user": lambda bad: render_systemd(vllm(), unit_name="a.service", env_file="/a", user=bad),
    "python.systemd": lambda bad: render_systemd(
        sglang(), unit_name="a.service", env_file="/a", python=bad
    ),
}


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("case", RENDERER_FIELDS)
def test_every_renderer_argument_refuses_injection(case, bad):
    field = case.split(".")[0]
    with pytest.raises(LaunchError) as exc:
        RENDERER_FIELDS[case](bad)
    assert field in exc.value.errors and field in str(exc.value)


@pytest.mark.parametrize(
    "path", ["etc/a.env", "/etc/../root/.ssh/authorized_keys", "/etc/./a", "/etc/a%n"]
)
def test_env_file_must_be_a_plain_absolute_path(path):
    assert "env_file" in errors_of(
        lambda: render_systemd(vllm(), unit_name="a.service", env_file=path)
    )


def test_nothing_runs_a_shell(monkeypatch):
    """The renderers build lists of separate items and start nothing."""

    def forbidden(*args, **kwargs):
        raise AssertionError("a renderer tried to run something")

    for name in ("Popen", "run", "call", "check_call", "check_output"):
        monkeypatch.setattr(subprocess, name, forbidden)
    monkeypatch.setattr(os, "system", forbidden)
    monkeypatch.setattr(os, "popen", forbidden)
    tricky = vllm(model="org/model=1,2:3", settings={"api_key": "k=v,w"})
    process = render_process(tricky)
    docker = render_docker(tricky, name="a")
    unit = render_systemd(tricky, unit_name="a.service", env_file="/etc/a.env")
    assert isinstance(process.argv, tuple) and isinstance(docker, list)
    for argv in (process.argv, docker):
        assert all(isinstance(item, str) for item in argv)
        # Each value stays one item: never split on, or joined with, spaces.
        assert "org/model=1,2:3" in argv and "k=v,w" in argv
        assert not any(" " in item for item in argv)
    assert isinstance(unit.unit_text, str)
