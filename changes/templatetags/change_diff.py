"""Template filters of a change's diff."""

from __future__ import annotations

from django import template

register = template.Library()

# The parts of a config the simulator's prediction does not model (hosts.simulator takes
# flags only): a diff touching them must not read as "predicted: no effect".
UNMODELLED = (("env.", "environment variables"), ("placement.", "CPU placement"))


@register.filter
def unmodelled(diff) -> list[str]:
    """What of a diff (``{key: (old, new)}``) the prediction does not model, in words."""
    keys = list(diff or {})
    return [words for prefix, words in UNMODELLED if any(k.startswith(prefix) for k in keys)]
