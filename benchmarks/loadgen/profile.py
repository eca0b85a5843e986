"""Load profiles: the JSON document a team saves and shares, and its translation into a
``LoadSpec`` aimed at one engine (pure: no Django).

A profile says *what load* (stages, arrivals, token lengths, shared prefixes, warm-up, SLOs);
the deployment it runs against supplies *where* (base URL, model, API key). Keeping the two
apart is what lets the same profile measure every config of every deployment fairly.

Document (every key optional; ``normalize`` fills the defaults)::

    {"endpoint": "/v1/completions",
     "stages": [{"name": "peak", "concurrency": 64, "num_requests": 500}, ...],
     "input_len": {"kind": "lognormal", "mean": 900, "stddev": 0.6, "high": 8000},
     "output_len": {"kind": "fixed", "mean": 200},
     "prefix_len": 0, "prefix_groups": 1, "prefix_share": 1.0, "prefix_within_input": false,
     "warmup_requests": 10, "slo": {"ttft": 500, "tpot": 50},
     "seed": 0, "ignore_eos": true, "max_error_rate": null, "request_timeout_s": 600,
     "replay": null | {"rows": [[t, input_tokens, output_tokens, prefix_id|null], ...],
                       "time_scale": 1.0}}

A request that shares a prefix sends ``prefix_len`` shared tokens on top of its own
``input_len`` tokens, as vLLM's ``--random-prefix-len`` does (``prefix_share`` of the requests
share one of ``prefix_groups`` prefixes). ``prefix_within_input: true`` makes ``input_len``
the whole prompt, the prefix's tokens its first ones (cut to it): how a traffic sample counts
a request (``traffic.fit`` sets it), and the panel's former rule, which the versions saved
under it keep so that they and their runs still say what was sent. A replay row's input is
the whole prompt as recorded, its prefix counted within it.

``max_error_rate`` is the share of failed requests (0 to 1) above which a run stops early and
fails: the engine, not the load, would decide its numbers. ``null`` leaves it to the panel's
default (``BENCHMARK_MAX_ERROR_PERCENT``); ``1`` never stops on the rate.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from benchmarks.loadgen.spec import Dataset, LengthDist, LoadSpec, SpecError, Stage, Trace

STAGE_KEYS = {
    "name",
    "concurrency",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "num_requests",
    "duration_s",
}
DIST_KEYS = {"kind", "mean", "stddev", "low", "high", "values"}
DEFAULTS = {
    "endpoint": "/v1/completions",
    "stages": [{"name": "main", "concurrency": 8, "num_requests": 100}],
    "input_len": {"kind": "fixed", "mean": 512},
    "output_len": {"kind": "fixed", "mean": 128},
    "prefix_len": 0,
    "prefix_groups": 1,
    "prefix_share": 1.0,
    "prefix_within_input": False,
    "warmup_requests": 10,
    "slo": {},
    "seed": 0,
    "ignore_eos": True,
    "max_error_rate": None,
    "request_timeout_s": 600.0,
    "workers": 1,
    "replay": None,
}
MAX_REPLAY_ROWS = 100_000


def normalize(profile: dict) -> dict:
    """The profile with every default filled in; unknown keys are refused (a typo such as
    ``concurency`` would otherwise silently run the default load)."""
    if not isinstance(profile, dict):
        raise SpecError("profile: must be a JSON object")
    unknown = sorted(set(profile) - set(DEFAULTS))
    if unknown:
        raise SpecError(f"profile: unknown field(s) {', '.join(unknown)}")
    out = copy.deepcopy(DEFAULTS)
    out.update(copy.deepcopy(profile))
    if not isinstance(out["stages"], list):
        raise SpecError("stages: must be a list of stages")
    for number, stage in enumerate(out["stages"], start=1):
        if not isinstance(stage, dict):
            raise SpecError(f"stages[{number}]: must be an object")
        bad = sorted(set(stage) - STAGE_KEYS)
        if bad:
            raise SpecError(f"stages[{number}]: unknown field(s) {', '.join(bad)}")
        stage.setdefault("name", f"stage-{number}")
    names = [s["name"] for s in out["stages"]]
    if len(set(names)) != len(names):
        raise SpecError("stages: stage names must be unique")
    for key in ("input_len", "output_len"):
        dist = out[key]
        if not isinstance(dist, dict):
            raise SpecError(f"{key}: must be an object")
        bad = sorted(set(dist) - DIST_KEYS)
        if bad:
            raise SpecError(f"{key}: unknown field(s) {', '.join(bad)}")
    if not isinstance(out["prefix_within_input"], bool):
        raise SpecError("prefix_within_input: must be true or false")
    if not isinstance(out["slo"], dict):
        raise SpecError('slo: must be an object such as {"ttft": 500}')
    replay = out["replay"]
    if replay is not None:
        if not isinstance(replay, dict) or not isinstance(replay.get("rows"), list):
            raise SpecError('replay: must be {"rows": [[t, input, output], ...]}')
        if not replay["rows"]:
            raise SpecError("replay: no rows")
        if len(replay["rows"]) > MAX_REPLAY_ROWS:
            raise SpecError(f"replay: at most {MAX_REPLAY_ROWS} rows")
    return out


def _dist(data: dict, name: str) -> LengthDist:
    try:
        values = tuple((int(n), float(w)) for n, w in data.get("values") or ())
        return LengthDist(
            kind=data.get("kind", "fixed"),
            mean=float(data.get("mean", 512)),
            stddev=float(data.get("stddev") or 0.0),
            low=None if data.get("low") is None else int(data["low"]),
            high=None if data.get("high") is None else int(data["high"]),
            values=values,
        )
    except (TypeError, ValueError):
        raise SpecError(f"{name}: numbers expected") from None


def _stage(data: dict) -> Stage:
    def number(key, kind):
        value = data.get(key)
        if value is None:
            return None
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise SpecError(f"stage {data.get('name')!r}: {key} must be a number") from None

    rate = number("request_rate", float)
    concurrency = number("concurrency", int)
    return Stage(
        name=str(data["name"]),
        concurrency=None if rate is not None else concurrency,
        request_rate=rate,
        burstiness=number("burstiness", float) or 1.0,
        max_concurrency=number("max_concurrency", int),
        num_requests=number("num_requests", int),
        duration_s=number("duration_s", float),
    )


def build_spec(
    profile: dict,
    base_url: str,
    model: str,
    *,
    api_key: str | None = None,
    trace_path: str | None = None,
    record_requests: bool = True,
) -> LoadSpec:
    """The load generator spec for ``profile`` against one engine, validated.

    A replay profile needs its rows on disk (``write_replay`` makes the file); the caller
    passes its path.
    """
    p = normalize(profile)
    if p["replay"] is not None and trace_path is None:
        raise SpecError("replay: the rows must be written to a file first (write_replay)")
    try:
        spec = LoadSpec(
            base_url=base_url,
            model=model,
            endpoint=p["endpoint"],
            stages=tuple(_stage(s) for s in p["stages"]) if p["replay"] is None else (),
            dataset=Dataset(
                input_len=_dist(p["input_len"], "input_len"),
                output_len=_dist(p["output_len"], "output_len"),
                prefix_len=int(p["prefix_len"]),
                prefix_groups=int(p["prefix_groups"]),
                prefix_share=float(p["prefix_share"]),
                prefix_within_input=p["prefix_within_input"],
                prompt_format="text" if p["endpoint"].endswith("chat/completions") else "token_ids",
            ),
            trace=Trace(trace_path, float(p["replay"].get("time_scale", 1.0)))
            if p["replay"] is not None
            else None,
            warmup_requests=int(p["warmup_requests"]),
            ignore_eos=bool(p["ignore_eos"]),
            request_timeout_s=float(p["request_timeout_s"]),
            api_key=api_key,
            seed=int(p["seed"]),
            goodput={str(k): float(v) for k, v in p["slo"].items()},
            max_error_rate=None if p["max_error_rate"] is None else float(p["max_error_rate"]),
            record_requests=record_requests,
            workers=int(p["workers"]),
        )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, SpecError):
            raise
        raise SpecError(f"profile: {exc}") from None
    spec.validate()
    return spec


def validate(profile: dict) -> dict:
    """Normalise and check ``profile`` the way a run would; returns the normalised document.
    Raises ``SpecError`` whose message names the field and what is wrong."""
    p = normalize(profile)
    build_spec(p, "http://validate.invalid", "model", trace_path="replay.jsonl")
    if p["replay"] is not None:
        for number, row in enumerate(p["replay"]["rows"], start=1):
            if not isinstance(row, list | tuple) or len(row) not in (3, 4):
                raise SpecError(f"replay row {number}: [t, input_tokens, output_tokens]")
            try:
                if float(row[0]) < 0 or int(row[1]) < 1 or int(row[2]) < 1:
                    raise ValueError
            except (TypeError, ValueError):
                raise SpecError(
                    f"replay row {number}: t >= 0 and token counts >= 1 expected"
                ) from None
    return p


def write_replay(profile: dict, path: str | Path) -> str:
    """Write a replay profile's rows as the JSONL trace the load generator reads."""
    rows = normalize(profile)["replay"]["rows"]
    with open(path, "w") as handle:
        for row in rows:
            item = {"timestamp": row[0], "input_tokens": row[1], "output_tokens": row[2]}
            if len(row) > 3 and row[3] is not None:
                item["prefix_id"] = row[3]
            handle.write(json.dumps(item) + "\n")
    return str(path)


