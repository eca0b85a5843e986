"""Launch configs: validation of every field, JSON round trip and the three renderings
(process, docker run, systemd unit). Refusal of anything that could smuggle an option or a
command is in test_engine_launch_injection.py."""

import json
import os
import shutil
import subprocess
import sys
import time

import httpx
import pytest

from hosts.engines.launch import (
    LaunchConfig,
    Placement,
    ProcessCommand,
    SystemdUnit,
    render_docker,
    render_process,
    render_systemd,
)
from hosts.simulator.__main__ import parse as simulator_parse
from tests.conftest import free_port
from tests.hosts.launch_configs import LLAMA, QWEN, errors_of, sglang, vllm
from tests.integration.processes import ROOT

# --- validation ---------------------------------------------------------------------------------


def test_validated_coerces_settings_and_returns_a_new_config():
    cfg = vllm(
        settings={"max_num_seqs": "64", "enable_prefix_caching": "false"},
        engine_version="0.11.0",
        env={"NCCL_DEBUG": "INFO"},
    )
    clean = cfg.validated()
    assert clean is not cfg and cfg.settings["max_num_seqs"] == "64"
    assert clean.settings == {"max_num_seqs": 64, "enable_prefix_caching": False}
    assert clean.env == {"NCCL_DEBUG": "INFO"} and clean.engine_version == "0.11.0"
    assert clean.validated() == clean


def test_every_bad_field_is_listed_at_once():
    cfg = LaunchConfig(
        engine="vllm",
        model="--evil",
        settings={"max_num_seqs": 0, "port": 9000, "api_key": "a b"},
        engine_version="latest",
        env={"LD_PRELOAD": "/tmp/x.so", "HF_HOME": "a;b"},
        placement=Placement(numa_node=-1, cpus="7-3"),
        port=70000,
        host="a b",
        runner="ssh",
        simulator={"gpu": "tpu", "num_gpus": 0, "warp": 9},
    )
    assert set(errors_of(cfg.validated)) == {
        "model",
        "settings.max_num_seqs",
        "settings.port",
        "settings.api_key",
        "engine_version",
        "env.LD_PRELOAD",
        "env.HF_HOME",
        "placement.numa_node",
        "placement.cpus",
        "port",
        "host",
        "runner",
        "simulator.gpu",
        "simulator.num_gpus",
        "simulator.warp",
    }


def test_unknown_engine():
    assert set(errors_of(LaunchConfig("tgi", LLAMA, {"x": 1}).validated)) == {"engine"}


@pytest.mark.parametrize("name", ["port", "host", "model"])
def test_launch_fields_are_not_settings(name):
    errors = errors_of(vllm(settings={name: "x"}).validated)
    assert errors == {f"settings.{name}": f"{name} is set by LaunchConfig.{name}, not in settings"}


def test_the_engine_version_reaches_the_flag_table():
    errors = errors_of(
        vllm(settings={"enable_log_requests": True}, engine_version="0.9.2").validated
    )
    assert "vllm serve 0.9.2 has no --enable-log-requests" in errors["settings.enable_log_requests"]
    assert vllm(settings={"swap_space": 4}, engine_version="0.17.0").validated().settings == {
        "swap_space": 4.0
    }


def test_the_gpu_count_comes_from_the_simulator_options_or_the_caller():
    cfg = vllm(settings={"tensor_parallel_size": 3}, simulator={"num_gpus": 4})
    assert (
        "(3) must divide the number of GPUs (4)"
        in errors_of(cfg.validated)["settings.tensor_parallel_size"]
    )
    assert vllm(settings={"tensor_parallel_size": 3}).validated().settings == {
        "tensor_parallel_size": 3
    }
    errors = errors_of(lambda: sglang(settings={"tp_size": 8}).validated(gpu_count=4))
    assert errors["settings.tp_size"] == "tp_size (8) is more than the 4 GPU(s) on this host"


