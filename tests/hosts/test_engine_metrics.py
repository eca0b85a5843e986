"""The metric-name table: older engine releases read like newer ones, the simulator's names
are all known, and the endpoints match what the simulated engines serve."""

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.loadgen.scrape import COUNTERS, GAUGES, HISTOGRAMS, deltas, parse
from hosts.engines.catalog import resolve_gpu
from hosts.engines.metrics import BY_KEY, ENDPOINTS, METRICS, endpoints, lookup
from hosts.simulator.config import build_config
from hosts.simulator.core import EngineCore, Request
from hosts.simulator.metrics import EngineMetrics
from hosts.simulator.server import EngineRunner, create_app
from tests.hosts.simulator.metric_reference import SGLANG_0_5_3, VLLM_0_11_0

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen2.5-7B-Instruct"


def exposition(names: dict[str, str], scale: float = 1.0) -> str:
    """What a prometheus_client exporter writes for these metric names (name → kind), each
    observed or set with numbers derived from ``scale``, with the engines' labels."""
    registry = CollectorRegistry()
    labels = {"model_name": "m", "engine": "0"}
    for name, kind in names.items():
        if kind == "gauge":
            Gauge(name, name, labels.keys(), registry=registry).labels(**labels).set(0.5 * scale)
        elif kind == "counter":
            Counter(name, name, labels.keys(), registry=registry).labels(**labels).inc(10 * scale)
        else:
            hist = Histogram(name, name, labels.keys(), registry=registry).labels(**labels)
            for _ in range(int(4 * scale)):
                hist.observe(0.25)
    return generate_latest(registry).decode()


def vllm_names(rank: int) -> dict[str, str]:
    """The vLLM metrics our scraper reads, under their newest (0) or oldest known names."""
    out = {}
    for key in (*GAUGES, *COUNTERS, *HISTOGRAMS):
        names = BY_KEY[key].vllm
        if names:
            out[names[min(rank, len(names) - 1)]] = BY_KEY[key].kind
    return out


def test_old_vllm_names_read_as_the_new_ones():
    old, new = vllm_names(rank=-1), vllm_names(rank=0)
    # The table does hold older names for this to test something.
    assert "vllm:gpu_cache_usage_perc" in old and "vllm:kv_cache_usage_perc" in new
    assert "vllm:time_per_output_token_seconds" in old
    assert "vllm:gpu_prefix_cache_hits" in old
    before_old, after_old = parse(exposition(old, 1)), parse(exposition(old, 3))
    before_new, after_new = parse(exposition(new, 1)), parse(exposition(new, 3))
    assert after_old == after_new
    assert before_old.keys() == before_new.keys()
    assert {"kv_cache_usage", "itl_count", "prefix_cache_hits"} <= after_old.keys()
    assert deltas(before_old, after_old) == deltas(before_new, after_new)
    assert deltas(before_old, after_old)["server_itl_count"] == 8


@pytest.mark.parametrize("old_first", [True, False])
def test_with_new_and_deprecated_names_together_the_new_one_wins(old_first):
    # vLLM 0.11 exports ITL beside the deprecated TPOT: read one, never their sum. Different
    # numbers here, so "the last family read wins" would fail as well as "add them up".
    new = exposition({"vllm:inter_token_latency_seconds": "histogram"}, scale=1)
    old = exposition({"vllm:time_per_output_token_seconds": "histogram"}, scale=2)
    new += exposition({"vllm:kv_cache_usage_perc": "gauge"}, scale=1)
    old += exposition({"vllm:gpu_cache_usage_perc": "gauge"}, scale=2)
    snap = parse(old + new if old_first else new + old)
    assert snap["itl_count"] == 4 and snap["itl_sum"] == 1.0
    assert snap["kv_cache_usage"] == 0.5


def test_old_sglang_itl_name_is_read():
    old = parse(exposition({"sglang:time_per_output_token_seconds": "histogram"}))
    new = parse(exposition({"sglang:inter_token_latency_seconds": "histogram"}))
    assert old == new and old["engine"] == "sglang" and old["itl_count"] == 4


def test_untyped_counters_keep_their_total_suffix():
    text = 'vllm:prompt_tokens_total{model_name="m"} 7\nvllm:num_requests_waiting 2\n'
    assert parse(text) == {"prompt_tokens": 7.0, "waiting": 2.0, "engine": "vllm"}