def plan(profile: dict) -> tuple[int | None, float | None]:
    """(requests, seconds) the run is expected to take, warm-up excluded, for the progress
    bar and the task's time limit. A stage bounded only by time counts its duration; one
    bounded only by count counts its requests; ``None`` where a part cannot be known."""
    p = normalize(profile)
    if p["replay"] is not None:
        rows = p["replay"]["rows"]
        span = (float(rows[-1][0]) - float(rows[0][0])) * float(p["replay"].get("time_scale", 1))
        return len(rows), max(span, 0.0)
    requests, seconds = 0, 0.0
    requests_known = seconds_known = True
    for stage in p["stages"]:
        count, duration = stage.get("num_requests"), stage.get("duration_s")
        rate = stage.get("request_rate")
        if count is not None and (duration is None or not rate):
            requests += int(count)
        elif duration is not None and rate:
            requests += int(min(count or float("inf"), float(rate) * float(duration)))
        else:
            requests_known = False
        if duration is not None:
            seconds += float(duration)
            if count is not None and rate:
                seconds = seconds - float(duration) + min(float(duration), count / float(rate))
        elif count is not None and rate:
            seconds += int(count) / float(rate)
        else:
            seconds_known = False
    return (requests if requests_known else None), (seconds if seconds_known else None)


