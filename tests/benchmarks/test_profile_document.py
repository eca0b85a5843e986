"""The load profile document: defaults, refusals with clear messages, the LoadSpec it becomes,
the plan, the one-line description, the built-in starters, export and comparison."""

import copy

import pytest

from benchmarks.loadgen import profile as P
from benchmarks.loadgen.spec import SpecError


def doc(**fields) -> dict:
    base = {"stages": [{"name": "main", "concurrency": 4, "num_requests": 10}]}
    base.update(fields)
    return base


# -- normalize ------------------------------------------------------------------------------


def test_normalize_fills_every_default_without_touching_the_input():
    given = {"seed": 3}
    out = P.normalize(given)
    assert given == {"seed": 3}
    assert set(out) == set(P.DEFAULTS)
    assert out["seed"] == 3 and out["stages"] == [
        {"name": "main", "concurrency": 8, "num_requests": 100}
    ]
    out["stages"][0]["concurrency"] = 99
    assert P.DEFAULTS["stages"][0]["concurrency"] == 8  # defaults are copied, not shared


def test_unnamed_stages_are_numbered():
    out = P.normalize(
        {
            "stages": [
                {"concurrency": 1, "num_requests": 1},
                {"name": "x", "concurrency": 2, "num_requests": 1},
            ]
        }
    )
    assert [s["name"] for s in out["stages"]] == ["stage-1", "x"]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "profile: must be a JSON object"),
        ({"concurency": 8}, "profile: unknown field(s) concurency"),
        ({"stages": {"name": "x"}}, "stages: must be a list of stages"),
        ({"stages": ["x"]}, "stages[1]: must be an object"),
        ({"stages": [{"name": "a", "rate": 2}]}, "stages[1]: unknown field(s) rate"),
        ({"stages": [{"name": "a"}, {"name": "a"}]}, "stages: stage names must be unique"),
        ({"input_len": 512}, "input_len: must be an object"),
        ({"output_len": {"kind": "fixed", "avg": 3}}, "output_len: unknown field(s) avg"),
        ({"slo": [500]}, "slo: must be an object"),
        ({"replay": {"rows": []}}, "replay: no rows"),
        ({"replay": [[0, 1, 1]]}, "replay: must be"),
    ],
)
def test_normalize_refuses_with_the_field_named(document, message):
    with pytest.raises(SpecError) as info:
        P.normalize(document)
    assert message in str(info.value)


# -- validate -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            doc(stages=[{"name": "s", "num_requests": 5, "concurrency": 0}]),
            "stage 's': a closed-loop stage needs concurrency >= 1",
        ),
        (
            doc(stages=[{"name": "s", "request_rate": 0, "num_requests": 5}]),
            "stage 's': request_rate must be > 0",
        ),
        (
            doc(stages=[{"name": "s", "concurrency": 2}]),
            "stage 's': give num_requests or duration_s",
        ),
        (
            doc(stages=[{"name": "s", "concurrency": "many", "num_requests": 1}]),
            "stage 's': concurrency must be a number",
        ),
        (
            doc(stages=[{"name": "s", "request_rate": 1, "burstiness": -1, "num_requests": 1}]),
            "stage 's': burstiness must be > 0",
        ),
        (doc(stages=[]), "stages: at least one stage"),
        (
            doc(input_len={"kind": "uniform", "low": 10}),
            "input_len: uniform needs 1 <= low <= high",
        ),
        (doc(input_len={"kind": "zipf"}), "input_len: unknown distribution 'zipf'"),
        (doc(output_len={"kind": "fixed", "mean": 0}), "output_len: mean must be >= 1"),
        (doc(output_len={"kind": "empirical", "values": []}), "output_len: empirical values"),
        (doc(prefix_share=1.5, prefix_len=10), "prefix: need prefix_len >= 0"),
        (doc(slo={"latency": 5}), "goodput: unknown metric 'latency'"),
        (doc(slo={"ttft": 0}), "goodput: ttft must be > 0 ms"),
        (doc(max_error_rate=2), "max_error_rate: must be between 0 and 1"),
        (doc(warmup_requests=-1), "warmup_requests: must be >= 0"),
        (doc(endpoint="/v1/embeddings"), "endpoint: '/v1/embeddings' is not"),
        (doc(replay={"rows": [[0, 10]]}), "replay row 1: [t, input_tokens, output_tokens]"),
        (doc(replay={"rows": [[0, 10, 5], [-1, 10, 5]]}), "replay row 2: t >= 0"),
        (doc(replay={"rows": [[0, 10, 5]], "time_scale": 0}), "trace.time_scale: must be > 0"),
    ],
)
def test_validate_refuses_what_would_not_run(document, message):
    with pytest.raises(SpecError) as info:
        P.validate(document)
    assert message in str(info.value)