def test_lookup_strips_total_only_for_counters():
    assert lookup("vllm:prompt_tokens")[1].key == "prompt_tokens"
    assert lookup("vllm:prompt_tokens_total")[1].key == "prompt_tokens"
    assert lookup("vllm:iteration_tokens_total")[1].kind == "histogram"
    assert lookup("vllm:time_to_first_token_seconds_total") is None
    assert lookup("vllm:no_such_metric") is None
    engine, metric, rank = lookup("vllm:gpu_cache_usage_perc")
    assert (engine, metric.key, rank) == ("vllm", "kv_cache_usage", 1)


def test_the_table_is_well_formed():
    assert len({m.key for m in METRICS}) == len(METRICS)
    for metric in METRICS:
        assert metric.kind in ("gauge", "counter", "histogram"), metric.key
        assert metric.vllm or metric.sglang, metric.key
        assert all(n.startswith("vllm:") for n in metric.vllm), metric.key
        assert all(n.startswith("sglang:") for n in metric.sglang), metric.key
        if metric.kind == "counter":  # the exporter adds _total itself
            assert not any(n.endswith("_total") for n in (*metric.vllm, *metric.sglang))


def simulator_families(engine: str) -> list:
    model = LLAMA if engine == "vllm" else QWEN
    settings = {"enable_metrics": True} if engine == "sglang" else {}
    cfg = build_config(engine, model, settings, resolve_gpu("h100-sxm"))
    core = EngineCore(cfg)
    metrics = EngineMetrics(cfg)
    core.itl = metrics
    # Some traffic: SGLang shows a family only once something wrote to it.
    hashes = list(range(20))
    for i in range(3):
        core.add(Request(str(i), 320, hashes, 4, 4, 0.0))
    now = 0.0
    while core.has_work:
        step = core.step(now)
        metrics.on_step(core, step)
        now = step.end
        for req in step.finished:
            metrics.on_finished(req)
    text = metrics.exposition().decode()
    # prometheus_client adds a *_created gauge beside each counter and histogram: a timestamp
    # of the exporter's, not an engine metric.
    families = [
        f
        for f in text_string_to_metric_families(text)
        if ":" in f.name and not f.name.endswith("_created")
    ]
    return families, text


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_simulators_names_in_the_table_are_read_as_the_newest(engine):
    families, text = simulator_families(engine)
    assert len(families) >= 20
    names = {f.name for f in families}
    for family in families:
        found = lookup(family.name)
        if found is None:
            continue  # a family no reader of ours uses (the parity tests check it exists)
        found_engine, metric, rank = found
        assert found_engine == engine, family.name
        # The newest name, or a deprecated one shown beside it (vLLM 0.11's TPOT next to ITL),
        # which the reader then ignores.
        assert rank == 0 or metric.names(engine)[0] in names, family.name
        assert metric.kind == family.type, family.name
    # And the scraper finds every key it reads that the table gives this engine.
    snap = parse(text)
    wanted = [k for k in (*GAUGES, *COUNTERS, *HISTOGRAMS) if BY_KEY[k].names(engine)]
    exported = {lookup(f.name)[1].key for f in families if lookup(f.name)}
    for key in wanted:
        if key in exported:
            assert key in snap or f"{key}_count" in snap, key


@pytest.mark.parametrize(("engine", "table"), [("vllm", VLLM_0_11_0), ("sglang", SGLANG_0_5_3)])
def test_the_newest_names_are_real_families_of_the_engine(engine, table):
    # Each name our readers try first is a family the engine's source declares (vLLM 0.11.0,
    # SGLang 0.5.3: tests/hosts/simulator/metric_reference.py), of the same kind: a name made
    # up or misremembered would never match a real exposition.
    for metric in METRICS:
        names = metric.names(engine)
        if not names:
            continue
        assert names[0] in table, f"{names[0]} is not a family of {engine}"
        assert table[names[0]].type == metric.kind, names[0]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_simulator_serves_every_endpoint(engine):
    model = LLAMA if engine == "vllm" else QWEN
    app = create_app(EngineRunner(build_config(engine, model, {}, resolve_gpu("h100-sxm"))))
    paths = {route.path for route in app.routes}
    ends = endpoints(engine)
    for path in (ends.health, ends.models, ends.metrics, ends.version, ends.health_generate):
        if path is not None:
            assert path in paths, path


def test_endpoints():
    assert ENDPOINTS["vllm"].version == "/version" and ENDPOINTS["vllm"].health_generate is None
    sglang = endpoints("sglang")
    assert (sglang.version, sglang.version_key) == ("/get_server_info", "version")
    assert sglang.metrics_flag == "enable_metrics"
    with pytest.raises(ValueError, match="unknown engine"):
        endpoints("tgi")
