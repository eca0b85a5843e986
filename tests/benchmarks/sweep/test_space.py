"""Search spaces: every form of a dimension, the engine's own checks, and each refusal."""

import pytest

from benchmarks.sweep import MAX_POINTS, SpaceError, parse_dimension_text, parse_space
from hosts.engines import get_spec


def test_lists_values_and_ranges_make_a_cartesian_space():
    space = parse_space(
        "vllm",
        None,
        {
            "max_num_seqs": [16, "32", 64, 64],  # duplicates collapse, text is coerced
            "gpu_memory_utilization": {"min": 0.8, "max": 0.95, "step": 0.05},
            "enable_chunked_prefill": {"values": [True, False]},
        },
    )
    assert space.to_dict() == {
        "max_num_seqs": [16, 32, 64],
        "gpu_memory_utilization": [0.8, 0.85, 0.9, 0.95],
        "enable_chunked_prefill": [True, False],
    }
    assert space.size == 24
    points = list(space.points())
    assert len(points) == 24 and points[0] == {
        "max_num_seqs": 16,
        "gpu_memory_utilization": 0.8,
        "enable_chunked_prefill": True,
    }
    assert points[1]["enable_chunked_prefill"] is False  # the last dimension varies fastest
    assert list(space.points()) == points
    assert space.describe().startswith("max_num_seqs ∈ {16, 32, 64} × gpu_memory_utilization")
    assert space.describe().endswith("(24 points)")


def test_text_forms():
    spec = get_spec("vllm")
    flag = spec.flag("gpu_memory_utilization")
    assert parse_dimension_text(flag, "0.80:0.95:0.05") == {
        "min": "0.80",
        "max": "0.95",
        "step": "0.05",
    }
    space = parse_space(
        "vllm",
        None,
        {
            "max_num_seqs": "16, 32,64",
            "gpu_memory_utilization": parse_dimension_text(flag, "0.80:0.95:0.05"),
            "enable_prefix_caching": "true,false",
            "max_num_batched_tokens": "2k,4k",  # vLLM's own human-readable integers
        },
    )
    assert space.to_dict()["gpu_memory_utilization"] == [0.8, 0.85, 0.9, 0.95]
    assert space.to_dict()["enable_prefix_caching"] == [True, False]
    assert space.to_dict()["max_num_batched_tokens"] == [2000, 4000]
    assert parse_space("vllm", None, {"max_num_seqs": "8:10"}).to_dict() == {
        "max_num_seqs": [8, 9, 10]
    }


def test_int_range_and_float_rounding():
    space = parse_space("vllm", None, {"max_num_seqs": {"min": 16, "max": 64, "step": 16}})
    assert space.to_dict() == {"max_num_seqs": [16, 32, 48, 64]}
    space = parse_space(
        "vllm", None, {"gpu_memory_utilization": {"min": 0.7, "max": 0.9, "step": 0.1}}
    )
    assert space.to_dict()["gpu_memory_utilization"] == [0.7, 0.8, 0.9]


@pytest.mark.parametrize(
    ("raw", "flag", "words"),
    [
        ({"max_num_sequences": [1]}, "max_num_sequences", "vllm serve has no setting"),
        ({"seed": [1, 2]}, "seed", "has no effect on speed"),
        ({"api_key": ["a", "b"]}, "api_key", "credential"),
        ({"trust_remote_code": [True]}, "trust_remote_code", "load code"),
        ({"max_num_seqs": []}, "max_num_seqs", "at least one value"),
        ({"max_num_seqs": list(range(1, 66))}, "max_num_seqs", "65 values; at most 64"),
        ({"max_num_seqs": {"min": 1, "max": 100, "step": 1}}, "max_num_seqs", "at most 64"),
        ({"max_num_seqs": [0]}, "max_num_seqs", "argument --max-num-seqs"),
        ({"max_num_seqs": ["lots"]}, "max_num_seqs", "invalid int value"),
        ({"gpu_memory_utilization": [1.5]}, "gpu_memory_utilization", "must be <="),
        ({"max_num_seqs": {"min": 8, "max": 4}}, "max_num_seqs", "goes down"),
        ({"gpu_memory_utilization": {"min": 0.8, "max": 0.9}}, "gpu_memory_utilization", "step"),
        ({"kv_cache_dtype": {"min": 1, "max": 2}}, "kv_cache_dtype", "needs a number flag"),
        ({"max_num_seqs": [None]}, "max_num_seqs", "expected one argument"),
    ],
)
def test_refusals_name_the_flag(raw, flag, words):
    with pytest.raises(SpaceError) as info:
        parse_space("vllm", None, raw)
    assert words in info.value.errors[flag]
    assert words in str(info.value)


def test_a_flag_the_version_lacks_names_its_counterpart():
    with pytest.raises(SpaceError) as info:
        parse_space("vllm", "0.10.0", {"enable_log_requests": [True, False]})
    message = info.value.errors["enable_log_requests"]
    assert "0.10.0 has no --enable-log-requests" in message and "--disable-log-requests" in message


def test_whole_space_refusals():
    with pytest.raises(SpaceError) as info:
        parse_space("vllm", None, {})
    assert info.value.errors == {"": "choose at least one flag"}
    raw = {
        "max_num_seqs": list(range(1, 51)),
        "max_num_batched_tokens": list(range(4096, 4096 + 51)),
        "gpu_memory_utilization": [0.8, 0.9],
    }
    with pytest.raises(SpaceError) as info:
        parse_space("vllm", None, raw)
    assert info.value.errors == {"": f"the space has 5100 points; at most {MAX_POINTS}"}
    raw["gpu_memory_utilization"] = [0.9]
    raw["max_num_batched_tokens"] = list(range(4096, 4096 + 50))
    assert parse_space("vllm", None, raw).size == 2500
    with pytest.raises(SpaceError, match="unknown engine"):
        parse_space("trtllm", None, {"x": [1]})


def test_sglang_flags():
    space = parse_space("sglang", None, {"mem_fraction_static": "0.8,0.85", "tp_size": [1, 2]})
    assert space.size == 4
