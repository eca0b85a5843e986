"""Launch configs for the engine launch tests: one per engine with the usual model, and the
field errors a refused config or rendering reports."""

import pytest

from hosts.engines.launch import LaunchConfig, LaunchError

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen2.5-7B-Instruct"


def vllm(**kw) -> LaunchConfig:
    return LaunchConfig(**{"engine": "vllm", "model": LLAMA, "settings": {}, **kw})


def sglang(**kw) -> LaunchConfig:
    return LaunchConfig(**{"engine": "sglang", "model": QWEN, "settings": {}, "port": 30000, **kw})


def errors_of(call) -> dict[str, str]:
    with pytest.raises(LaunchError) as exc:
        call()
    return exc.value.errors