def length_mean(dist: dict) -> float:
    """The mean length a distribution document draws (as ``LengthDist.sample`` does, before
    its ``low``/``high`` clamp of the unbounded kinds); an empirical one's values are
    ``[length, weight]`` pairs (what ``traffic.fit`` writes) or bare lengths."""
    kind = dist.get("kind", "fixed")
    if kind == "uniform" and dist.get("low") is not None:
        return (float(dist["low"]) + float(dist.get("high", dist["low"]))) / 2
    if kind == "empirical" and dist.get("values"):
        pairs = [v if isinstance(v, list | tuple) else (v, 1) for v in dist["values"]]
        total = sum(float(w) for _, w in pairs)
        if total > 0:
            return sum(float(n) * float(w) for n, w in pairs) / total
    return float(dist.get("mean") or 1)


def prompt_tokens(profile: dict) -> tuple[float, float]:
    """(prompt tokens a request sends on average, of which in a shared prefix): the one
    reading of ``prefix_len`` that the KV math, the predictions and the advisor share with
    the load generator (``dataset.PromptFactory``). A replay's rows are whole prompts."""
    p = normalize(profile)
    prefix = int(p["prefix_len"] or 0)
    if p["replay"] is not None:
        rows = p["replay"]["rows"]
        total = sum(float(r[1]) for r in rows)
        shared = sum(
            min(prefix, float(r[1])) for r in rows if prefix and len(r) > 3 and r[3] is not None
        )
        return total / len(rows), shared / len(rows)
    own = length_mean(p["input_len"])
    share = float(p["prefix_share"]) if prefix else 0.0
    if p["prefix_within_input"]:
        return own, share * min(prefix, own)
    return own + share * prefix, share * prefix


