"""The simulator's /metrics values are readings of the simulated engine with the real engines'
semantics (vLLM 0.11.0 ``vllm/v1/metrics/stats.py``; SGLang 0.5.3 ``metrics/collector.py``,
``managers/scheduler_metrics_mixin.py``, ``managers/tokenizer_manager.py``), not constants."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hosts.simulator import metrics_sglang
from tests.hosts.simulator.test_metrics_parity import engine, request, run


def samples(metrics) -> dict:
    """Sample name → {frozenset(labels): value} of an exposition."""
    out: dict = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


def total(values: dict, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(v for k, v in values.get(name, {}).items() if want <= k)


# --- vLLM -------------------------------------------------------------------------------------
def test_vllm_counts_whole_prompts_and_steps_tokens():
    cfg, core, metrics = engine("vllm", gpu_memory_utilization=0.8)
    now = 0.0
    for wave in range(2):
        for i in range(3):
            core.add(request(wave * 10 + i, 320, 5, now, shared=12))
        now = run(core, metrics, now)
    v = samples(metrics)
    # IterationStats: the whole prompt counts at the first token, prefix-cache hits included.
    assert total(v, "vllm:prefix_cache_hits_total") > 0
    assert total(v, "vllm:prompt_tokens_total") == 6 * 320
    assert total(v, "vllm:generation_tokens_total") == 6 * 5
    # Each step observes its prompt + generated tokens once.
    assert total(v, "vllm:iteration_tokens_total_sum") == 6 * 320 + 6 * 5
    assert total(v, "vllm:request_params_max_tokens_sum") == 6 * 5
    assert total(v, "vllm:request_success_total", finished_reason="length") == 6
    assert total(v, "vllm:request_success_total", finished_reason="abort") == 0
    # ITL and the deprecated TPOT get the same gaps: 4 per request.
    assert total(v, "vllm:inter_token_latency_seconds_count") == 6 * 4
    assert total(v, "vllm:time_per_output_token_seconds_count") == 6 * 4
    info = next(iter(v["vllm:cache_config_info"]))
    assert dict(info)["num_gpu_blocks"] == str(cfg.num_blocks)
    assert dict(info)["gpu_memory_utilization"] == "0.8"
    assert total(v, "process_resident_memory_bytes") > 10 * 2**20


def test_vllm_request_tpot_is_decode_time_over_later_tokens():
    cfg, core, metrics = engine("vllm")
    req = request(1, 64, 9, 0.0)
    core.add(req)
    run(core, metrics)
    v = samples(metrics)
    expected = (req.last_token - req.first_token) / 8
    assert expected > 0
    assert total(v, "vllm:request_time_per_output_token_seconds_sum") == pytest.approx(expected)


def test_vllm_n_is_observed_once_per_parent_with_its_longest_child():
    cfg, core, metrics = engine("vllm")
    for i, tokens in enumerate((3, 7, 5)):
        child = request(i, 64, 10, 0.0)
        child.output_target, child.params_n, child.parent_id = tokens, 3, "parent"
        core.add(child)
    single = request(9, 64, 4, 0.0)
    core.add(single)
    run(core, metrics)
    v = samples(metrics)
    assert total(v, "vllm:request_params_n_count") == 2
    assert total(v, "vllm:request_params_n_sum") == 3 + 1
    assert total(v, "vllm:request_max_num_generation_tokens_sum") == 7 + 4


# --- SGLang -----------------------------------------------------------------------------------
def test_sglang_cached_over_prompt_tokens_is_the_hit_rate():
    cfg, core, metrics = engine("sglang")
    now = 0.0
    for wave in range(2):
        for i in range(3):
            core.add(request(wave * 10 + i, 320, 5, now, shared=12))
        now = run(core, metrics, now)
    v = samples(metrics)
    prompt = total(v, "sglang:prompt_tokens_total")
    cached = total(v, "sglang:cached_tokens_total")
    assert prompt == 6 * 320  # whole prompts, not only the computed tokens
    assert cached == core.kv.hits > 0
    assert total(v, "sglang:num_requests_total") == 6
    assert total(v, "sglang:queue_time_seconds_count") == 6
    assert total(v, "sglang:per_stage_req_latency_seconds_count", stage="prefill_waiting") == 6


def test_sglang_aborts_count_and_a_running_one_finishes():
    cfg, core, metrics = engine("sglang")
    running = request(1, 64, 500, 0.0)
    core.add(running)
    now = run(core, metrics, steps=3)
    waiting = request(2, 64, 5, now)
    core.add(waiting)
    core.abort(waiting, now)
    v = samples(metrics)
    assert total(v, "sglang:num_aborted_requests_total") == 1
    assert total(v, "sglang:num_requests_total") == 0  # a waiting abort leaves no metrics
    core.abort(running, now)
    v = samples(metrics)
    assert total(v, "sglang:num_aborted_requests_total") == 2
    assert total(v, "sglang:num_requests_total") == 1
    assert total(v, "sglang:generation_tokens_total") == running.num_output > 0


def test_sglang_gauges_follow_the_schedulers_log_cadence(monkeypatch):
    cfg, core, metrics = engine("sglang")
    for i in range(4):
        core.add(request(i, 64, 200, 0.0))
    now = run(core, metrics, steps=1)  # the prefill batch: logged

    def running():
        return total(samples(metrics), "sglang:num_running_reqs")

    # Logged with the decode batch beside the prefill one (none yet), as running_bs.
    assert running() == 0
    core.add(request(9, 64, 200, now))
    now = run(core, metrics, now, steps=2)  # a prefill batch, then a decode batch
    assert running() == 4  # the 4 decoding beside the new one
    now = run(core, metrics, now, steps=38)  # 39 decode batches: not yet a decode log
    assert running() == 4
    assert total(samples(metrics), "sglang:gen_throughput") == 0
    run(core, metrics, now, steps=1)  # the 40th: logged, with the throughput since start
    assert running() == 5
    assert total(samples(metrics), "sglang:gen_throughput") > 0


def test_sglang_idle_log_after_30_seconds(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(metrics_sglang.time, "monotonic", lambda: clock[0])
    cfg, core, metrics = engine("sglang")
    # Before any traffic and any log, the scheduler's gauges are absent ...
    assert "sglang:num_running_reqs" not in samples(metrics)
    clock[0] += 31
    # ... and the idle check writes them every 30 s.
    assert total(samples(metrics), "sglang:num_running_reqs") == 0
    assert total(samples(metrics), "sglang:utilization") == 0


def test_sglang_retractions_are_reported_once_then_reset():
    # A pool of 6 blocks (96 tokens): three growing requests must be retracted.
    cfg, core, metrics = engine("sglang", max_total_tokens=96)
    for i in range(3):
        core.add(request(i, 16, 60, 0.0))
    # Scheduler.num_retracted_reqs holds the size of the last retraction; each log (every
    # prefill batch, every 40th decode batch) writes it to the gauge and resets it to 0.
    pending, decodes, checked, now = 0, 0, [], 0.0
    while core.has_work:
        step = core.step(now)
        metrics.on_step(core, step)
        now = step.end
        for req in step.finished:
            metrics.on_finished(req)
        if step.preempted:
            pending = len(step.preempted)
        if not step.prefilled:
            decodes += 1
        if step.prefilled or decodes % 40 == 0 and not step.prefilled:
            gauge = total(samples(metrics), "sglang:num_retracted_reqs")
            checked.append((gauge, pending))
            pending = 0
    assert core.num_preemptions > 0
    assert [g for g, _ in checked] == [p for _, p in checked]
    assert any(g > 0 for g, _ in checked) and checked[-1][0] == 0
    pid_labelled = samples(metrics)["sglang:num_retracted_reqs"]
    assert all("pid" in dict(k) for k in pid_labelled)


def test_sglang_ttft_of_a_non_streamed_request_is_its_first_output():
    # The scheduler sends a non-streamed request's output every 50 tokens and at the end:
    # the tokenizer's TTFT is then the 50th token's time, or the whole request's if shorter.
    cfg, core, metrics = engine("sglang")
    short, long, streamed = (
        request(1, 64, 20, 0.0),
        request(2, 64, 80, 0.0),
        request(3, 64, 80, 0.0),
    )
    short.stream = long.stream = False
    tokens_at = {}
    original = core.step

    def step(now):
        result = original(now)
        for req in result.emitted:
            tokens_at.setdefault(req.id, []).append(result.end)
        return result

    core.step = step
    for req in (short, long, streamed):
        core.add(req)
    run(core, metrics)
    v = samples(metrics)
    expected = short.finished_at + tokens_at["2"][49] + streamed.first_token
    assert total(v, "sglang:time_to_first_token_seconds_count") == 3
    assert total(v, "sglang:time_to_first_token_seconds_sum") == pytest.approx(expected, rel=1e-12)
