"""Compare a candidate model's probe results with a baseline's, item by item.

Verdict rule, per group and overall, with the difference d = baseline accuracy − candidate
accuracy (positive = the candidate lost) and its paired interval (Agresti–Min, see ``stats``):

* "loss": McNemar's p < 1 − confidence AND the point loss d > max_loss;
* "no loss": the interval's upper bound ≤ max_loss;
* "cannot tell": neither; the reason says why (too few items, or an interval too wide), and
  whenever the baseline answers too few items right (``baseline_floor``): a set the engine
  cannot answer shows no loss because there is nothing to lose, not because nothing was lost.

The comparison's own verdict (``Comparison.verdict``, ``to_dict()["verdict"]``) is
``quality_verdict``'s: the words a change's page, its timeline, the API and the CLI all say —
"loss", "no loss", "no significant loss" or "cannot tell" (see its docstring).

Items are paired by id; items on one side only are listed and not counted. A request error
counts as a wrong answer (a model that times out did not answer). Agreement items (no key) count
as correct for the baseline and as correct for the candidate when its normalised answer equals
the baseline's: the baseline's answer *is* the key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from benchmarks.quality.items import ProbeItem, prompt_text
from benchmarks.quality.scorers import normalize
from benchmarks.quality.stats import (
    mcnemar,
    min_items_for_no_loss,
    paired_difference_ci,
    wilson,
)

EXCERPT_CHARS = 160

# The floor under which a comparison cannot show a loss, whatever its interval says. A loss
# shows only on items the baseline got right. With fewer than 10 of them, McNemar needs 6
# lost and none gained to reach p < 0.05 (p = 2 · 0.5⁶ = 0.031): the change could lose more
# than half of what the engine answered and pass. Below 20 % (under the 25 % a four-option
# guess scores) the engine is not answering the set as asked (its chat template, the answer
# format, a max_tokens that cuts the answer off): the probe measures that, not the change.
MIN_BASELINE_CORRECT = 10
MIN_BASELINE_ACCURACY = 0.20


def baseline_floor(correct: int, n: int) -> str | None:
    """Why a comparison cannot tell because its baseline answers too few of its ``n``
    paired items right ("the baseline scores 0.0 % …"), or None when it answers enough."""
    if n <= 0:
        return None
    accuracy = correct / n
    if correct >= MIN_BASELINE_CORRECT and accuracy >= MIN_BASELINE_ACCURACY:
        return None
    return (
        f"the baseline scores {accuracy * 100:.1f} % ({correct} of {n} items right): below "
        f"{MIN_BASELINE_ACCURACY * 100:.0f} % or {MIN_BASELINE_CORRECT} items right a loss "
        "cannot show"
    )


@dataclass
class ItemResult:
    """One item's outcome in one probe run."""

    id: str
    answer: str = ""
    correct: bool | None = None
    json_valid: bool | None = None
    schema_ok: bool | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_ms: float | None = None
    error: str | None = None
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ItemResult:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class GroupComparison:
    """The comparison for one group: overall, a category, a language, or category/language."""

    key: str
    category: str | None
    language: str | None
    n: int
    baseline_correct: int
    candidate_correct: int
    both_correct: int
    only_baseline: int
    only_candidate: int
    baseline_accuracy: float
    candidate_accuracy: float
    baseline_ci: tuple[float, float]
    candidate_ci: tuple[float, float]
    mcnemar_p: float
    loss: float
    loss_ci: tuple[float, float]
    verdict: str
    reason: str
    agreement: float | None
    json_items: int = 0
    baseline_json_valid: float | None = None
    candidate_json_valid: float | None = None
    baseline_schema_ok: float | None = None
    candidate_schema_ok: float | None = None
    baseline_errors: int = 0
    candidate_errors: int = 0