def test_validate_returns_the_normalised_document():
    out = P.validate(doc(seed=9))
    assert out == P.normalize(doc(seed=9)) and out["warmup_requests"] == 10


# -- build_spec -----------------------------------------------------------------------------


def test_build_spec_maps_the_document_onto_a_load_spec():
    spec = P.build_spec(
        {
            "endpoint": "/v1/chat/completions",
            "stages": [
                {"name": "warm", "concurrency": 4, "num_requests": 20},
                {
                    "name": "peak",
                    "request_rate": 2.5,
                    "burstiness": 0.5,
                    "max_concurrency": 64,
                    "duration_s": 30,
                    "concurrency": 9,
                },
            ],
            "input_len": {"kind": "lognormal", "mean": 600, "stddev": 0.7, "low": 16, "high": 4096},
            "output_len": {"kind": "empirical", "values": [[100, 3], [200, 1]]},
            "prefix_len": 2000,
            "prefix_groups": 4,
            "prefix_share": 0.9,
            "warmup_requests": 3,
            "slo": {"ttft": 500, "tpot": 50},
            "seed": 42,
            "max_error_rate": 0.1,
        },
        "http://engine:8000",
        "llama",
        api_key="k",
    )
    warm, peak = spec.stages
    assert (warm.concurrency, warm.request_rate, warm.num_requests) == (4, None, 20)
    # An open-loop stage drops a stray concurrency: the rate decides.
    assert (peak.concurrency, peak.request_rate, peak.burstiness) == (None, 2.5, 0.5)
    assert (peak.max_concurrency, peak.num_requests, peak.duration_s) == (64, None, 30.0)
    d = spec.dataset
    assert (d.input_len.kind, d.input_len.mean, d.input_len.stddev) == ("lognormal", 600.0, 0.7)
    assert (d.input_len.low, d.input_len.high) == (16, 4096)
    assert d.output_len.values == ((100, 3.0), (200, 1.0))
    assert (d.prefix_len, d.prefix_groups, d.prefix_share) == (2000, 4, 0.9)
    assert d.prompt_format == "text"  # the chat endpoint takes text
    assert spec.goodput == {"ttft": 500.0, "tpot": 50.0}
    assert (spec.warmup_requests, spec.seed, spec.max_error_rate) == (3, 42, 0.1)
    assert (spec.base_url, spec.model, spec.api_key, spec.trace) == (
        "http://engine:8000",
        "llama",
        "k",
        None,
    )


def test_completions_use_token_ids_and_a_replay_needs_its_file(tmp_path):
    assert P.build_spec(doc(), "http://e", "m").dataset.prompt_format == "token_ids"
    replay = doc(replay={"rows": [[0, 10, 5], [2, 20, 6, 1]], "time_scale": 0.5})
    with pytest.raises(SpecError, match="write_replay"):
        P.build_spec(replay, "http://e", "m")
    path = P.write_replay(replay, tmp_path / "trace.jsonl")
    spec = P.build_spec(replay, "http://e", "m", trace_path=path)
    assert spec.stages == () and spec.trace.time_scale == 0.5
    lines = (tmp_path / "trace.jsonl").read_text().splitlines()
    assert lines[1] == '{"timestamp": 2, "input_tokens": 20, "output_tokens": 6, "prefix_id": 1}'


# -- plan and describe ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stages", "expected"),
    [
        ([{"name": "a", "concurrency": 4, "num_requests": 40}], (40, None)),
        ([{"name": "a", "request_rate": 2, "num_requests": 40}], (40, 20.0)),
        ([{"name": "a", "request_rate": 2, "duration_s": 30}], (60, 30.0)),
        ([{"name": "a", "request_rate": 4, "duration_s": 30, "num_requests": 40}], (40, 10.0)),
        ([{"name": "a", "concurrency": 4, "duration_s": 30}], (None, 30.0)),
        (
            [
                {"name": "a", "request_rate": 2, "num_requests": 10},
                {"name": "b", "request_rate": 5, "duration_s": 4},
            ],
            (30, 9.0),
        ),
    ],
)
def test_plan_counts_requests_and_seconds(stages, expected):
    assert P.plan({"stages": stages}) == expected


