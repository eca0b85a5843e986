"""Load profile workflows: the built-in starters, new versions, traffic samples, sharing."""

from __future__ import annotations

from benchmarks.choices import ProfileSource
from benchmarks.loadgen.profile import BUILTINS, validate
from benchmarks.models import LoadProfile


def ensure_builtin_profiles() -> list[LoadProfile]:
    """Create the built-in starters that are missing (by name). Idempotent; runs after every
    migrate. A starter someone edited keeps their versions: only a missing name is created."""
    made = []
    existing = set(LoadProfile.objects.filter(name__in=BUILTINS).values_list("name", flat=True))
    for name, item in BUILTINS.items():
        if name in existing:
            continue
        made.append(
            LoadProfile.objects.create_next(
                name,
                validate(item["spec"]),
                description=item["description"],
                source=ProfileSource.BUILTIN,
                note="built-in starter",
            )
        )
    return made
