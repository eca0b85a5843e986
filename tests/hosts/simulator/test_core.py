"""The scheduler and KV cache, stepped by hand."""

from dataclasses import replace

import pytest

from hosts.engines.catalog import GPUS, MODELS, resolve_model
from hosts.simulator.config import build_config
from hosts.simulator.core import EngineCore, Request
from hosts.simulator.kvcache import KVCache
from hosts.simulator.predict import prompt_block_hashes

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def config(**settings):
    return build_config("vllm", LLAMA, {"max_model_len": 8192, **settings}, GPUS["h100-sxm"])


def request(i, prompt=256, out=16, prefix=None, prefix_len=0, block=16):
    hashes = prompt_block_hashes(prefix, prefix_len, ("t", i), prompt, block)
    return Request(
        id=str(i),
        prompt_len=prompt,
        block_hashes=hashes,
        max_tokens=out,
        output_target=out,
        arrival=0.0,
    )


def run(core, now=0.0, limit=100000):
    steps = []
    while core.has_work and len(steps) < limit:
        step = core.step(now)
        now = step.end
        steps.append(step)
    return steps


@pytest.mark.parametrize(
    ("model", "kib"),
    [("llama-3.1-8b", 128), ("llama-3.1-70b", 320), ("qwen2.5-7b", 56), ("mistral-7b", 128)],
)
def test_kv_bytes_per_token(model, kib):
    spec = MODELS[model]
    assert spec.kv_bytes_per_token(2) == kib * 1024
    assert spec.kv_bytes_per_token(1) == kib * 512  # fp8 halves it


def test_kv_capacity_follows_vllms_formula():
    cfg = config()
    gpu, model = GPUS["h100-sxm"], resolve_model(LLAMA)
    pool = 0.9 * gpu.memory_bytes - model.weight_bytes - cfg.activation_bytes - 0.45 * 2**30
    assert cfg.kv_pool_bytes == pytest.approx(pool)
    assert cfg.num_blocks == int(pool // (16 * 131072))
    fp8 = config(kv_cache_dtype="fp8")
    assert fp8.num_blocks == pytest.approx(2 * cfg.num_blocks, abs=1)
    tp2 = build_config(
        "vllm",
        LLAMA,
        {"max_model_len": 8192, "tensor_parallel_size": 2},
        GPUS["h100-sxm"],
        num_gpus=2,
    )
    assert tp2.kv_bytes_per_token == 131072 / 2 and tp2.weights_bytes_per_gpu == (
        model.weight_bytes / 2
    )


def test_budget_and_max_num_seqs_are_respected():
    core = EngineCore(config(max_num_seqs=8, max_num_batched_tokens=512))
    for i in range(20):
        core.add(request(i, prompt=300, out=20))
    steps = run(core)
    assert all(s.num_prefill_tokens + s.num_decode_tokens <= 512 for s in steps)
    assert max(s.num_running for s in steps) == 8
    assert core.finished_requests == 20 and core.generation_tokens == 20 * 20


def test_decodes_are_scheduled_before_new_prefills():
    core = EngineCore(config(max_num_batched_tokens=256))
    core.add(request(0, prompt=100, out=50))
    run(core, limit=2)  # request 0 is decoding now
    core.add(request(1, prompt=1000, out=5))
    step = core.step(1.0)
    assert step.num_decode_tokens == 1 and step.num_prefill_tokens == 255  # chunked


def test_kv_exhaustion_preempts_newest_and_recomputes():
    cfg = replace(config(), num_blocks=40)  # 640 tokens of KV for 4 × (128 + 64)
    core = EngineCore(cfg)
    reqs = [request(i, prompt=128, out=64) for i in range(4)]
    for r in reqs:
        core.add(r)
    run(core)
    assert core.num_preemptions > 0
    assert all(r.num_output == 64 and r.finish_reason == "length" for r in reqs)
    # The newest request is the victim; the oldest is never preempted.
    assert reqs[-1].preemptions > 0 and reqs[0].preemptions == 0
    assert core.kv.num_free == 40  # everything released


def test_prefix_cache_hits_skip_prefill():
    core = EngineCore(config())
    core.add(request(0, prompt=1024, out=2, prefix=7, prefix_len=960))
    run(core)
    core.add(request(1, prompt=1024, out=2, prefix=7, prefix_len=960))
    step = core.step(10.0)
    assert step.num_prefill_tokens == 1024 - 960
    assert core.kv.hits == 960 and core.kv.queries == 2048


def test_no_prefix_caching_recomputes_everything():
    core = EngineCore(config(enable_prefix_caching=False))
    for i in range(2):
        core.add(request(i, prompt=1024, out=2, prefix=7, prefix_len=960))
        run(core)
    assert core.kv.hits == 0 and core.prompt_tokens == 2048


def test_freed_prefix_blocks_are_evicted_last_for_reuse():
    kv = KVCache(num_blocks=4, block_size=16, prefix_caching=True)
    blocks = kv.allocate(2)
    kv.cache_blocks(blocks, [111, 222], 0, 2)
    kv.release(blocks)
    assert kv.lookup([111, 222], 33) == blocks  # still there after release
    kv.allocate(2)  # takes the two never-used blocks first
    assert kv.lookup([111, 222], 33) == blocks
    kv.allocate(1)
    assert kv.lookup([111, 222], 33) == [blocks[0]]  # the tail block was evicted first


def test_sglang_alternates_prefill_and_decode_steps():
    cfg = build_config("sglang", "Qwen/Qwen2.5-7B", {"context_length": 8192}, GPUS["h100-sxm"])
    core = EngineCore(cfg)
    core.add(request(0, prompt=100, out=30))
    run(core, limit=3)
    core.add(request(1, prompt=100, out=30))
    step = core.step(1.0)
    assert step.num_prefill_tokens == 100 and step.num_decode_tokens == 0
    step = core.step(step.end)
    assert step.num_decode_tokens == 2 and step.num_prefill_tokens == 0


def test_priority_policy_serves_urgent_requests_first():
    core = EngineCore(config(scheduling_policy="priority", max_num_seqs=1))
    low, high = request(0, out=5), request(1, out=5)
    low.priority, high.priority = 5, 0
    core.add(low)
    core.add(high)
    run(core)
    assert high.first_token < low.first_token


def test_abort_frees_blocks():
    core = EngineCore(config())
    r = request(0, prompt=500, out=100)
    core.add(r)
    run(core, limit=3)
    core.abort(r, 1.0)
    assert r.finish_reason == "abort" and core.kv.num_free == core.kv.num_blocks
    assert not core.has_work
