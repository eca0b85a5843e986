"""Engine versions: flags that appear, disappear or are renamed between releases are refused
for the versions that lack them, with the flag to use instead; GPU-count rules."""

import pytest
from packaging.version import Version

from hosts.engines import EngineArgError, get_spec
from hosts.engines.flags import engine_version
from hosts.simulator.__main__ import parse as simulator_parse

VLLM = get_spec("vllm")
SGLANG = get_spec("sglang")


@pytest.mark.parametrize(
    ("text", "release"),
    [
        ("0.11.0", "0.11.0"),
        ("v0.6.0", "0.6.0"),
        ("0.5.3.post1", "0.5.3.post1"),
        ("0.11.1rc2", "0.11.1rc2"),
        ("0.10.2+cu128", "0.10.2+cu128"),
        ("0.9", "0.9.0"),
    ],
)
def test_versions_are_read_like_pip_reads_them(text, release):
    assert engine_version(text) == Version(release)


@pytest.mark.parametrize("text", ["abc", "", "0.11 ", "$(reboot)", "0.11.0;id", None, 11])
def test_unreadable_versions_are_refused(text):
    with pytest.raises(EngineArgError, match="invalid engine version") as exc:
        engine_version(text)
    assert exc.value.flag == "engine_version"


def test_a_flag_added_later_names_the_one_older_versions_use():
    _, errors = VLLM.validate({"enable_log_requests": True}, version="0.10.0")
    assert errors == {
        "enable_log_requests": "vllm serve 0.10.0 has no --enable-log-requests "
        "(added in 0.10.1; older versions use --disable-log-requests)"
    }
    clean, errors = VLLM.validate({"enable_log_requests": True}, version="0.10.1")
    assert not errors and clean == {"enable_log_requests": True}


def test_a_removed_flag_names_its_replacement():
    assert VLLM.validate({"disable_log_requests": True}, version="0.16.0")[1] == {}
    _, errors = VLLM.validate({"disable_log_requests": True}, version="0.17.0")
    assert errors["disable_log_requests"] == (
        "vllm serve 0.17.0 has no --disable-log-requests "
        "(removed in 0.17.0; use --enable-log-requests instead)"
    )


def test_swap_space_is_gone_from_0_18():
    assert VLLM.validate({"swap_space": 8}, version="0.17.1") == ({"swap_space": 8.0}, {})
    _, errors = VLLM.validate({"swap_space": 8}, version="0.18.0")
    assert errors["swap_space"] == "vllm serve 0.18.0 has no --swap-space (removed in 0.18.0)"


def test_without_a_version_the_table_is_the_newest_release():
    # What the table always refused it still refuses (the test in test_engine_specs too) ...
    _, errors = VLLM.validate({"swap_space": 4, "disable_log_requests": True})
    assert "has no setting 'swap_space' (removed in 0.18.0" in errors["swap_space"]
    assert "use --enable-log-requests instead" in errors["disable_log_requests"]
    # ... and what it accepted it still accepts, rendered the same.
    settings = {"max_num_seqs": 64, "enable_log_requests": False, "gpu_memory_utilization": 0.8}
    assert VLLM.render_args(settings) == VLLM.render_args(settings, version="0.11.0")
    assert VLLM.render_args(settings) == [
        "--gpu-memory-utilization",
        "0.8",
        "--max-num-seqs",
        "64",
        "--no-enable-log-requests",
    ]


@pytest.mark.parametrize(
    ("version", "accepted"),
    [
        ("0.10.1rc1", True),  # a release candidate has its release's flags
        ("0.10.1.post1", True),
        ("0.10.0.post1", False),  # a post release of the version before does not
        ("v0.10.1", True),
        ("0.10.1+cu126", True),
    ],
)
def test_pre_post_and_local_builds_take_their_release_flags(version, accepted):
    _, errors = VLLM.validate({"enable_log_requests": True}, version=version)
    assert (not errors) is accepted


def test_render_refuses_a_flag_the_version_lacks():
    with pytest.raises(EngineArgError, match="has no --enable-log-requests"):
        VLLM.render_args({"enable_log_requests": True}, version="0.9.2")
    assert VLLM.render_args({"disable_log_requests": True}, version="0.9.2") == [
        "--disable-log-requests"
    ]


def test_parsers_know_the_flags_of_their_version():
    with pytest.raises(EngineArgError, match="unrecognized arguments: --swap-space"):
        VLLM.parse_argv(["m", "--swap-space", "4"])
    assert VLLM.parse_argv(["m", "--swap-space", "4"], version="0.17.0") == (
        "m",
        {"swap_space": 4.0},
    )
    with pytest.raises(EngineArgError, match="unrecognized arguments: --enable-log-requests"):
        VLLM.parse_argv(["m", "--enable-log-requests"], version="0.10.0")


