"""Comparing 2-4 runs side by side, oldest first, against a reference run the user picks
(the oldest unless told: "before" is the reference of a before/after): the key numbers with
their deltas and verdicts, what makes the comparison unfair, and what differs in their
configs. The charts are ``figures``."""

from __future__ import annotations

import json

from benchmarks.metrics import COMPARED, CURRENCY, LOWER, Metric
from benchmarks.models import BenchmarkRun
from benchmarks.services.environment import secret
from benchmarks.services.figures import compare_figures
from controlpanel.choices import OperationStatus

# Changes smaller than this share of the baseline are shown as "same": run-to-run noise.
SAME_WITHIN = 0.01
COMPARE_SELECT = ("deployment__host", "engine_config", "load_profile", "requested_by")
# Facts that differ between the runs, as the warnings name them.
FACT_WORDS = (
    ("gpu_model", "GPU models"),
    ("gpu_count", "GPU counts"),
    ("engine", "engines"),
    ("model_name", "models"),
)


class CompareRefused(ValueError):
    """A comparison that cannot be made; the message says why."""


def runs_to_compare(ids: list[str]) -> list[BenchmarkRun]:
    """2-4 runs, oldest first, whatever order they were ticked in (the history lists the
    newest first)."""
    wanted = []
    for value in ids:
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            if not part.isdigit():
                raise CompareRefused(f"{part!r} is not a run number.")
            if int(part) not in wanted:
                wanted.append(int(part))
    if not 2 <= len(wanted) <= 4:
        raise CompareRefused(
            f"Pick 2 to 4 runs to compare ({len(wanted)} given): tick them in the history."
        )
    found = {
        r.pk: r for r in BenchmarkRun.objects.select_related(*COMPARE_SELECT).filter(pk__in=wanted)
    }
    missing = [str(pk) for pk in wanted if pk not in found]
    if missing:
        raise CompareRefused(f"No run #{', #'.join(missing)}.")
    return sorted(found.values(), key=lambda r: (r.created_at, r.pk))


def reference_index(runs: list[BenchmarkRun], ref: str | None) -> int:
    """Where the reference run sits among ``runs``: the one ``ref`` names, else the oldest."""
    if ref in (None, ""):
        return 0
    ref = str(ref).strip()
    for index, run in enumerate(runs):
        if ref.isdigit() and run.pk == int(ref):
            return index
    raise CompareRefused(f"The reference #{ref} is not one of the compared runs.")


def compare(runs: list[BenchmarkRun], ref: int = 0) -> dict:
    """Everything the compare page shows, deltas against ``runs[ref]``."""
    return {
        "runs": runs,
        "reference": runs[ref],
        "ref_index": ref,
        "names": [r.numbered_name for r in runs],
        "rows": metric_rows(runs, ref),
        "warnings": warnings(runs),
        "diff": config_diff(runs, ref),
        "figures": compare_figures(runs),
    }


# --- the key numbers --------------------------------------------------------------------------
def delta(value, base, metric: Metric, better: str | None) -> dict:
    """The change from the baseline, its words, and whether it is better or worse
    (``better`` overrides the metric's: None gives no verdict)."""
    if value is None or base is None:
        return {"text": "", "verdict": ""}
    change = value - base
    relative = change / abs(base) if base else None
    if metric.percent:
        text = f"{change * 100:+.1f} pp"  # a share's change reads in points, not per cent
    else:
        text = f"{change:+,.{metric.digits}f}"
        if relative is not None:
            text += f" ({relative * 100:+.1f} %)"
    if better is None:
        verdict = ""
    elif change == 0 or (relative is not None and abs(relative) < SAME_WITHIN):
        verdict = "same"
    elif (change < 0) == (better == LOWER):
        verdict = "better"
    else:
        verdict = "worse"
    return {"text": text, "verdict": verdict}


def metric_rows(runs: list[BenchmarkRun], ref: int = 0) -> list[dict]:
    """One row per compared metric that any run has: each run's value, and for the others
    their delta from the reference ``runs[ref]`` and its verdict."""
    currencies = {r.currency for r in runs if r.cost_per_million_output is not None}
    rows = []
    for metric in COMPARED:
        values = [getattr(r, metric.key) for r in runs]
        if all(v is None for v in values):
            continue
        unit, better = metric.unit, metric.better
        if unit == CURRENCY:
            unit = ", ".join(sorted(c for c in currencies if c)) or ""
            if len(currencies) > 1:
                better = None  # no verdict across currencies
        cells = []
        for number, value in enumerate(values):
            cell = {"text": metric.text(value), "value": value, "delta": "", "verdict": ""}
            if number != ref:
                change = delta(value, values[ref], metric, better)
                cell.update(delta=change["text"], verdict=change["verdict"])
            cells.append(cell)
        rows.append({"key": metric.key, "label": metric.label, "unit": unit, "cells": cells})
    return rows


# --- what makes it unfair ---------------------------------------------------------------------
def warnings(runs: list[BenchmarkRun]) -> list[str]:
    """What makes the comparison unfair or partial."""
    out = _profile_warnings(runs)
    for attribute, words in FACT_WORDS:
        values = {getattr(r, attribute) for r in runs if getattr(r, attribute) not in ("", None)}
        if len(values) > 1:
            out.append(f"Different {words}: {', '.join(str(v) for v in sorted(values, key=str))}.")
    currencies = {r.currency for r in runs if r.currency}
    if len(currencies) > 1:
        out.append(f"Costs are in different currencies ({', '.join(sorted(currencies))}).")
    for run in runs:
        if run.status != OperationStatus.SUCCEEDED:
            out.append(
                f"{run.numbered_name} {run.get_status_display().lower()}: its numbers are partial."
            )
    return out


