"""The advisor's rules as a whole: every registered rule is covered by the tests, a healthy
deployment raises nothing, evaluate() orders worst first, a snapshot with no facts raises
nothing and crashes nothing, and the thresholds shared with the change review agree with it.
The rules one by one are in test_rules_load/config/host/runs.py."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from changes import advice
from changes.advisor import rules_config, rules_load, text
from changes.advisor.engine import RULES, evaluate
from changes.advisor.facts import ConfigFacts, EngineWindow, GpuFacts, RunFacts, Snapshot
from changes.advisor.findings import CRITICAL, INFO, SEVERITY_ORDER, WARNING
from tests.changes.advisor import builders as b

# Every rule id has raise / near-miss / missing-fact tests in the test_rules_*.py files; a new
# rule registered without being added here (and tested there) fails test_every_rule_is_covered.
COVERED = {
    # test_rules_load.py
    "queue-bound",
    "kv-bound",
    "prefill-bound",
    "decode-bound",
    "prefix-cache",
    "tail-growth",
    # test_rules_config.py
    "length-rejections",
    "max-model-len-oversized",
    "no-memory-headroom",
    "tp-unneeded",
    # test_rules_host.py
    "gpu-throttled",
    "cpu-bound",
    "numa-mismatch",
    # test_rules_runs.py
    "errors-behind-speed",
    "warmup-included",
    "profile-unlike-traffic",
    "client-limited-run",
}


def test_every_rule_is_covered():
    evaluate(b.healthy())  # imports the rules
    assert set(RULES) == COVERED


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_healthy_deployment_raises_nothing(engine):
    assert evaluate(b.healthy(engine)) == []


def bare() -> Snapshot:
    """A deployment the panel knows nothing about yet: only the engine and model."""
    return Snapshot(
        deployment="gpu-01/new",
        taken_at=b.NOW,
        config=ConfigFacts(engine="vllm", engine_version="", model="m", settings={}),
    )


def test_no_facts_no_findings():
    assert evaluate(bare()) == []


def test_empty_parts_no_findings():
    """Every part present but every optional number missing: still nothing, no crash."""
    s = replace(
        bare(),
        gpus=(GpuFacts(index=0, model=b.H100),),
        engine=EngineWindow(seconds=60, ended_at=b.NOW, source="live"),
        host=b.HostFacts(),
        runs=(
            RunFacts(
                run_id=1,
                label="",
                profile="p v1",
                finished_at=b.NOW,
                status="succeeded",
                config_current=True,
                warmup_requests=5,
            ),
        ),
        traffic=b.LengthFacts(),
    )
    assert evaluate(s) == []


def test_unknown_engine_gets_no_flag_suggestions():
    s = b.with_config(b.healthy(), engine="tgi", memory_fraction=0.99, max_model_len=131072)
    s = b.with_live(s, kv_usage_mean=0.97, preemptions=12)
    for finding in evaluate(s):
        assert not finding.suggestion.settings, finding.rule


def sick() -> Snapshot:
    """A deployment with one finding of each severity at least."""
    s = b.with_config(b.healthy(), max_num_seqs=16, max_model_len=131072)
    s = b.with_live(s, running_max=16, waiting_mean=30, waiting_max=40, queue_ms=2500)
    return b.with_run(s, warmup_requests=0)


def test_evaluate_orders_worst_first_then_by_rule():
    found = evaluate(sick())
    severities = [f.severity for f in found]
    assert {CRITICAL, INFO} <= set(severities)
    keys = [(SEVERITY_ORDER[f.severity], f.rule) for f in found]
    assert keys == sorted(keys)
    assert found[0].rule == "queue-bound" and found[0].severity == CRITICAL


def test_evaluate_only():
    assert [f.rule for f in evaluate(sick(), only=["warmup-included"])] == ["warmup-included"]


def test_findings_serialise_and_are_complete():
    s = sick()
    s = b.with_gpus(s, clock_events={"SwPowerCap": 0.5}, utilization_pct=90.0, sm_clock_mhz=1500.0)
    found = evaluate(s)
    assert len(found) >= 4
    for finding in found:
        json.dumps(finding.as_dict())  # evidence must be plain data for the API
        b.assert_valid(s, finding)
        assert finding.severity in (CRITICAL, WARNING, INFO)


def test_at_most_one_finding_per_rule():
    """The panel keeps one open finding per deployment and rule: a rule that sees the problem
    in the live window and in a run says it once, live first."""
    s = b.with_config(b.healthy(), max_num_seqs=16)
    busy = dict(running_max=16, waiting_mean=5, waiting_max=9, queue_ms=400)
    s = b.with_server(b.with_live(s, **busy), **busy)
    found = [f for f in evaluate(s) if f.rule == "queue-bound"]
    assert len(found) == 1 and found[0].source == "live"


def test_thresholds_agree_with_the_change_review():
    """A change the advisor proposes must not draw the review's own warnings for the same
    reasons (changes/advice.py): the shared limits are the same numbers."""
    assert rules_config.MEMORY_FRACTION_LIMIT == advice.MEMORY_FRACTION_LIMIT
    assert rules_config.CONTEXT_HEADROOM == advice.CONTEXT_HEADROOM
    assert rules_config.FITS_ONE_GPU_SHARE == advice.FITS_ONE_GPU_SHARE
    assert rules_load.MEMORY_FRACTION_RAISE_TO <= advice.MEMORY_FRACTION_LIMIT
    assert rules_config.MEMORY_FRACTION_SAFE <= advice.MEMORY_FRACTION_LIMIT


@pytest.mark.parametrize(
    ("value", "up", "down"), [(0, 1, 1), (1, 1, 1), (3, 4, 2), (64, 64, 64), (65.5, 128, 64)]
)
def test_powers_of_two(value, up, down):
    assert text.pow2_up(value) == up
    assert text.pow2_down(value) == down


def test_words():
    assert text.pct(0.275) == "27.5 %"
    assert text.pct(0.45) == "45 %"
    assert text.ms(1234) == "1.2 s" and text.ms(85) == "85 ms" and text.ms(7.25) == "7.2 ms"
    assert text.seconds(60) == "60 s" and text.seconds(900) == "15 min"
    live = EngineWindow(seconds=60, ended_at=0, source="live")
    assert text.window(live) == "over the last 60 s (live)"
    assert text.window(replace(live, source="run 12", seconds=300)) == (
        "in run 12 (5 min of server metrics)"
    )
    assert text.telemetry(None) == "in the latest telemetry"
