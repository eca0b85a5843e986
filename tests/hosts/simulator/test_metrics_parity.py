"""The simulator's /metrics has the real engines' families, types, label names and buckets
(issue 15 items 5 and 6), checked against tables copied from vLLM 0.11.0's and SGLang 0.5.3's
source (``metric_reference.py``): unit-level on ``EngineMetrics`` driven by the engine core, and
on a live simulator after traffic."""

import threading

import httpx
import pytest

from hosts.engines.catalog import resolve_gpu
from hosts.simulator.config import build_config
from hosts.simulator.core import EngineCore, Request
from hosts.simulator.metrics import EngineMetrics
from tests.hosts.simulator.metric_reference import (
    SGLANG_0_5_3,
    SHOWN,
    VLLM_0_11_0,
    families,
    mismatches,
)

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen2.5-7B-Instruct"


def engine(kind: str, num_gpus: int = 1, **settings):
    model = LLAMA if kind == "vllm" else QWEN
    if kind == "sglang":
        settings.setdefault("enable_metrics", True)
    cfg = build_config(kind, model, settings, resolve_gpu("h100-sxm"), num_gpus)
    core = EngineCore(cfg)
    metrics = EngineMetrics(cfg)
    core.itl = metrics
    return cfg, core, metrics


def run(core: EngineCore, metrics: EngineMetrics, now: float = 0.0, steps=None) -> float:
    """Step the core like the runner does until it is idle (or ``steps`` steps)."""
    done = 0
    while core.has_work and (steps is None or done < steps):
        step = core.step(now)
        metrics.on_step(core, step)
        now = step.end
        for req in step.finished:
            metrics.on_finished(req)
        done += 1
    return now


def request(i: int, prompt_len: int, max_tokens: int, arrival: float, shared: int = 0):
    """A prompt whose first ``shared`` blocks are the same for every request."""
    hashes = [b if b < shared else 10_000 * (i + 1) + b for b in range(prompt_len // 16)]
    return Request(
        id=str(i),
        prompt_len=prompt_len,
        block_hashes=hashes,
        max_tokens=max_tokens,
        output_target=max_tokens,
        arrival=arrival,
    )


def traffic(core: EngineCore, metrics: EngineMetrics) -> None:
    """Two waves with a shared prefix (so the prefix cache hits), then one request the
    client drops while it runs."""
    now = 0.0
    for wave in range(2):
        for i in range(4):
            core.add(request(wave * 10 + i, 320, 8, now, shared=12))
        now = run(core, metrics, now)
    dropped = request(99, 64, 400, now)
    core.add(dropped)
    now = run(core, metrics, now, steps=3)
    core.abort(dropped, now)


@pytest.mark.parametrize(
    ("kind", "table", "max_model_len"),
    [("vllm", VLLM_0_11_0, 131072), ("sglang", SGLANG_0_5_3, None)],
)
def test_engine_metrics_match_the_engine_tables(kind, table, max_model_len):
    cfg, core, metrics = engine(kind)
    traffic(core, metrics)
    text = metrics.exposition().decode()
    assert mismatches(table, text, max_model_len or cfg.max_model_len) == []


def test_the_comparison_catches_a_missing_or_changed_family():
    # The checker itself: a table entry the exposition lacks, other buckets, other labels.
    cfg, core, metrics = engine("vllm")
    traffic(core, metrics)
    text = metrics.exposition().decode()
    table = dict(VLLM_0_11_0)
    ttft = table["vllm:time_to_first_token_seconds"]
    table["vllm:time_to_first_token_seconds"] = ttft._replace(buckets=ttft.buckets[1:])
    table["vllm:num_requests_running"] = table["vllm:num_requests_running"]._replace(labels=("x",))
    table["vllm:not_there"] = table["vllm:num_requests_waiting"]
    del table["vllm:request_params_n"]
    problems = "\n".join(mismatches(table, text, 131072))
    assert "vllm:time_to_first_token_seconds: buckets" in problems
    assert "vllm:num_requests_running: labels" in problems
    assert "vllm:not_there: missing" in problems
    assert "vllm:request_params_n: not a family of the engine" in problems


def test_sglang_histograms_are_observed_on_every_tp_rank():
    # Each TP rank's scheduler observes the queue histograms; only rank 0 logs the gauges.
    cfg, core, metrics = engine("sglang", num_gpus=2, tp_size=2)
    traffic(core, metrics)
    found = families(metrics.exposition().decode())
    assert "sglang:queue_time_seconds" in found
    text = metrics.exposition().decode()
    assert 'sglang:queue_time_seconds_count{engine_type="unified"' in text
    for rank in ("0", "1"):
        assert f'pp_rank="0",tp_rank="{rank}"' in text
    running = [ln for ln in text.splitlines() if ln.startswith("sglang:num_running_reqs{")]
    assert len(running) == 1 and 'tp_rank="0"' in running[0]


# --- live: a simulator process after traffic ------------------------------------------------------
PROMPT = "The same long system prompt, again and again. " * 40


def live_traffic(server) -> None:
    body = {"model": server.model, "prompt": PROMPT, "max_tokens": 6, "ignore_eos": True}
    for _ in range(3):
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=30).is_success
    # A streamed request the client drops after its first chunk: the engine aborts it.
    long = {**body, "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=long, timeout=30) as response:
        for _ in response.iter_lines():
            break
    # Another request afterwards, so the engine has noticed the drop before we scrape.
    assert httpx.post(server.url + "/v1/completions", json=body, timeout=30).is_success


def scrape_until(server, condition, attempts: int = 50) -> str:
    text = ""
    for _ in range(attempts):
        text = httpx.get(server.url + "/metrics").text
        if condition(text):
            return text
        threading.Event().wait(0.1)
    return text


def test_live_vllm_metrics_match_vllm_0_11(sim_server):
    server = sim_server("vllm", "--max-model-len", "8192", "--time-scale", "0.2")
    live_traffic(server)
    text = httpx.get(server.url + "/metrics").text
    assert mismatches(VLLM_0_11_0, text, 8192) == []


def test_live_sglang_metrics_match_sglang_0_5_3(sim_server):
    server = sim_server(
        "sglang", "--context-length", "8192", "--enable-metrics", "--time-scale", "0.2"
    )
    live_traffic(server)
    text = scrape_until(server, lambda t: "sglang:num_aborted_requests_total" in t)
    assert mismatches(SGLANG_0_5_3, text, 8192) == []


def test_the_tables_say_why_a_family_is_not_shown():
    for table in (VLLM_0_11_0, SGLANG_0_5_3):
        for name, family in table.items():
            assert family.shown == SHOWN or len(family.shown) > 10, name
