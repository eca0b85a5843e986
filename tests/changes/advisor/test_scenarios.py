"""The advisor's confusion matrix: every scenario built from the simulator (changes/advisor/
scenarios.py) must raise the rules it was made to show and none it gives no reason for; the
healthy one raises nothing critical or warning. Plus checks that the scenarios' snapshots say
what their docstrings claim, so a miss is the rule's and not a scenario gone wrong."""

from __future__ import annotations

import pytest

from changes.advisor.engine import RULES, evaluate
from changes.advisor.findings import SEVERITY_ORDER
from changes.advisor.scenarios import (
    CHAT,
    LLAMA_8B,
    SCENARIOS,
    Dist,
    Stage,
    build,
    simulate,
    stage_facts,
)
from hosts.simulator.predict import Workload, predict

NAMES = sorted(SCENARIOS)

# Mismatches that are findings about a rule, not about the scenario (see the manual.s matrix).
# strict: when the rule changes and the case passes, the mark must go.
# Mismatches that are findings about a rule, not about the scenario (see the manual.s matrix).
# strict: when the rule changes and the case passes, the mark must go. None at present: the
# three the scenarios found (tail-growth on a stage's start, cpu-bound's utilisation bound,
# gpu-throttled at a board's normal power limit) were fixed in the rules.
KNOWN_MISSES: dict[str, str] = {}
KNOWN_LOUD: dict[str, str] = {}


def cases(names, known):
    return [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=known[n])) if n in known else n
        for n in names
    ]


def raised(name: str) -> dict[str, set[str]]:
    """rule id → severities it raised for the scenario."""
    out: dict[str, set[str]] = {}
    for finding in evaluate(build(name)):
        out.setdefault(finding.rule, set()).add(finding.severity)
    return out


def findings_text(name: str) -> str:
    return (
        "\n".join(f"  {f.rule} [{f.severity}]: {f.seen}" for f in evaluate(build(name)))
        or "  (none)"
    )


@pytest.mark.parametrize("name", cases(NAMES, KNOWN_MISSES))
def test_scenario_raises_what_it_shows(name):
    missed = SCENARIOS[name].expect - set(raised(name))
    assert not missed, f"{name}: expected {sorted(missed)}; raised:\n{findings_text(name)}"


@pytest.mark.parametrize("name", NAMES)
def test_scenario_raises_nothing_it_gives_no_reason_for(name):
    wrong = SCENARIOS[name].must_not & set(raised(name))
    assert not wrong, f"{name}: must not raise {sorted(wrong)}; raised:\n{findings_text(name)}"


@pytest.mark.parametrize("name", cases([n for n in NAMES if SCENARIOS[n].quiet], KNOWN_LOUD))
def test_healthy_is_quiet(name):
    loud = {
        rule: severities & SCENARIOS[name].quiet
        for rule, severities in raised(name).items()
        if severities & SCENARIOS[name].quiet
    }
    assert not loud, f"{name}: raised {loud}:\n{findings_text(name)}"


def test_the_matrix_names_only_rules_that_exist():
    evaluate(build("healthy"))  # registers the rules
    named = set().union(*(s.expect | s.must_not for s in SCENARIOS.values()))
    assert named <= set(RULES), sorted(named - set(RULES))
    assert all(q in SEVERITY_ORDER for s in SCENARIOS.values() for q in s.quiet)


def test_every_rule_is_expected_by_some_scenario():
    evaluate(build("healthy"))
    expected = set().union(*(s.expect for s in SCENARIOS.values()))
    untested = set(RULES) - expected
    assert not untested, f"no scenario shows {sorted(untested)}"


# --- the scenarios say what they claim ------------------------------------------------------


def test_driver_agrees_with_predict():
    """A closed-loop fixed-length load through the scenario driver measures what predict()
    does: the same engine core, arrivals and turnaround."""
    settings = {"max_num_seqs": 64, "max_model_len": 8192}
    run = simulate(
        LLAMA_8B,
        settings,
        "h100-sxm",
        (Stage("s", 200, Dist("fixed", 512), Dist("fixed", 128), concurrency=16),),
        num_gpus=1,
    )
    facts = stage_facts(*run.stages[0])
    expected = predict(
        "vllm",
        LLAMA_8B,
        settings,
        "h100-sxm",
        Workload(num_requests=200, input_tokens=512, output_tokens=128, concurrency=16),
    )
    assert facts.ttft_p50_ms == pytest.approx(expected["ttft_ms"]["p50"], rel=0.02)
    assert facts.itl_p50_ms == pytest.approx(expected["itl_ms"]["p50"], rel=0.02)
    assert facts.output_tokens_per_s == pytest.approx(expected["output_throughput"], rel=0.05)


def test_snapshots_are_deterministic():
    first = SCENARIOS["max-num-seqs-4"].build()
    assert first == SCENARIOS["max-num-seqs-4"].build()


def test_queue_bound_scenario_queues_with_kv_free():
    live = build("max-num-seqs-4").engine
    assert live.running_max == 4 and live.waiting_mean > 20
    assert live.kv_usage_max < 0.1 and live.queue_ms > 5000


def test_kv_bound_scenario_fills_the_cache_and_preempts():
    live = build("memory-0.5-long-prompts").engine
    assert live.kv_usage_mean > 0.8 and live.preemptions > 0


def test_prefix_cache_scenarios_differ_only_in_the_cache():
    off, on = build("prefix-caching-off"), build("prefix-caching-on")
    assert off.config.prefix_caching is False and on.config.prefix_caching is True
    assert off.runs[0].lengths.shared_prefix_share > 0.8
    assert off.engine.hit_rate == 0 and on.engine.hit_rate > 0.7


def test_power_capped_gpu_reports_the_cap():
    gpu = build("power-capped").gpus[0]
    assert gpu.power_limit_w == 350 and gpu.power_w <= 350
    assert gpu.clock_events["sw_power_cap"] > 0.8 and gpu.sm_clock_mhz < gpu.max_sm_clock_mhz
    assert not build("healthy").gpus[0].clock_events.get("sw_power_cap")


def test_length_rejections_carry_the_engines_words():
    latest, earlier = build("length-rejections").runs
    assert 0.2 < latest.error_rate < 0.35 and earlier.error_rate == 0
    [(message, count)] = latest.errors_by_message.items()
    assert "maximum context length is 1152 tokens" in message and count == latest.failed
    assert latest.errors_by_class == {"http_4xx": latest.failed}
    assert latest.faster_than == earlier.run_id


def test_oversized_context_lengths():
    snap = build("max-model-len-32768")
    assert snap.config.max_model_len == 32768 and 1300 < snap.runs[0].lengths.total_p99 < 1600


def test_cpu_and_numa_scenarios_idle_the_gpu():
    healthy = build("healthy").gpus[0].utilization_pct
    assert build("cpu-starved").gpus[0].utilization_pct < healthy - 20
    numa = build("numa-mismatch")
    assert numa.config.numa_node != numa.gpus[0].numa_node
    assert set(numa.config.cpus) == set(numa.host.numa_cpus[1])


def test_healthy_is_the_demo_config_under_the_chat_profile():
    snap = build("healthy")
    assert snap.config.max_num_seqs == 256 and snap.config.max_model_len == 8192
    assert snap.runs[0].profile == CHAT and snap.runs[0].warmup_requests == 8
    assert [s.name for s in snap.runs[0].stages] == ["low", "normal", "peak"]
    # The live window is the peak stage: 48 clients, all running.
    assert snap.engine.source == "live" and snap.engine.running_max == 48