@pytest.mark.parametrize(
    ("placement", "bad"),
    [
        (Placement(numa_node=-1), {"placement.numa_node"}),
        (Placement(numa_node=True), {"placement.numa_node"}),
        (Placement(numa_node="0"), {"placement.numa_node"}),
        (Placement(cpus="3-1"), {"placement.cpus"}),
        (Placement(cpus="0-"), {"placement.cpus"}),
        (Placement(cpus="0,,1"), {"placement.cpus"}),
        (Placement(cpus=""), {"placement.cpus"}),
        (Placement(cpus=7), {"placement.cpus"}),
        ({"numa_node": 0}, {"placement"}),
    ],
)
def test_bad_placements(placement, bad):
    assert set(errors_of(vllm(placement=placement).validated)) == bad


@pytest.mark.parametrize("cpus", ["7", "0-15", "0-15,32-47", "3,5,9-9"])
def test_good_cpu_lists(cpus):
    assert vllm(placement=Placement(0, cpus)).validated().placement == Placement(0, cpus)


def test_an_empty_placement_is_no_placement():
    assert vllm(placement=Placement()).validated().placement is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CUDA_VISIBLE_DEVICES", "0,1"),
        ("CUDA_VISIBLE_DEVICES", "GPU-5a1b3c2d-0000-1111-2222-333344445555"),
        ("CUDA_VISIBLE_DEVICES", "MIG-GPU-5a1b3c2d-0000/1/0"),
        ("NCCL_DEBUG", "INFO"),
        ("VLLM_ATTENTION_BACKEND", "FLASHINFER"),
        ("SGLANG_ENABLE_TORCH_COMPILE", "1"),
        ("HF_TOKEN", "hf_abcDEF123"),
        ("HF_HUB_OFFLINE", "1"),
        ("TOKENIZERS_PARALLELISM", "false"),
        ("OMP_NUM_THREADS", "8"),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
        ("TORCH_CUDA_ARCH_LIST", "9.0"),
        ("NVIDIA_VISIBLE_DEVICES", "all"),
        ("TRANSFORMERS_OFFLINE", "1"),
    ],
)
def test_engine_variables_are_allowed(name, value):
    assert vllm(env={name: value}).validated().env == {name: value}


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("LD_PRELOAD", "it changes which libraries the engine loads"),
        ("LD_LIBRARY_PATH", "it changes which libraries"),
        ("PATH", "it changes which programs run"),
        ("PYTHONPATH", "it changes which Python code"),
        ("HOME", "not on the list of variables known to be safe"),
        ("http_proxy", "invalid variable name"),
        ("1CUDA", "invalid variable name"),
    ],
)
def test_other_variables_are_refused_with_the_reason(name, reason):
    errors = errors_of(vllm(env={name: "x"}).validated)
    assert reason in errors[f"env.{name}"]


@pytest.mark.parametrize("value", ["all", "0;1", "0, 1", "", "-1"])
def test_cuda_visible_devices_values(value):
    assert "env.CUDA_VISIBLE_DEVICES" in errors_of(
        vllm(env={"CUDA_VISIBLE_DEVICES": value}).validated
    )


@pytest.mark.parametrize(
    ("options", "bad"),
    [
        ({"gpu": "h100"}, "simulator.gpu"),
        ({"num_gpus": 0}, "simulator.num_gpus"),
        ({"num_gpus": 2.0}, "simulator.num_gpus"),
        ({"startup_seconds": -1}, "simulator.startup_seconds"),
        ({"time_scale": float("nan")}, "simulator.time_scale"),
        ({"time_scale": True}, "simulator.time_scale"),
        ({"seed": -3}, "simulator.seed"),
        ({"speed": 2}, "simulator.speed"),
    ],
)
def test_bad_simulator_options(options, bad):
    assert bad in errors_of(vllm(runner="simulator", simulator=options).validated)


