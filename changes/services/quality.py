"""When a change needs a quality probe, and how it is asked: one definition for the proposal's
facts (``facts.quality_facts``), the review (``review.propose_change``) and the pipeline's
stages (``stages_quality``). Kept apart from the stages so that the facts can read it without
importing the pipeline.
"""

from __future__ import annotations

from hosts.engines import get_spec

# Questions asked at once: enough to finish a few hundred items in a minute or two on one
# engine, few enough not to measure the engine's batching instead of its answers.
PROBE_CONCURRENCY = 16
PROBE_FIELDS = {"baseline": "quality_baseline", "candidate": "quality_run"}


def needs_probe(engine: str, diff: dict) -> list[str]:
    """What in ``diff`` ({key: (running, proposed)}) can change the model's answers: flags
    marked ``affects_answers`` in the engine's spec, and the model itself."""
    spec = get_spec(engine)
    touched = [
        spec.by_dest[key].option
        for key in diff
        if key in spec.by_dest and spec.by_dest[key].affects_answers
    ]
    if "model" in diff:
        touched.append("the model")
    return touched
