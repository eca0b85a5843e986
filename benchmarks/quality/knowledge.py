"""What a simulated model "knows" of probe items: the simulator's ``--knowledge`` lines (the
text it will be asked, the reference answer, a plausible wrong one). Generated here, on the
probe side, and handed to the simulator as data, so the simulator never imports this package
and recognises a question by its content (DESIGN: the simulator must not know its instrument).
"""

from __future__ import annotations

from benchmarks.quality.items import ProbeItem, prompt_text


def knowledge_lines(items: list[ProbeItem]) -> list[dict]:
    """One line per item that has a reference answer (``agreement`` items have none)."""
    return [
        {
            "text": prompt_text(item),
            "category": item.category,
            "language": item.language,
            "answer": item.reference,
            "wrong": item.wrong,
            "json": item.answer.scorer == "json",
        }
        for item in items
        if item.reference is not None
    ]