# --- JSON round trip ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg",
    [
        vllm(),
        vllm(
            settings={"served_model_name": ["chat", "chat2"], "gpu_memory_utilization": 0.85},
            engine_version="0.11.0",
            env={"CUDA_VISIBLE_DEVICES": "0,1"},
            placement=Placement(numa_node=1, cpus="16-31"),
            port=8001,
            host="127.0.0.1",
        ),
        sglang(runner="simulator", simulator={"gpu": "l4", "num_gpus": 2, "time_scale": 0.5}),
    ],
)
def test_to_dict_round_trips_through_json(cfg):
    cfg = cfg.validated()
    data = json.loads(json.dumps(cfg.to_dict()))
    assert LaunchConfig.from_dict(data) == cfg
    assert data["placement"] is None or set(data["placement"]) == {"numa_node", "cpus"}


def test_from_dict_refuses_bad_shapes():
    assert errors_of(lambda: LaunchConfig.from_dict({"engine": "vllm", "extra": 1})) == {
        "extra": "unknown field",
        "model": "missing",
    }
    errors = errors_of(
        lambda: LaunchConfig.from_dict(
            {"engine": "vllm", "model": LLAMA, "placement": {"node": 1}, "env": ["A=1"]}
        )
    )
    assert set(errors) == {"placement", "env"}


# --- rendering: process -------------------------------------------------------------------------


def test_vllm_process():
    cmd = render_process(
        vllm(
            settings={"max_num_seqs": 64}, env={"HF_HUB_OFFLINE": "1"}, host="127.0.0.1", port=8001
        )
    )
    assert cmd == ProcessCommand(
        argv=(
            "vllm",
            "serve",
            LLAMA,
            "--host",
            "127.0.0.1",
            "--port",
            "8001",
            "--max-num-seqs",
            "64",
        ),
        env={"HF_HUB_OFFLINE": "1"},
    )


def test_sglang_process():
    cmd = render_process(sglang(settings={"tp_size": 2}), python="/opt/venv/bin/python")
    assert cmd.argv == (
        "/opt/venv/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        QWEN,
        "--host",
        "0.0.0.0",
        "--port",
        "30000",
        "--tp-size",
        "2",
    )
    assert cmd.env == {}


@pytest.mark.parametrize(
    ("placement", "prefix"),
    [
        (Placement(numa_node=1), ["numactl", "--cpunodebind=1", "--membind=1", "--"]),
        (Placement(cpus="0-7"), ["taskset", "-c", "0-7"]),
        (Placement(1, "16-23"), ["numactl", "--physcpubind=16-23", "--membind=1", "--"]),
        (None, []),
    ],
)
def test_placement_prefix(placement, prefix):
    argv = render_process(vllm(placement=placement)).argv
    assert list(argv[: len(prefix)]) == prefix and argv[len(prefix)] == "vllm"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_simulator_process_speaks_the_simulator_cli(engine):
    cfg = (vllm if engine == "vllm" else sglang)(
        runner="simulator",
        settings={"max_num_seqs": 32} if engine == "vllm" else {"max_running_requests": 32},
        engine_version="0.10.1",
        simulator={"gpu": "a100-80g", "num_gpus": 2, "startup_seconds": 1.5, "time_scale": 0.1},
        host="127.0.0.1",
    )
    argv = render_process(cfg, python=sys.executable).argv
    assert argv[:4] == (sys.executable, "-m", "hosts.simulator", engine)
    model, settings, sim = simulator_parse(engine, list(argv[4:]))
    assert model == cfg.model and settings["host"] == "127.0.0.1"
    assert sim == {
        "gpu": "a100-80g",
        "num_gpus": 2,
        "startup_seconds": 1.5,
        "time_scale": 0.1,
        "engine_version": "0.10.1",
        "sim_seed": 0,
    }


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_simulator_seed(engine):
    make = vllm if engine == "vllm" else sglang
    argv = render_process(make(runner="simulator", simulator={"seed": 7})).argv
    assert simulator_parse(engine, list(argv[4:]))[2]["sim_seed"] == 7
    if engine == "vllm":  # vLLM's own --seed is the simulator's seed
        errors = errors_of(
            make(runner="simulator", settings={"seed": 1}, simulator={"seed": 7}).validated
        )
        assert errors == {"simulator.seed": "7 differs from settings.seed 1"}