def _dist_text(d: dict) -> str:
    kind = d.get("kind", "fixed")
    if kind == "fixed":
        return f"{d.get('mean', 512):g}"
    if kind == "uniform":
        return f"{d.get('low')}–{d.get('high')}"
    if kind == "empirical":
        values = d.get("values") or []
        total = sum(w for _, w in values) or 1
        mean = sum(n * w for n, w in values) / total
        return f"~{mean:.0f} (sampled)"
    return f"~{d.get('mean', 512):g} ({kind})"


def describe(profile: dict) -> str:
    """One line an engineer reads in a table: load, lengths, size."""
    try:
        p = normalize(profile)
    except SpecError as exc:
        return f"invalid: {exc}"
    if p["replay"] is not None:
        load = f"replay of {len(p['replay']['rows'])} requests"
    else:
        parts = []
        for s in p["stages"]:
            if s.get("request_rate"):
                level = f"{s['request_rate']:g} req/s"
            else:
                level = f"{s.get('concurrency') or 0} concurrent"
            size = (
                f"{s['num_requests']} req"
                if s.get("num_requests")
                else f"{s.get('duration_s', 0):g} s"
            )
            parts.append(f"{s['name']}: {level}, {size}")
        load = "; ".join(parts)
    lengths = f"{_dist_text(p['input_len'])}→{_dist_text(p['output_len'])} tokens"
    extra = ""
    if p["prefix_len"]:
        where = " (within the input)" if p["prefix_within_input"] else ""
        extra = f", + {p['prefix_len']}-token shared prefix on {p['prefix_share']:.0%}{where}"
    slo = ", SLO " + " ".join(f"{k}≤{v:g}ms" for k, v in p["slo"].items()) if p["slo"] else ""
    return f"{load} · {lengths}{extra}{slo}"


# The starters every panel has (created by a data migration, refreshed by seed_demo). Their
# numbers follow DOMAIN.md: chat is short prompts under a tight TTFT SLO, RAG is long prompts
# where prefill dominates, batch is throughput under a loose end-to-end bound, and the shared
# system prompt profile exists to show what prefix caching buys.
BUILTINS: dict[str, dict] = {
    "Interactive chat": {
        "description": "Chat traffic through the day: low, normal and peak concurrency; "
        "short prompts, medium answers; p95 TTFT is what users feel.",
        "spec": {
            "stages": [
                {"name": "low", "concurrency": 4, "num_requests": 40},
                {"name": "normal", "concurrency": 16, "num_requests": 120},
                {"name": "peak", "concurrency": 48, "num_requests": 240},
            ],
            "input_len": {"kind": "lognormal", "mean": 600, "stddev": 0.7, "low": 16, "high": 4096},
            "output_len": {"kind": "lognormal", "mean": 220, "stddev": 0.5, "low": 8, "high": 1024},
            "warmup_requests": 8,
            "slo": {"ttft": 500, "tpot": 50},
        },
    },
    "RAG long-prompt": {
        "description": "Retrieval-augmented answers: 4–8k-token prompts, short outputs, "
        "Poisson arrivals; prefill and the KV cache are the bottleneck.",
        "spec": {
            "stages": [
                {"name": "normal", "request_rate": 2.0, "max_concurrency": 64, "num_requests": 120},
                {"name": "peak", "request_rate": 5.0, "max_concurrency": 128, "num_requests": 200},
            ],
            "input_len": {"kind": "uniform", "low": 4000, "high": 8000},
            "output_len": {"kind": "normal", "mean": 200, "stddev": 60, "low": 32, "high": 512},
            "warmup_requests": 4,
            "slo": {"ttft": 2000, "tpot": 80},
        },
    },
    "Offline batch": {
        "description": "Throughput first: everything at once with high concurrency; judged "
        "on tokens/s and cost per million tokens, with a loose end-to-end bound.",
        "spec": {
            "stages": [{"name": "batch", "concurrency": 256, "num_requests": 1000}],
            "input_len": {"kind": "normal", "mean": 1000, "stddev": 300, "low": 64, "high": 4096},
            "output_len": {"kind": "normal", "mean": 400, "stddev": 120, "low": 16, "high": 1024},
            "warmup_requests": 16,
            "slo": {"e2el": 120000},
        },
    },
    "Shared system prompt": {
        "description": "Agents and assistants that reuse a 2,000-token system prompt: 90 % "
        "of requests send one of 4 shared 2,000-token prefixes, then ~300 tokens of their "
        "own. Run with prefix caching on and off.",
        "spec": {
            "stages": [{"name": "main", "concurrency": 32, "num_requests": 300}],
            "input_len": {"kind": "normal", "mean": 300, "stddev": 100, "low": 16, "high": 1024},
            "output_len": {"kind": "fixed", "mean": 150},
            "prefix_len": 2000,
            "prefix_groups": 4,
            "prefix_share": 0.9,
            "warmup_requests": 8,
            "slo": {"ttft": 400, "tpot": 50},
        },
    },
}