def test_the_simulator_cli_is_unchanged(capsys):
    """Its parser is built from the newest table: removed flags stay unrecognized."""
    with pytest.raises(SystemExit) as exc:
        simulator_parse("vllm", ["m", "--disable-log-requests"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --disable-log-requests" in capsys.readouterr().err
    model, settings, _ = simulator_parse("vllm", ["m", "--enable-log-requests"])
    assert settings == {"enable_log_requests": True}


def test_effective_settings_list_the_flags_of_the_version():
    assert "swap_space" not in VLLM.effective({})
    assert VLLM.effective({}, version="0.17.0")["swap_space"] == 4


@pytest.mark.parametrize("spec", [VLLM, SGLANG], ids=lambda s: s.kind)
def test_version_facts_are_consistent(spec):
    for flag in spec.flags:
        for bound in (flag.since, flag.until):
            if bound is not None:
                assert str(engine_version(bound)) == bound, flag.dest
        if flag.since and flag.until:
            assert Version(flag.since) < Version(flag.until), flag.dest
        if flag.counterpart:
            assert spec.by_dest[flag.counterpart].counterpart == flag.dest, flag.dest


def _before(version: str) -> str:
    major, minor, patch = (list(Version(version).release) + [0, 0])[:3]
    if patch:
        return f"{major}.{minor}.{patch - 1}"
    return f"{major}.{minor - 1}.99"


VERSIONED = [
    (spec, flag)
    for spec in (VLLM, SGLANG)
    for flag in spec.flags
    if flag.since is not None or flag.until is not None
]


@pytest.mark.parametrize(
    ("spec", "flag"), VERSIONED, ids=[f"{s.kind}-{f.dest}" for s, f in VERSIONED]
)
def test_every_versioned_flag_is_refused_exactly_outside_its_range(spec, flag):
    value = {"bool": True, "int": 1, "float": 1.0, "str": "x"}[flag.type]
    if flag.since is not None:
        assert spec.validate({flag.dest: value}, version=flag.since)[1] == {}
        _, errors = spec.validate({flag.dest: value}, version=_before(flag.since))
        assert f"(added in {flag.since}" in errors[flag.dest]
    if flag.until is not None:
        assert spec.validate({flag.dest: value}, version=_before(flag.until))[1] == {}
        _, errors = spec.validate({flag.dest: value}, version=flag.until)
        assert f"(removed in {flag.until}" in errors[flag.dest]


def test_sglang_renders_the_tp_option_every_release_has():
    assert SGLANG.render_args({"tp_size": 2}) == ["--tp-size", "2"]
    assert SGLANG.parse_argv(["--model-path", "m", "--tensor-parallel-size", "2"])[1] == {
        "tp_size": 2
    }


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", float("nan"), float("inf")])
def test_non_finite_floats_are_refused(value):
    _, errors = VLLM.validate({"gpu_memory_utilization": value, "swap_space": 1}, "0.11.0")
    assert "invalid float value" in errors["gpu_memory_utilization"]
    _, errors = SGLANG.validate({"schedule_conservativeness": value})
    assert "invalid float value" in errors["schedule_conservativeness"]


# --- tensor parallelism against the GPU count -------------------------------------------------


@pytest.mark.parametrize(("spec", "dest"), [(VLLM, "tensor_parallel_size"), (SGLANG, "tp_size")])
def test_tensor_parallel_size_must_divide_the_gpu_count(spec, dest):
    assert spec.validate({dest: 2}, gpu_count=8) == ({dest: 2}, {})
    assert spec.validate({dest: 4}, gpu_count=4)[1] == {}
    _, errors = spec.validate({dest: 3}, gpu_count=4)
    assert errors[dest] == (
        f"{dest} (3) must divide the number of GPUs (4): 1 GPU(s) would sit idle"
    )
    _, errors = spec.validate({dest: 8}, gpu_count=4)
    assert errors[dest] == f"{dest} (8) is more than the 4 GPU(s) on this host"
    # Unknown GPU count: nothing to check against.
    assert spec.validate({dest: 3})[1] == {}


def test_gpu_count_errors_come_with_the_others():
    _, errors = VLLM.validate({"tensor_parallel_size": 3, "max_num_seqs": 0}, gpu_count=4)
    assert set(errors) == {"tensor_parallel_size", "max_num_seqs"}


@pytest.mark.parametrize("count", [0, -1, True, 2.0, "4"])
def test_a_nonsense_gpu_count_is_a_programming_error(count):
    with pytest.raises(ValueError, match="gpu_count"):
        VLLM.validate({}, gpu_count=count)