@dataclass
class Comparison:
    """Baseline versus candidate: groups (overall first), changed items, unpaired ids."""

    max_loss: float
    confidence: float
    groups: list[GroupComparison]
    changed: list[dict] = field(default_factory=list)
    only_in_baseline: list[str] = field(default_factory=list)
    only_in_candidate: list[str] = field(default_factory=list)

    @property
    def overall(self) -> GroupComparison:
        return self.groups[0]

    @property
    def judged(self) -> dict:
        """``quality_verdict`` of this comparison: ``{"verdict", "reason", "text"}``."""
        return quality_verdict({"groups": [asdict(g) for g in self.groups]})

    @property
    def verdict(self) -> str:
        return self.judged["verdict"]

    def group(self, key: str) -> GroupComparison:
        for g in self.groups:
            if g.key == key:
                return g
        raise KeyError(key)

    def to_dict(self) -> dict:
        groups = [asdict(g) for g in self.groups]
        return {
            "max_loss": self.max_loss,
            "confidence": self.confidence,
            **quality_verdict({"groups": groups}),
            "groups": groups,
            "changed": self.changed,
            "only_in_baseline": self.only_in_baseline,
            "only_in_candidate": self.only_in_candidate,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Comparison:
        groups = []
        for g in data["groups"]:
            g = dict(g)
            for name in ("baseline_ci", "candidate_ci", "loss_ci"):
                g[name] = tuple(g[name])
            groups.append(GroupComparison(**g))
        return cls(
            max_loss=data["max_loss"],
            confidence=data["confidence"],
            groups=groups,
            changed=list(data.get("changed", [])),
            only_in_baseline=list(data.get("only_in_baseline", [])),
            only_in_candidate=list(data.get("only_in_candidate", [])),
        )


@dataclass
class _Pair:
    item: ProbeItem
    base: ItemResult
    cand: ItemResult
    base_ok: bool
    cand_ok: bool
    agree: bool


def _pair(item: ProbeItem, base: ItemResult, cand: ItemResult) -> _Pair:
    base_failed = base.error is not None
    cand_failed = cand.error is not None
    agree = not base_failed and not cand_failed and normalize(base.answer) == normalize(cand.answer)
    if item.answer.scorer == "agreement":
        base_ok, cand_ok = not base_failed, agree
    else:
        base_ok = bool(base.correct) and not base_failed
        cand_ok = bool(cand.correct) and not cand_failed
    return _Pair(item, base, cand, base_ok, cand_ok, agree)


def _rate(values: list[bool | None]) -> float | None:
    return sum(1 for v in values if v) / len(values) if values else None


def verdict_for(
    b: int,
    c: int,
    n: int,
    max_loss: float,
    confidence: float,
    *,
    baseline_correct: int | None = None,
) -> tuple[str, str]:
    """("loss" | "no loss" | "cannot tell", why) for b only-baseline and c only-candidate;
    ``baseline_correct`` (when given) applies ``baseline_floor`` to anything but a loss."""
    if n == 0:
        return "cannot tell", "no paired items"
    p = mcnemar(b, c)
    loss = (b - c) / n
    low, high = paired_difference_ci(b, c, n, confidence)
    pct = f"{confidence:.0%}"
    if p < 1 - confidence and loss > max_loss:
        return "loss", (
            f"{loss:.1%} fewer correct (McNemar p={p:.3g}); more than the {max_loss:.1%} allowed"
        )
    if baseline_correct is not None and (floor := baseline_floor(baseline_correct, n)):
        return "cannot tell", floor
    if high <= max_loss:
        return "no loss", f"at {pct} confidence the loss is at most {high:.1%} ≤ {max_loss:.1%}"
    needed = min_items_for_no_loss(max_loss, confidence)
    if n < needed:
        return "cannot tell", (
            f"too few items ({n}; at least {needed} are needed to bound a loss at "
            f"{max_loss:.1%}): the loss could be up to {high:.1%}"
        )
    if p < 1 - confidence:
        return "cannot tell", (
            f"a significant loss of {loss:.1%} (p={p:.3g}), within the {max_loss:.1%} allowed, "
            f"but it could be up to {high:.1%}"
        )
    return "cannot tell", (
        f"the loss of {loss:.1%} is not significant (p={p:.3g}) but could be up to {high:.1%}"
    )


def _group(
    key: str,
    category: str | None,
    language: str | None,
    pairs: list[_Pair],
    max_loss: float,
    confidence: float,
) -> GroupComparison:
    n = len(pairs)
    both = sum(1 for p in pairs if p.base_ok and p.cand_ok)
    b = sum(1 for p in pairs if p.base_ok and not p.cand_ok)
    c = sum(1 for p in pairs if p.cand_ok and not p.base_ok)
    base_k, cand_k = both + b, both + c
    verdict, reason = verdict_for(b, c, n, max_loss, confidence, baseline_correct=base_k)
    json_pairs = [p for p in pairs if p.item.answer.scorer == "json"]
    return GroupComparison(
        key=key,
        category=category,
        language=language,
        n=n,
        baseline_correct=base_k,
        candidate_correct=cand_k,
        both_correct=both,
        only_baseline=b,
        only_candidate=c,
        baseline_accuracy=base_k / n if n else 0.0,
        candidate_accuracy=cand_k / n if n else 0.0,
        baseline_ci=wilson(base_k, n, confidence),
        candidate_ci=wilson(cand_k, n, confidence),
        mcnemar_p=mcnemar(b, c),
        loss=(b - c) / n if n else 0.0,
        loss_ci=paired_difference_ci(b, c, n, confidence),
        verdict=verdict,
        reason=reason,
        agreement=_rate([p.agree for p in pairs]),
        json_items=len(json_pairs),
        baseline_json_valid=_rate([p.base.json_valid for p in json_pairs]),
        candidate_json_valid=_rate([p.cand.json_valid for p in json_pairs]),
        baseline_schema_ok=_rate([p.base.schema_ok for p in json_pairs]),
        candidate_schema_ok=_rate([p.cand.schema_ok for p in json_pairs]),
        baseline_errors=sum(1 for p in pairs if p.base.error is not None),
        candidate_errors=sum(1 for p in pairs if p.cand.error is not None),
    )


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


def compare(
    baseline: list[ItemResult],
    candidate: list[ItemResult],
    items: list[ProbeItem],
    *,
    max_loss: float = 0.01,
    confidence: float = 0.95,
) -> Comparison:
    """Pair results by item id and judge the candidate against the baseline."""
    by_id = {i.id: i for i in items}
    base = {r.id: r for r in baseline if r.id in by_id}
    cand = {r.id: r for r in candidate if r.id in by_id}
    pairs = [_pair(by_id[i], base[i], cand[i]) for i in by_id if i in base and i in cand]
    groups = [_group("overall", None, None, pairs, max_loss, confidence)]
    categories = sorted({p.item.category for p in pairs})
    languages = sorted({p.item.language for p in pairs})
    for cat in categories:
        chosen = [p for p in pairs if p.item.category == cat]
        groups.append(_group(f"category:{cat}", cat, None, chosen, max_loss, confidence))
    for lang in languages:
        chosen = [p for p in pairs if p.item.language == lang]
        groups.append(_group(f"language:{lang}", None, lang, chosen, max_loss, confidence))
    for cat in categories:
        for lang in languages:
            chosen = [p for p in pairs if p.item.category == cat and p.item.language == lang]
            if chosen:
                groups.append(_group(f"{cat}/{lang}", cat, lang, chosen, max_loss, confidence))
    changed = [
        {
            "id": p.item.id,
            "category": p.item.category,
            "language": p.item.language,
            "prompt": _excerpt(prompt_text(p.item)),
            "baseline_answer": p.base.error and f"error: {p.base.error}" or p.base.answer,
            "candidate_answer": p.cand.error and f"error: {p.cand.error}" or p.cand.answer,
            "baseline_correct": p.base_ok,
            "candidate_correct": p.cand_ok,
        }
        for p in pairs
        if p.base_ok != p.cand_ok
    ]
    return Comparison(
        max_loss=max_loss,
        confidence=confidence,
        groups=groups,
        changed=changed,
        only_in_baseline=sorted(set(base) - set(cand)),
        only_in_candidate=sorted(set(cand) - set(base)),
    )


def accuracy_table(items: list[ProbeItem], results: list[ItemResult]) -> list[dict[str, Any]]:
    """One probe run's accuracy per category × language (agreement items not counted)."""
    by_id = {r.id: r for r in results}
    cells: dict[tuple[str, str], list[bool]] = {}
    for item in items:
        result = by_id.get(item.id)
        if result is None or item.answer.scorer == "agreement":
            continue
        ok = bool(result.correct) and result.error is None
        cells.setdefault((item.category, item.language), []).append(ok)
    rows = []
    for (cat, lang), oks in sorted(cells.items()):
        k, n = sum(oks), len(oks)
        low, high = wilson(k, n)
        rows.append(
            {"category": cat, "language": lang, "n": n, "correct": k, "low": low, "high": high}
        )
    return rows


# Fewer paired items than this overall and a comparison says nothing about a change.
MIN_ITEMS_FOR_A_VERDICT = 30


def quality_verdict(result: dict) -> dict:
    """The one verdict on a quality comparison (``Comparison.to_dict()``, stored or new),
    in words that say exactly what was shown; a change's header, its timeline, the probe
    comparison page, the API and the CLI all say these. ``{"verdict", "reason", "text"}``:

    - "loss" when the whole set, a category or a language lost significantly and by more
      than the threshold (the crossings, a dozen items each, only inform the table);
    - "cannot tell" with too few paired items (or most of them errors), or when the
      baseline answers too few items right to show a loss (``baseline_floor``: a set the
      engine cannot answer "passes" every change);
    - "no loss" when the whole set's loss is shown to be within the threshold;
    - "no significant loss" when none was significant but a loss up to the interval's upper
      bound cannot be ruled out (proving "within 1 pp" takes ~200 paired items with almost
      no changed answers: an FP8 switch typically lands here)."""
    verdict, reason = _quality_verdict(result)
    return {"verdict": verdict, "reason": reason, "text": f"{verdict}: {reason}"}


def _quality_verdict(result: dict) -> tuple[str, str]:
    groups = (result or {}).get("groups") or []
    overall = next((g for g in groups if g["key"] == "overall"), None)
    if overall is None or overall["n"] < MIN_ITEMS_FOR_A_VERDICT:
        n = overall["n"] if overall else 0
        return "cannot tell", f"{n} paired items; at least {MIN_ITEMS_FOR_A_VERDICT} are needed"
    lost = [
        g for g in groups if g["verdict"] == "loss" and (g["key"] == "overall" or ":" in g["key"])
    ]
    if lost:
        parts = [
            f"{g['key'].split(':')[-1]} {g['baseline_accuracy']:.0%} → "
            f"{g['candidate_accuracy']:.0%} (p={g['mcnemar_p']:.3f})"
            for g in lost
        ]
        return "loss", "; ".join(parts)
    correct = overall.get("baseline_correct")
    if correct is None:
        correct = round(overall["baseline_accuracy"] * overall["n"])
    if floor := baseline_floor(correct, overall["n"]):
        return "cannot tell", floor
    if overall["verdict"] == "no loss":
        return "no loss", overall["reason"]
    upper = overall["loss_ci"][1]
    return "no significant loss", (
        f"no group lost significantly ({overall['n']} items, {overall['only_baseline']} "
        f"right only before, {overall['only_candidate']} only after); a loss up to "
        f"{upper * 100:.1f} pp cannot be ruled out"
    )