# -- sharing and comparing (helpers for the panel's pages) ----------------------------------

EXPORT_FORMAT = "llm-control-panel/load-profile"
# Version 2: a shared prefix comes on top of the input length. A version-1 file was written
# under the former rule, which its profile keeps (``prefix_within_input``).
EXPORT_VERSION = 2


def export_document(name: str, description: str, profile: dict) -> dict:
    """The file a team shares: what it is, which version of the format, and the profile."""
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "name": name,
        "description": description,
        "spec": profile,
    }


def read_export(data) -> tuple[str, str, dict]:
    """(name, description, validated profile) of an exported file's parsed JSON; refuses
    anything else with a message that says what it is instead."""
    if not isinstance(data, dict):
        raise SpecError("import: not a load profile export (expected a JSON object)")
    found = data.get("format")
    if found != EXPORT_FORMAT:
        what = f"format {found!r}" if found else "no format field"
        raise SpecError(f"import: not a load profile export ({what}; expected {EXPORT_FORMAT!r})")
    version = data.get("version")
    if version not in (1, EXPORT_VERSION) or isinstance(version, bool):
        raise SpecError(
            f"import: version {version!r} of the format is not supported "
            f"(this panel reads versions 1 and {EXPORT_VERSION})"
        )
    name = data.get("name")
    if not isinstance(name, str) or not name.strip() or len(name.strip()) > 100:
        raise SpecError("import: name must be a text of 1 to 100 characters")
    description = data.get("description") or ""
    if not isinstance(description, str):
        raise SpecError("import: description must be text")
    if "spec" not in data:
        raise SpecError("import: no spec")
    spec = data["spec"]
    if version == 1 and isinstance(spec, dict) and spec.get("prefix_len"):
        spec = {"prefix_within_input": True, **spec}
    return name.strip(), description, validate(spec)


def changed_fields(old: dict, new: dict) -> list[str]:
    """The top-level fields whose values differ between two documents, defaults filled in
    (so spelling out a default is no change)."""
    try:
        a, b = normalize(old), normalize(new)
    except SpecError:
        a, b = dict(old or {}), dict(new or {})
    return [key for key in dict.fromkeys([*a, *b]) if a.get(key) != b.get(key)]


def length_text(dist: dict) -> str:
    """A length distribution in words: "lognormal: mean 600, sigma 0.7, within 16–4096"."""
    kind = dist.get("kind", "fixed")
    low, high = dist.get("low"), dist.get("high")
    bounds = f", within {low}–{high}" if low is not None and high is not None else ""
    if low is not None and high is None:
        bounds = f", at least {low}"
    elif high is not None and low is None:
        bounds = f", at most {high}"
    if kind == "fixed":
        return f"fixed: {dist.get('mean', 512):g} tokens{bounds}"
    if kind == "uniform":
        return f"uniform: {low}–{high} tokens"
    if kind == "empirical":
        values = dist.get("values") or []
        total = sum(w for _, w in values) or 1
        mean = sum(n * w for n, w in values) / total
        return f"from a traffic sample: {len(values)} lengths, mean {mean:.0f}{bounds}"
    spread = "sigma" if kind == "lognormal" else "stddev"
    return f"{kind}: mean {dist.get('mean', 512):g}, {spread} {dist.get('stddev') or 0:g}{bounds}"