def _profile_warnings(runs: list[BenchmarkRun]) -> list[str]:
    """Runs under different loads: other profiles, other versions, or none recorded."""
    out = []
    profiles = {(r.load_profile.name, r.load_profile.version) for r in runs if r.load_profile}
    names = {name for name, _ in profiles}
    without = [r.numbered_name for r in runs if r.load_profile is None]
    if len(names) > 1:
        out.append(
            "The runs used different load profiles ("
            + ", ".join(f"{n} v{v}" for n, v in sorted(profiles))
            + "): their numbers measure different loads."
        )
    elif len(profiles) > 1:
        versions = ", ".join(f"v{v}" for _, v in sorted(profiles))
        out.append(
            f"The runs used different versions of the load profile {next(iter(names))!r} "
            f"({versions}): check what changed between them before reading the deltas."
        )
    if without and (profiles or len(without) > 1):
        out.append(
            f"{', '.join(without)} recorded no load profile (imported): "
            "the load may not be the same."
        )
    return out


# --- what differs in their setup --------------------------------------------------------------
def _shown(key: str, value) -> str:
    if value is None:
        return "—"
    if secret(key) and value not in ("", "***"):
        return "•••"  # compared, never shown
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _settings(run: BenchmarkRun) -> dict | None:
    """The run's engine settings flattened (``env.X``, ``placement.X``): from its config
    version, else as an imported file recorded them; None when unknown."""
    if run.engine_config is not None:
        return run.engine_config.flat()
    recorded = (run.environment or {}).get("config")
    if isinstance(recorded, dict):
        flat = dict(recorded.get("settings") or {})
        flat.update({f"env.{k}": v for k, v in (recorded.get("env") or {}).items()})
        flat.update(
            {
                f"placement.{k}": v
                for k, v in (recorded.get("placement") or {}).items()
                if v is not None
            }
        )
        return flat
    return None


def _facts(runs: list[BenchmarkRun]) -> list[tuple[str, list]]:
    return [
        ("Deployment", [str(r.deployment) for r in runs]),
        ("Engine", [f"{r.engine} {r.engine_version}".strip() or None for r in runs]),
        ("Model", [r.model_name or None for r in runs]),
        ("GPUs", [f"{r.gpu_count or '?'} × {r.gpu_model}" if r.gpu_model else None for r in runs]),
        ("Load profile", [str(r.load_profile) if r.load_profile else None for r in runs]),
        (
            "Config version",
            [f"v{r.engine_config.version}" if r.engine_config else None for r in runs],
        ),
    ]


def _diff_row(label: str, raw: list, key: str = "", ref: int = 0) -> dict:
    texts = [_shown(key, v) for v in raw]
    # Compare the values, not their display (two different secrets both show •••).
    marks = [json.dumps(v, sort_keys=True, default=str) for v in raw]
    return {
        "label": label,
        "cells": [
            {"text": t, "changed": n != ref and m != marks[ref]}
            for n, (t, m) in enumerate(zip(texts, marks, strict=True))
        ],
        "changed": len(set(marks)) > 1,
    }


def config_diff(runs: list[BenchmarkRun], ref: int = 0) -> dict:
    """What was set up differently: the facts every run has (deployment, engine, GPUs,
    model, profile, config version) and every engine setting whose value is not the same in
    all runs. Cells that differ from the reference ``runs[ref]`` are marked ``changed``."""
    settings = [_settings(r) for r in runs]
    keys = sorted({k for s in settings if s for k in s})
    differing = [
        k
        for k in keys
        if len({json.dumps((s or {}).get(k), sort_keys=True, default=str) for s in settings}) > 1
    ]
    fact_rows = [_diff_row(label, values, ref=ref) for label, values in _facts(runs)]
    setting_rows = [_diff_row(k, [(s or {}).get(k) for s in settings], k, ref) for k in differing]
    changed = sum(1 for r in fact_rows if r["changed"] and r["label"] != "Config version")
    return {
        "facts": fact_rows,
        "settings": setting_rows,
        "same_settings": len(keys) - len(differing),
        "unknown": [r.numbered_name for r, s in zip(runs, settings, strict=True) if s is None],
        # Config version always moves with the settings; count the settings themselves.
        "changes": changed + len(setting_rows),
    }


def faster_than(run: BenchmarkRun, older: list[BenchmarkRun]) -> BenchmarkRun | None:
    """The newest of ``older`` (newest first) that measured the same load (profile version)
    on another config, if ``run`` beat it: TTFT p95 lower or output tok/s higher by more than
    SAME_WITHIN. The advisor then asks what the speed cost in errors."""
    for old in older:
        if (
            old.load_profile_id == run.load_profile_id
            and old.engine_config_id != run.engine_config_id
        ):
            return old if _beats(run, old) else None
    return None


def _beats(run: BenchmarkRun, old: BenchmarkRun) -> bool:
    ttft, old_ttft = run.ttft_p95_ms, old.ttft_p95_ms
    rate, old_rate = run.output_tokens_per_s, old.output_tokens_per_s
    quicker = bool(ttft and old_ttft and ttft < old_ttft * (1 - SAME_WITHIN))
    return quicker or bool(rate and old_rate and rate > old_rate * (1 + SAME_WITHIN))
