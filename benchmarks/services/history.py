"""The shared history of runs: the filtered list, its sorts and pages. Comparing runs is
``compare``, exporting one ``export``."""

from __future__ import annotations

from datetime import datetime, time

from django.db.models import F, Q, QuerySet
from django.utils import timezone

from benchmarks.metrics import HIGHER, HISTORY
from benchmarks.models import GPU_SEPARATOR, BenchmarkRun

# What the list reads of each run: headline columns and the names of what it points at,
# never the JSON parts (summary, stages, server, distributions, environment), which are
# kilobytes a run and would make a page of 100 runs megabytes.
LIST_FIELDS = (
    "id",
    "label",
    "status",
    "source",
    "created_at",
    "started_at",
    "engine",
    "engine_version",
    "model_name",
    "gpu_model",
    "gpu_count",
    "currency",
    "completed",
    "failed",
    "goodput_rps",
    "client_health",  # benchmarks.evidence judges it per row
    *(metric.key for metric in HISTORY),
    "deployment__name",
    "deployment__host__name",
    "engine_config__version",
    "load_profile__name",
    "load_profile__version",
    "requested_by__username",
)
# Sort key in the URL → (column, label). "-key" sorts descending; runs without the number
# sort last either way.
SORTS = {
    "date": ("created_at", "Date"),
    **{metric.key: (metric.key, metric.short) for metric in HISTORY},
}
# The sorts that read best descending first (newest, most): the others ascending (least).
DESCENDING_FIRST = {"date"} | {metric.key for metric in HISTORY if metric.better == HIGHER}
DEFAULT_SORT = "-date"
PAGE_SIZES = (25, 50, 100)
# History filter → the run's field it matches exactly.
EXACT_FILTERS = {
    "host": "deployment__host",
    "engine": "engine",
    "model": "model_name",
    "config": "engine_config__version",
    "profile": "load_profile__name",
    "status": "status",
    "requested_by": "requested_by",
    "source": "source",
}


def filtered_runs(criteria: dict) -> QuerySet:
    """Runs matching the history form's cleaned data, in its sort order."""
    runs = BenchmarkRun.objects.select_related(
        "deployment__host", "engine_config", "load_profile", "requested_by"
    ).only(*LIST_FIELDS)
    for key, lookup in EXACT_FILTERS.items():
        value = criteria.get(key)
        if value not in (None, ""):
            runs = runs.filter(**{lookup: value})
    if criteria.get("gpu"):
        runs = runs.filter(used_gpu(criteria["gpu"]))
    if criteria.get("q"):
        runs = runs.filter(label__icontains=criteria["q"])
    tz = timezone.get_current_timezone()
    if criteria.get("date_from"):
        runs = runs.filter(created_at__gte=datetime.combine(criteria["date_from"], time.min, tz))
    if criteria.get("date_to"):
        runs = runs.filter(created_at__lte=datetime.combine(criteria["date_to"], time.max, tz))
    return runs.order_by(*ordering(criteria.get("sort") or DEFAULT_SORT))


def used_gpu(name: str) -> Q:
    """Runs that used a GPU named ``name``. A host with mixed GPUs records their names joined
    (``gpu_model`` is "A, B"), so the name matches one whole item of that list: the whole
    value, its first, its last or a middle item, never the start of a longer name ("NVIDIA
    A100" does not find "NVIDIA A100-SXM4-80GB"). Case-insensitive, as the box is free text
    (and SQLite's LIKE is anyway)."""
    sep = GPU_SEPARATOR
    return (
        Q(gpu_model__iexact=name)
        | Q(gpu_model__istartswith=name + sep)
        | Q(gpu_model__iendswith=sep + name)
        | Q(gpu_model__icontains=sep + name + sep)
    )


def ordering(sort: str) -> list:
    key = sort.removeprefix("-")
    column = SORTS[key][0]
    descending = sort.startswith("-")
    if key == "date":  # never null: a plain order the created_at index serves
        return ["-created_at", "-pk"] if descending else ["created_at", "pk"]
    first = F(column).desc(nulls_last=True) if descending else F(column).asc(nulls_last=True)
    return [first, "-pk" if descending else "pk"]


def sort_links(current: str, query) -> dict[str, dict]:
    """For each sortable column: the URL that sorts by it (flipping the direction when it
    is the current sort) and the arrow to show."""
    base = query.copy()
    for name in ("sort", "page"):
        base.pop(name, None)
    links = {}
    for key in SORTS:
        active = current.removeprefix("-") == key
        descending = current.startswith("-")
        first = "-" if key in DESCENDING_FIRST else ""
        if active:
            target = key if descending else f"-{key}"
        else:
            target = f"{first}{key}"
        base["sort"] = target
        links[key] = {
            "url": "?" + base.urlencode(),
            "arrow": ("▼" if descending else "▲") if active else "",
        }
    return links


def columns(links: dict[str, dict]) -> list[dict]:
    """The history table's number columns, left to right: each metric with its sort link
    (``links`` from ``sort_links``)."""
    return [{"metric": metric, **links[metric.key]} for metric in HISTORY]
