"""The simulated engines' prefix-cache resets behave like the real ones (issue 14 item 11: the
panel measures baselines from a restart, and these endpoints are why not from a reset).

vLLM serves ``POST /reset_prefix_cache`` only with ``VLLM_SERVER_DEV_MODE=1`` (a 404
otherwise) and answers 200 with an empty body; SGLang always serves ``/flush_cache``."""

import httpx
from prometheus_client.parser import text_string_to_metric_families

VLLM_ARGS = ("--max-model-len", "8192", "--time-scale", "0.2")
PROMPT = "The same long system prompt, again and again. " * 60


def hits(server) -> float:
    text = httpx.get(server.url + "/metrics").text
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:prefix_cache_hits":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError("no vllm:prefix_cache_hits")


def ask(server) -> None:
    body = {"model": server.model, "prompt": PROMPT, "max_tokens": 2, "ignore_eos": True}
    assert httpx.post(server.url + "/v1/completions", json=body, timeout=30).status_code == 200


def test_vllm_has_no_reset_endpoint_outside_development_mode(sim_server, monkeypatch):
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    server = sim_server("vllm", *VLLM_ARGS)
    assert httpx.post(server.url + "/reset_prefix_cache").status_code == 404


def test_vllm_reset_prefix_cache_in_development_mode_empties_the_cache(sim_server, monkeypatch):
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    server = sim_server("vllm", *VLLM_ARGS)
    ask(server)
    ask(server)
    warm = hits(server)
    assert warm > 0, "the same prompt twice is served from the prefix cache"

    reset = httpx.post(server.url + "/reset_prefix_cache")
    assert reset.status_code == 200 and reset.content == b""

    ask(server)
    assert hits(server) == warm, "after the reset the prompt is computed again"
    assert httpx.get(server.url + "/reset_prefix_cache").status_code == 405
