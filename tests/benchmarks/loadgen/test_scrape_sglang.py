"""A benchmark against SGLang reports the prefix-cache hit rate as one against vLLM does:
from sglang:cached_tokens_total / sglang:prompt_tokens_total (issue 15)."""

import pytest

from benchmarks.loadgen import Dataset, LengthDist, LoadSpec, Stage, run
from benchmarks.loadgen.scrape import deltas, parse
from tests.hosts.simulator.conftest import QWEN

# What SGLang 0.5.3 serves through prometheus_client's MultiProcessCollector: counters with no
# _created sample, help text "Multiprocess metric".
SGLANG = """# HELP sglang:prompt_tokens_total Multiprocess metric
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{model_name="m"}} {prompt}
# HELP sglang:generation_tokens_total Multiprocess metric
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{model_name="m"}} 40.0
"""
CACHED = """# HELP sglang:cached_tokens_total Multiprocess metric
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{{model_name="m"}} {cached}
"""


def test_sglang_hit_rate_is_cached_over_prompt_tokens():
    before = parse(SGLANG.format(prompt=1000) + CACHED.format(cached=200))
    after = parse(SGLANG.format(prompt=3000) + CACHED.format(cached=1700))
    assert before["engine"] == "sglang" and after["cached_prompt_tokens"] == 1700
    d = deltas(before, after)
    assert d["prompt_tokens"] == 2000 and d["cached_prompt_tokens"] == 1500
    assert d["prefix_cache_hit_rate"] == 0.75


def test_sglang_without_cached_tokens_family_had_no_hits():
    # SGLang writes cached_tokens only for a request that hit: absent means none did, so the
    # rate is 0, and a family that appears mid-run counts from 0.
    before = parse(SGLANG.format(prompt=1000))
    assert deltas(before, parse(SGLANG.format(prompt=3000)))["prefix_cache_hit_rate"] == 0
    grown = parse(SGLANG.format(prompt=3000) + CACHED.format(cached=500))
    assert deltas(before, grown)["prefix_cache_hit_rate"] == 0.25


def test_no_prompt_tokens_no_hit_rate():
    # Nothing finished between the scrapes: no rate, not a division by zero or a 0.
    snap = parse(SGLANG.format(prompt=1000))
    assert "prefix_cache_hit_rate" not in deltas(snap, snap)


def test_hit_rate_against_the_simulated_sglang(sim_server):
    server = sim_server(
        "sglang", "--context-length", "4096", "--enable-metrics", "--time-scale", "0.1"
    )
    spec = LoadSpec(
        base_url=server.url,
        model=QWEN,
        warmup_requests=2,
        dataset=Dataset(
            # 480 shared tokens on top of 32 of each request's own: 512 sent.
            LengthDist("fixed", 32),
            LengthDist("fixed", 16),
            prefix_len=480,
            prefix_groups=1,
        ),
        stages=(Stage("s", concurrency=4, num_requests=24),),
    )
    srv = run(spec).to_dict()["server"]
    assert srv["available"] and srv["engine"] == "sglang"
    # prompt_tokens counts whole prompts (SGLang's semantics), so the ratio is a hit rate:
    # 480 of 512 tokens shared, the cache holds whole 16-token blocks (480 = 30 blocks).
    assert srv["prompt_tokens"] == pytest.approx(24 * 512, abs=512)
    assert 0.85 < srv["prefix_cache_hit_rate"] <= 480 / 512
