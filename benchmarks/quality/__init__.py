"""Quality probe: does a quantised or changed model still answer right (pure, no Django)?

    from benchmarks.quality import builtin_set, run_probe_sync, compare

    items = builtin_set("panel-core")
    base = run_probe_sync("http://gpu1:8000", "llama-8b-bf16", items)
    cand = run_probe_sync("http://gpu1:8001", "llama-8b-fp8", items)
    # "loss" | "no loss" | "no significant loss" | "cannot tell", and why:
    print(compare(base, cand, items).judged["text"])

Probe sets are JSONL (``items``), scored by ``scorers``, compared with paired statistics
(``stats``, ``compare``); ``python -m benchmarks.quality`` is the command line.
"""

from benchmarks.quality.builtin import builtin_set, builtin_sets
from benchmarks.quality.compare import Comparison, GroupComparison, ItemResult, compare
from benchmarks.quality.items import (
    CATEGORIES,
    LANGUAGES,
    AnswerKey,
    LineError,
    ProbeItem,
    ProbeSetParse,
    parse_jsonl,
    prompt_text,
    to_jsonl,
)
from benchmarks.quality.runner import run_probe, run_probe_sync
from benchmarks.quality.scorers import ItemScore, score

__all__ = [
    "CATEGORIES",
    "LANGUAGES",
    "AnswerKey",
    "Comparison",
    "GroupComparison",
    "ItemResult",
    "ItemScore",
    "LineError",
    "ProbeItem",
    "ProbeSetParse",
    "builtin_set",
    "builtin_sets",
    "compare",
    "parse_jsonl",
    "prompt_text",
    "run_probe",
    "run_probe_sync",
    "score",
    "to_jsonl",
]
