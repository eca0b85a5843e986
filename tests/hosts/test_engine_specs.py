"""Engine flag specs: one table validates settings, renders argv and parses command lines."""

import pytest

from hosts.engines import EngineArgError, get_spec


@pytest.mark.parametrize(
    ("engine", "values"),
    [
        (
            "vllm",
            {
                "gpu_memory_utilization": 0.85,
                "max_num_seqs": 128,
                "max_num_batched_tokens": 4096,
                "max_model_len": 8192,
                "tensor_parallel_size": 2,
                "enable_prefix_caching": False,
                "enable_chunked_prefill": True,
                "kv_cache_dtype": "fp8",
                "quantization": "fp8",
                "block_size": 32,
                "scheduling_policy": "priority",
                "served_model_name": ["chat"],
                "api_key": "s3cret-key",
            },
        ),
        (
            "sglang",
            {
                "mem_fraction_static": 0.8,
                "max_running_requests": 64,
                "tp_size": 2,
                "chunked_prefill_size": 4096,
                "context_length": 8192,
                "kv_cache_dtype": "fp8_e5m2",
                "disable_radix_cache": True,
                "schedule_policy": "lpm",
                "enable_metrics": True,
            },
        ),
    ],
)
def test_render_then_parse_round_trips(engine, values):
    spec = get_spec(engine)
    argv = spec.render_command("org/model-7B", values)
    assert all(isinstance(a, str) for a in argv)
    model, parsed = spec.parse_argv(argv)
    assert model == "org/model-7B" and parsed == values


def test_values_from_forms_are_coerced():
    clean, errors = get_spec("vllm").validate(
        {"max_num_seqs": "64", "enable_prefix_caching": "false", "gpu_memory_utilization": "0.9"}
    )
    assert not errors
    assert clean == {
        "max_num_seqs": 64,
        "enable_prefix_caching": False,
        "gpu_memory_utilization": 0.9,
    }


@pytest.mark.parametrize(
    ("values", "dest", "message"),
    [
        ({"max_num_seqs": True}, "max_num_seqs", "invalid int value"),
        ({"max_num_seqs": 0}, "max_num_seqs", "must be >= 1"),
        ({"max_num_seqs": 2.5}, "max_num_seqs", "invalid int value"),
        ({"kv_cache_dtype": "int3"}, "kv_cache_dtype", "invalid choice"),
        ({"served_model_name": ["a b"]}, "served_model_name", "invalid value"),
        ({"api_key": "$(curl evil)"}, "api_key", "invalid value"),
        ({"api_key": "--port=1"}, "api_key", "may not start with '-'"),
        ({"swap_space": 4}, "swap_space", "has no setting 'swap_space'"),
    ],
)
def test_bad_settings_are_refused_with_a_reason(values, dest, message):
    _, errors = get_spec("vllm").validate(values)
    assert message in errors[dest]


def test_render_refuses_what_validate_refuses():
    with pytest.raises(EngineArgError, match="invalid choice"):
        get_spec("vllm").render_args({"kv_cache_dtype": "int3"})


def test_human_readable_lengths():
    _, settings = get_spec("vllm").parse_argv(
        ["m", "--max-model-len", "32K", "--max-num-batched-tokens", "8k"]
    )
    assert settings == {"max_model_len": 32768, "max_num_batched_tokens": 8000}


def test_short_aliases():
    assert get_spec("vllm").parse_argv(["m", "-tp", "4", "-q", "awq"])[1] == {
        "tensor_parallel_size": 4,
        "quantization": "awq",
    }
    assert get_spec("sglang").parse_argv(["--model-path", "m", "--tp-size", "2"])[1] == {
        "tp_size": 2
    }