def test_plan_of_a_replay_is_its_span_scaled():
    assert P.plan(doc(replay={"rows": [[1, 1, 1], [3, 1, 1], [9, 1, 1]], "time_scale": 2})) == (
        3,
        16.0,
    )


def test_describe_reads_as_one_line():
    text = P.describe(
        {
            "stages": [
                {"name": "low", "concurrency": 4, "num_requests": 40},
                {"name": "peak", "request_rate": 2.5, "duration_s": 60},
            ],
            "input_len": {"kind": "uniform", "low": 100, "high": 200},
            "output_len": {"kind": "empirical", "values": [[100, 1], [300, 1]]},
            "prefix_len": 500,
            "prefix_share": 0.25,
            "slo": {"ttft": 500},
        }
    )
    assert text == (
        "low: 4 concurrent, 40 req; peak: 2.5 req/s, 60 s · 100–200→~200 (sampled) tokens, "
        "+ 500-token shared prefix on 25%, SLO ttft≤500ms"
    )
    assert P.describe({"bogus": 1}).startswith("invalid: profile: unknown field(s) bogus")


def test_length_text():
    assert P.length_text({"kind": "fixed", "mean": 512}) == "fixed: 512 tokens"
    assert P.length_text(
        {"kind": "lognormal", "mean": 600, "stddev": 0.7, "low": 16, "high": 4096}
    ) == ("lognormal: mean 600, sigma 0.7, within 16–4096")
    assert P.length_text({"kind": "normal", "mean": 200, "stddev": 60, "high": 512}) == (
        "normal: mean 200, stddev 60, at most 512"
    )
    assert P.length_text(
        {"kind": "empirical", "values": [[100, 3], [500, 1]], "low": 90, "high": 700}
    ) == ("from a traffic sample: 2 lengths, mean 200, within 90–700")


# -- the starters ---------------------------------------------------------------------------


def test_builtins_are_the_four_starters_and_all_validate():
    assert list(P.BUILTINS) == [
        "Interactive chat",
        "RAG long-prompt",
        "Offline batch",
        "Shared system prompt",
    ]
    for name, item in P.BUILTINS.items():
        out = P.validate(item["spec"])
        assert item["description"], name
        requests, _ = P.plan(out)
        assert requests and requests > 0, name
    chat = P.validate(P.BUILTINS["Interactive chat"]["spec"])
    assert [s["name"] for s in chat["stages"]] == ["low", "normal", "peak"]
    shared = P.validate(P.BUILTINS["Shared system prompt"]["spec"])
    assert (shared["prefix_len"], shared["prefix_groups"], shared["prefix_share"]) == (2000, 4, 0.9)


# -- export and comparison ------------------------------------------------------------------


def test_export_and_read_back():
    spec = P.validate(doc(seed=5))
    exported = P.export_document("Chat", "desc", spec)
    assert exported == {
        "format": "llm-control-panel/load-profile",
        "version": 2,
        "name": "Chat",
        "description": "desc",
        "spec": spec,
    }
    assert P.read_export(copy.deepcopy(exported)) == ("Chat", "desc", spec)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected a JSON object"),
        ({"name": "x", "spec": {}}, "no format field"),
        ({"format": "vllm-bench", "name": "x", "spec": {}}, "format 'vllm-bench'"),
        (
            {"format": "llm-control-panel/load-profile", "version": 3, "name": "x", "spec": {}},
            "version 3",
        ),
        (
            {"format": "llm-control-panel/load-profile", "version": 1, "name": " ", "spec": {}},
            "name must be",
        ),
        ({"format": "llm-control-panel/load-profile", "version": 1, "name": "x"}, "no spec"),
        (
            {
                "format": "llm-control-panel/load-profile",
                "version": 1,
                "name": "x",
                "spec": {"x": 1},
            },
            "unknown field(s) x",
        ),
    ],
)
def test_read_export_refuses_anything_else(data, message):
    with pytest.raises(SpecError) as info:
        P.read_export(data)
    assert message in str(info.value)


def test_changed_fields_ignores_spelled_out_defaults():
    old = doc()
    new = doc(seed=0, warmup_requests=10, slo={"ttft": 100})
    assert P.changed_fields(old, new) == ["slo"]
    assert P.changed_fields(old, old) == []
    assert P.changed_fields(
        doc(), {"stages": [{"name": "main", "concurrency": 5, "num_requests": 10}]}
    ) == ["stages"]