def test_a_rendered_simulator_process_starts_and_reports_its_version():
    port = free_port()
    cfg = vllm(
        runner="simulator",
        engine_version="0.10.1",
        host="127.0.0.1",
        port=port,
        settings={"max_model_len": 4096},
        simulator={"time_scale": 0},
    )
    cmd = render_process(cfg, python=sys.executable)
    proc = subprocess.Popen(  # noqa: S603 - the argv under test, no shell
        cmd.argv,
        cwd=ROOT,
        env={**os.environ, **cmd.env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the simulator did not come up"
            time.sleep(0.1)
        version = httpx.get(f"http://127.0.0.1:{port}/version", timeout=5).json()
        assert version == {"version": "0.10.1"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# --- rendering: docker --------------------------------------------------------------------------


def test_docker_run_for_vllm():
    argv = render_docker(
        vllm(
            settings={"max_num_seqs": 64},
            engine_version="0.11.0",
            env={"HF_TOKEN": "hf_x", "CUDA_VISIBLE_DEVICES": "0,1"},
            placement=Placement(1, "16-31"),
        ),
        name="vllm-a",
        gpus=[0, 1],
    )
    assert argv == [
        "docker",
        "run",
        "-d",
        "--name",
        "vllm-a",
        "--ipc=host",
        "-p",
        "8000:8000",
        "--gpus",
        '"device=0,1"',
        "-e",
        "HF_TOKEN=hf_x",
        "-e",
        "CUDA_VISIBLE_DEVICES=0,1",
        "--cpuset-cpus",
        "16-31",
        "--cpuset-mems",
        "1",
        "--entrypoint",
        "vllm",
        "vllm/vllm-openai:v0.11.0",
        "serve",
        LLAMA,
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--max-num-seqs",
        "64",
    ]


def test_docker_run_for_sglang():
    argv = render_docker(sglang(host="127.0.0.1"), name="sg")
    assert argv[argv.index("-p") + 1] == "127.0.0.1:30000:30000"
    assert argv[argv.index("--gpus") + 1] == "all"
    i = argv.index("lmsysorg/sglang:latest")
    assert argv[i + 1 :] == [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        QWEN,
        "--host",
        "0.0.0.0",  # inside the container; the host address is where -p publishes
        "--port",
        "30000",
    ]
    assert "--entrypoint" not in argv


@pytest.mark.parametrize(
    ("version", "image"),
    [("v0.6.0", "vllm/vllm-openai:v0.6.0"), ("0.5.3.post1", "vllm/vllm-openai:v0.5.3.post1")],
)
def test_default_images(version, image):
    assert image in render_docker(vllm(engine_version=version), name="a")


@pytest.mark.parametrize(
    "image",
    [
        "vllm/vllm-openai:v0.11.0",
        "registry.local:5000/team/vllm:v1",
        "ghcr.io/a/b@sha256:" + "a" * 64,
    ],
)
def test_image_references_that_are_allowed(image):
    assert image in render_docker(vllm(), name="a", image=image)


def test_docker_refusals():
    assert set(errors_of(lambda: render_docker(vllm(runner="simulator"), name="a"))) == {"runner"}
    for gpus in ([], [0, 0], [-1], [True], "0,1"):
        assert "gpus" in errors_of(lambda g=gpus: render_docker(vllm(), name="a", gpus=g))
    errors = errors_of(lambda: render_docker(vllm(engine_version="0.10.2+cu128"), name="a"))
    assert "image" in errors
    errors = errors_of(lambda: render_docker(vllm(host="gpu1.example"), name="a"))
    assert errors == {"host": "docker publishes a port on an IP address, not on 'gpu1.example'"}
    assert "[::1]:8000:8000" in render_docker(vllm(host="::1"), name="a")


# --- rendering: systemd -------------------------------------------------------------------------


def unit_lines(unit: SystemdUnit) -> list[str]:
    return [line for line in unit.unit_text.splitlines() if line and not line.startswith("#")]


def test_systemd_unit_structure():
    unit = render_systemd(
        vllm(settings={"max_num_seqs": 8}, env={"HF_HUB_OFFLINE": "1", "NCCL_DEBUG": "WARN"}),
        unit_name="cp-vllm-a.service",
        env_file="/etc/controlpanel/cp-vllm-a.env",
        user="vllm",
        python="/opt/venv/bin/python",
    )
    lines = unit_lines(unit)
    assert lines[0] == "[Unit]" and lines[-2:] == ["[Install]", "WantedBy=multi-user.target"]
    assert "After=network-online.target" in lines
    service = lines[lines.index("[Service]") :]
    for expected in (
        "Type=simple",
        "User=vllm",
        "EnvironmentFile=/etc/controlpanel/cp-vllm-a.env",
        "Restart=no",
        "KillMode=control-group",
        "TimeoutStopSec=60",
    ):
        assert expected in service
    assert (
        "ExecStart=/opt/venv/bin/vllm serve " + LLAMA + " --host 0.0.0.0 --port 8000"
        " --max-num-seqs 8"
    ) in service
    assert unit.env_text == "HF_HUB_OFFLINE=1\nNCCL_DEBUG=WARN\n"
    assert not any(line.startswith(("CPUAffinity", "NUMA")) for line in lines)


@pytest.mark.parametrize(
    ("placement", "expected"),
    [
        (Placement(cpus="0-7"), ["CPUAffinity=0-7"]),
        (Placement(numa_node=1), ["NUMAPolicy=bind", "NUMAMask=1", "CPUAffinity=numa"]),
        (Placement(1, "16-23"), ["CPUAffinity=16-23", "NUMAPolicy=bind", "NUMAMask=1"]),
    ],
)
def test_systemd_placement_is_native(placement, expected):
    unit = render_systemd(vllm(placement=placement), unit_name="a.service", env_file="/etc/a.env")
    lines = unit_lines(unit)
    placed = [line for line in lines if line.startswith(("CPUAffinity", "NUMA"))]
    assert sorted(placed) == sorted(expected)
    exec_start = next(line for line in lines if line.startswith("ExecStart="))
    assert exec_start.startswith("ExecStart=vllm serve")  # no numactl under systemd


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_systemd_analyze_accepts_the_unit(tmp_path, engine):
    make = vllm if engine == "vllm" else sglang
    env_file = tmp_path / "engine.env"
    unit = render_systemd(
        make(env={"HF_HUB_OFFLINE": "1"}, placement=Placement(numa_node=0)),
        unit_name="cp-test.service",
        env_file=str(env_file),
        python=sys.executable,
    )
    env_file.write_text(unit.env_text)
    (tmp_path / "cp-test.service").write_text(unit.unit_text)
    result = subprocess.run(  # noqa: S603
        ["systemd-analyze", "verify", str(tmp_path / "cp-test.service")],  # noqa: S607
        capture_output=True,
        text=True,
        timeout=60,
    )
    # vllm's script is not installed next to the test's python: that one complaint is expected
    # (sglang runs the test's python itself, which exists). Anything else is a unit we got wrong.
    complaints = [
        line
        for line in result.stderr.splitlines()
        if line.strip() and not (engine == "vllm" and "/vllm is not executable" in line)
    ]
    assert complaints == [], result.stderr
