"""What vLLM and SGLang accept: flag specs, validation, argv rendering (pure: no Django)."""

from hosts.engines import sglang, vllm
from hosts.engines.flags import EngineArgError, EngineSpec, Flag

ENGINES = {"vllm": vllm, "sglang": sglang}


def get_spec(kind: str) -> EngineSpec:
    try:
        return ENGINES[kind].SPEC
    except KeyError:
        raise EngineArgError(f"unknown engine {kind!r} (choose from vllm, sglang)") from None


__all__ = ["ENGINES", "EngineArgError", "EngineSpec", "Flag", "get_spec"]
