"""The lengths a deployment's real traffic has, for the advisor: from the newest run of a
profile made from a traffic sample (a replay's rows, a fit's empirical distributions), and the
length facts of any set of requests (``lengths``). Part of the snapshot
``changes.services.diagnosis_facts`` gathers."""

from __future__ import annotations

from benchmarks.choices import ProfileSource
from benchmarks.loadgen.stats import percentile
from benchmarks.models import BenchmarkRun
from changes.advisor.facts import LengthFacts
from hosts.models import Deployment


def lengths(inputs: list[float], outputs: list[float], prefix_tokens: float | None):
    if not inputs:
        return None
    inputs_sorted, outputs_sorted = sorted(inputs), sorted(outputs)
    totals = sorted(i + o for i, o in zip(inputs, outputs, strict=True))
    share = None
    if prefix_tokens is not None and sum(inputs):
        share = min(1.0, prefix_tokens / sum(inputs))
    return LengthFacts(
        input_p50=percentile(inputs_sorted, 50),
        input_p99=percentile(inputs_sorted, 99),
        output_p50=percentile(outputs_sorted, 50) if outputs_sorted else None,
        output_p99=percentile(outputs_sorted, 99) if outputs_sorted else None,
        total_p99=percentile(totals, 99),
        shared_prefix_share=share,
    )


def traffic_facts(deployment: Deployment) -> LengthFacts | None:
    """Lengths of the deployment's real traffic, when a profile made from a traffic sample
    (fitted or replayed, ``benchmarks.services.profiles.profile_from_traffic``) was run on it:
    a replay's rows exactly, a fit's empirical distributions where it kept them."""
    run = (
        BenchmarkRun.objects.filter(
            deployment=deployment,
            load_profile__source__in=(ProfileSource.TRAFFIC, ProfileSource.REPLAY),
        )
        .select_related("load_profile")
        .order_by("-created_at", "-pk")
        .first()
    )
    if run is None:
        return None
    spec = run.load_profile.spec or {}
    prefix_len = int(spec.get("prefix_len") or 0)
    rows = (spec.get("replay") or {}).get("rows")
    if rows:
        inputs = [float(r[1]) for r in rows]
        outputs = [float(r[2]) for r in rows]
        # A replay row is the whole prompt as recorded, its prefix within it.
        shared = sum(min(prefix_len, float(r[1])) for r in rows if len(r) > 3 and r[3] is not None)
        return lengths(inputs, outputs, shared)
    inputs = _length_weights(spec.get("input_len"))
    outputs = _length_weights(spec.get("output_len"))
    if not inputs:
        return None
    share = float(spec.get("prefix_share") or 0) if prefix_len else 0.0
    if share and not spec.get("prefix_within_input"):
        # The prompt as sent: the prefix on top of the own part, for ``share`` of requests.
        inputs = _mixture(
            [(n + prefix_len, w * share) for n, w in inputs]
            + [(n, w * (1 - share)) for n, w in inputs]
        )
    mean_input = sum(n * w for n, w in inputs)
    return LengthFacts(
        input_p50=_weighted_quantile(inputs, 0.50),
        input_p99=_weighted_quantile(inputs, 0.99),
        output_p50=_weighted_quantile(outputs, 0.50) if outputs else None,
        output_p99=_weighted_quantile(outputs, 0.99) if outputs else None,
        # The load generator draws a request's input and output lengths independently, so
        # the total a fitted profile sends is distributed as the sum of two independent draws.
        total_p99=_weighted_quantile(_sum_of(inputs, outputs or [(0.0, 1.0)]), 0.99),
        shared_prefix_share=min(1.0, share * prefix_len / mean_input) if mean_input else None,
    )


def _length_weights(dist) -> list[tuple[float, float]]:
    """A length distribution of a profile document as (length, probability) pairs, sorted:
    an empirical one's ``[[length, weight], …]`` (what ``traffic.fit`` writes) normalised,
    clamped to its ``low``/``high`` as the load generator clamps; a fixed one as one point.
    Other kinds give no pairs (no sample to read lengths from)."""
    if not isinstance(dist, dict):
        return []
    kind = dist.get("kind", "fixed")
    if kind == "fixed":
        return [(float(dist.get("mean") or 0), 1.0)] if dist.get("mean") else []
    if kind != "empirical":
        return []
    low, high = dist.get("low"), dist.get("high")
    pairs: dict[float, float] = {}
    for item in dist.get("values") or []:
        if not isinstance(item, list | tuple) or len(item) != 2:
            continue  # not the shape traffic.fit writes: ignored rather than crash the advisor
        length, weight = float(item[0]), float(item[1])
        if low is not None:
            length = max(length, float(low))
        if high is not None:
            length = min(length, float(high))
        if weight > 0:
            pairs[length] = pairs.get(length, 0.0) + weight
    total = sum(pairs.values())
    return [(n, w / total) for n, w in sorted(pairs.items())] if total else []


def _mixture(pairs: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: dict[float, float] = {}
    for n, w in pairs:
        if w > 0:
            merged[n] = merged.get(n, 0.0) + w
    return sorted(merged.items())


def _sum_of(a: list[tuple[float, float]], b: list[tuple[float, float]]):
    sums: dict[float, float] = {}
    for x, p in a:
        for y, q in b:
            sums[x + y] = sums.get(x + y, 0.0) + p * q
    return sorted(sums.items())


def _weighted_quantile(pairs: list[tuple[float, float]], q: float) -> float:
    """The smallest length whose cumulative probability reaches ``q`` (the inverse CDF)."""
    cumulative = 0.0
    for length, weight in pairs:
        cumulative += weight
        if cumulative >= q - 1e-9:
            return length
    return pairs[-1][0]
