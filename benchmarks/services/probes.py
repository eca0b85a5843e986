"""Quality probes, the panel side: probe sets (the built-in ones kept in step with the
package's files, uploads validated line by line), probe runs (started under the deployment's
hold like a benchmark, executed on a worker with live progress) and comparisons of two runs of
the same set (``benchmarks.quality.compare``: Wilson intervals, McNemar, a paired difference
interval and a verdict that can say "cannot tell").
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter

from django.conf import settings
from django.db import IntegrityError, transaction

from benchmarks.models_quality import ProbeResult, ProbeRun, ProbeSet, ProbeSetSource
from benchmarks.quality import (
    ItemResult,
    ProbeItem,
    builtin_sets,
    compare,
    parse_jsonl,
    run_probe_sync,
    to_jsonl,
)

# The one quality verdict (its words on every page, the API and the CLI), re-exported for the
# change's stages and pages.
from benchmarks.quality.compare import MIN_ITEMS_FOR_A_VERDICT, quality_verdict  # noqa: F401
from benchmarks.quality.knowledge import knowledge_lines
from controlpanel import lostwork, timelimits
from controlpanel.choices import OperationStatus
from controlpanel.jobs import enqueue_on_commit
from controlpanel.realtime import group_name, publish
from controlpanel.services import audit
from hosts.models import Deployment
from hosts.services import occupancy

PROBE_TASK = "benchmarks.tasks.run_probe"
ACTIVE = (OperationStatus.QUEUED, OperationStatus.RUNNING)
# What a probe run may take per item at worst (a long-context answer on a busy engine), on
# top of a fixed allowance for readiness: the task's time limit.
SECONDS_PER_ITEM = 30
MAX_UPLOAD_BYTES = 20 * 2**20
# Before a deployment's first probe: a wave of questions (short answers, one long-context
# read) takes about this long on an 8B model.
GUESS_SECONDS_PER_WAVE = 2.0


class ProbeRefused(Exception):
    """A probe that cannot start or a set that cannot be stored; the message says why."""


class ProbeSetInvalid(ValueError):
    """An upload with bad lines: ``errors`` is [(line number, message)]."""

    def __init__(self, errors: list[tuple[int, str]]):
        shown = "; ".join(f"line {n}: {m}" for n, m in errors[:5])
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        super().__init__(f"{len(errors)} bad line(s): {shown}{more}")
        self.errors = errors


# --- probe sets --------------------------------------------------------------------------------
def _stored(items: list[ProbeItem]) -> tuple[list[dict], dict, str]:
    text = to_jsonl(items)
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    coverage = Counter(f"{i.category}/{i.language}" for i in items)
    return rows, dict(sorted(coverage.items())), hashlib.sha256(text.encode()).hexdigest()


def sync_builtin_sets() -> list[ProbeSet]:
    """Make sure every built-in set's current content is the newest version of its name (a
    new version when the package's file changed), so runs always name what they asked."""
    out = []
    for name, items in builtin_sets().items():
        rows, coverage, digest = _stored(items)
        newest = ProbeSet.objects.filter(name=name).order_by("-version").first()
        if newest is not None and newest.sha256 == digest:
            out.append(newest)
            continue
        out.append(
            ProbeSet.objects.create_next(
                name,
                rows,
                source=ProbeSetSource.BUILTIN,
                description="Built into the panel (benchmarks/quality/sets).",
                item_count=len(rows),
                coverage=coverage,
                sha256=digest,
            )
        )
    return out


def upload_set(actor, name: str, data: bytes, description: str = "") -> ProbeSet:
    """Store an uploaded JSONL set as the next version of ``name``; ``ProbeSetInvalid``
    lists every bad line, and nothing is stored then."""
    name = name.strip()
    if not name:
        raise ProbeRefused("Give the set a name.")
    if len(data) > MAX_UPLOAD_BYTES:
        raise ProbeRefused(f"The file is over {MAX_UPLOAD_BYTES // 2**20} MiB.")
    parsed = parse_jsonl(data)
    if parsed.errors:
        raise ProbeSetInvalid([(e.line, e.message) for e in parsed.errors])
    if not parsed.items:
        raise ProbeRefused("The file has no items.")
    rows, coverage, digest = _stored(parsed.items)
    with transaction.atomic():
        probe_set = ProbeSet.objects.create_next(
            name,
            rows,
            source=ProbeSetSource.UPLOADED,
            description=description,
            item_count=len(rows),
            coverage=coverage,
            sha256=digest,
            created_by=actor,
        )
        audit(actor, "probe_set.upload", probe_set, after={"items": len(rows)})
    return probe_set


def default_set() -> ProbeSet | None:
    """The set a change touching the model's answers is probed with: the newest version of
    QUALITY_PROBE_SET (the built-in ones are brought up to date first)."""
    sync_builtin_sets()
    name = settings.QUALITY_PROBE_SET
    return ProbeSet.objects.filter(name=name).order_by("-version").first()


def estimate_seconds(probe_set: ProbeSet, deployment: Deployment, concurrency: int):
    """About how long one probe of ``probe_set`` takes on ``deployment``: ``(seconds, basis)``,
    from its last successful probe of that set when there is one, else a guess of
    GUESS_SECONDS_PER_WAVE per wave of ``concurrency`` items (said so)."""
    last = (
        ProbeRun.objects.filter(
            deployment=deployment,
            probe_set__name=probe_set.name,
            status=OperationStatus.SUCCEEDED,
            duration_s__isnull=False,
        )
        .order_by("-finished_at")
        .first()
    )
    if last is not None:
        per_item = last.duration_s / max(1, last.total) * (last.concurrency / max(1, concurrency))
        return per_item * probe_set.item_count, f"from probe #{last.pk} of this deployment"
    waves = -(-probe_set.item_count // max(1, concurrency))
    return float(waves) * GUESS_SECONDS_PER_WAVE, "a guess: this deployment was never probed"


def write_knowledge(path) -> int:
    """Write the built-in sets' knowledge file for simulated engines
    (``benchmarks.quality.knowledge``); how many items."""
    seen: dict[str, dict] = {}
    for items in builtin_sets().values():
        for line in knowledge_lines(items):
            seen[line["text"]] = line  # panel-core holds the others' items too: once each
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in seen.values()))
    return len(seen)


def items_of(probe_set: ProbeSet) -> list[ProbeItem]:
    parsed = parse_jsonl("\n".join(json.dumps(row) for row in probe_set.items))
    if parsed.errors:  # a stored set the current rules refuse: say so, run nothing
        raise ProbeRefused(f"{probe_set} no longer parses: {parsed.errors[0].message}")
    return parsed.items


# --- starting a run ----------------------------------------------------------------------------
def time_limit_for(probe_set: ProbeSet, concurrency: int) -> int:
    waves = -(-max(1, probe_set.item_count) // max(1, concurrency))
    return int(settings.BENCHMARK_READY_TIMEOUT + 60 + waves * SECONDS_PER_ITEM)


def start_probe(
    actor,
    deployment: Deployment,
    probe_set: ProbeSet,
    *,
    structured_output: bool = False,
    concurrency: int = 8,
    seed: int = 0,
    label: str = "",
    enqueue: bool = True,
    owner=None,
) -> ProbeRun:
    """Queue a probe of ``deployment`` with ``probe_set`` on the config it runs now, when
    nothing else uses the engine (``occupancy``, like a benchmark: a probe measures too, and
    a restart under it would fail half its items)."""
    if not 1 <= concurrency <= 256:
        raise ProbeRefused("Concurrency must be between 1 and 256.")
    try:
        with transaction.atomic():
            deployment = (
                Deployment.objects.select_for_update(of=("self",))
                .select_related("host", "active_config")
                .get(pk=deployment.pk)
            )
            try:
                occupancy.require_free(deployment, occupancy.Purpose.PROBE, owner=owner)
            except occupancy.DeploymentBusy as busy:
                raise ProbeRefused(str(busy)) from None
            run = ProbeRun.objects.create(
                deployment=deployment,
                engine_config=deployment.active_config,
                probe_set=probe_set,
                label=label,
                requested_by=actor,
                model_name=deployment.model,
                engine=deployment.engine,
                engine_version=deployment.engine_version,
                simulated=deployment.runner == "simulator",
                structured_output=structured_output,
                concurrency=concurrency,
                seed=seed,
                total=probe_set.item_count,
            )
            audit(
                actor,
                "probe.start",
                run,
                after={"deployment": str(deployment), "set": str(probe_set)},
            )
            if enqueue:
                limit = time_limit_for(probe_set, concurrency)
                enqueue_on_commit(
                    PROBE_TASK, run.pk, **timelimits.TimeLimit.of(limit, 60).options()
                )
    except IntegrityError:
        raise ProbeRefused(f"Another probe just started on {deployment}.") from None
    publish_probe(run)
    return run


def occupants(deployment: Deployment) -> list[occupancy.Occupant]:
    """The ``occupancy`` holder of probe runs: one queued or running holds the engine."""
    run = deployment.probe_runs.filter(status__in=ACTIVE).select_related("requested_by").first()
    if run is None:
        return []
    who = run.requested_by or "the system"
    text = (
        f"Quality probe #{run.pk} ({run.probe_set}) by {who} is "
        f"{run.get_status_display().lower()}: nothing changes an engine while it is probed."
    )
    return [occupancy.Occupant(run, text)]


def cancel_probe(actor, run: ProbeRun) -> ProbeRun:
    with transaction.atomic():
        run = ProbeRun.objects.select_for_update().get(pk=run.pk)
        if run.is_finished:
            raise ProbeRefused(f"Probe #{run.pk} has finished: nothing to cancel.")
        if run.status == OperationStatus.QUEUED:
            run.transition_to(OperationStatus.CANCELLED, error="cancelled before it started")
        elif (lost := lostwork.lost_claim(run)) is not None:
            # No worker will read the request: ended here, which frees its deployment.
            run.append_log("cancelled: " + lostwork.lost_text(lost))
            run.transition_to(OperationStatus.CANCELLED, error="cancelled; its worker was lost")
            lostwork.release(run)
        else:
            run.cancel_requested = True
            run.save(update_fields=["cancel_requested"])
        audit(actor, "probe.cancel", run)
    publish_probe(run)
    return run


# --- on the worker -----------------------------------------------------------------------------
class _Progress:
    """Counts answers as they come (on the probe's event loop) and, on its own thread, moves
    the run's progress and streams it, and watches for a cancel request."""

    def __init__(self, run: ProbeRun):
        self.run, self.count, self.cancelled = run, 0, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, daemon=True, name=f"probe-{run.pk}")

    def on_result(self, _result) -> None:
        self.count += 1

    def should_stop(self) -> bool:
        return self.cancelled

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)

    def _work(self):
        from django.db import close_old_connections

        try:
            while not self._stop.wait(1.0):
                ProbeRun.objects.filter(pk=self.run.pk).update(done=self.count)
                self.run.done = self.count
                publish_probe(self.run)
                if ProbeRun.objects.filter(pk=self.run.pk, cancel_requested=True).exists():
                    self.cancelled = True
        finally:
            close_old_connections()


def execute_probe(run: ProbeRun) -> ProbeRun:
    """The worker's part: ask every item, score, store each answer, summarise."""
    if run.is_finished:
        return run
    if run.status == OperationStatus.RUNNING:
        return fail_probe(run, "the worker stopped during the probe; its answers were lost")
    run.transition_to(OperationStatus.RUNNING)
    publish_probe(run)
    try:
        items = items_of(run.probe_set)
    except ProbeRefused as exc:
        return fail_probe(run, str(exc))
    deployment = run.deployment
    started = time.monotonic()
    with _Progress(run) as progress:
        results = run_probe_sync(
            deployment.engine_url,
            deployment.model,
            items,
            api_key=deployment.api_key(),
            concurrency=run.concurrency,
            seed=run.seed,
            structured_output=run.structured_output,
            on_result=progress.on_result,
            should_stop=progress.should_stop,
        )
    return _record(run, items, results, time.monotonic() - started, progress.cancelled)


def _record(run: ProbeRun, items, results: list[ItemResult], seconds: float, cancelled: bool):
    by_id = {item.id: item for item in items}
    ProbeResult.objects.bulk_create(
        [
            ProbeResult(
                run=run,
                item_id=r.id,
                category=by_id[r.id].category,
                language=by_id[r.id].language,
                answer=r.answer or "",
                correct=r.correct,
                json_valid=r.json_valid,
                schema_ok=r.schema_ok,
                prompt_tokens=r.prompt_tokens,
                completion_tokens=r.completion_tokens,
                latency_ms=r.latency_ms,
                error=(r.error or "")[:500],
            )
            for r in results
            if r.id in by_id
        ],
        batch_size=500,
    )
    run.summary = summarize(items, results)
    run.done, run.duration_s = len(results), seconds
    run.save(update_fields=["summary", "done", "duration_s"])
    errors = sum(1 for r in results if r.error)
    run.append_log(f"{len(results)} answered in {seconds:.1f} s, {errors} request error(s)")
    if cancelled:
        run.transition_to(OperationStatus.CANCELLED, error="cancelled while running")
    elif results and errors > len(results) // 2:
        # Most questions got no answer: the engine's trouble, not the model's quality.
        first = next(r.error for r in results if r.error)
        run.transition_to(OperationStatus.FAILED, error=f"{errors} requests failed: {first}")
    else:
        run.transition_to(OperationStatus.SUCCEEDED)
    publish_probe(run)
    return run


def summarize(items, results: list[ItemResult]) -> dict:
    """Accuracy overall, by category, by language and by both; JSON validity for JSON
    items. Items scored by agreement have no key of their own: they count only in
    comparisons."""
    by_id = {item.id: item for item in items}
    groups: dict[str, list[int]] = {}
    json_seen = [0, 0, 0]  # items, valid, schema ok
    for r in results:
        item = by_id.get(r.id)
        if item is None:
            continue
        if r.json_valid is not None:
            json_seen[0] += 1
            json_seen[1] += bool(r.json_valid)
            json_seen[2] += bool(r.schema_ok)
        if r.correct is None:
            continue
        for key in ("overall", item.category, item.language, f"{item.category}/{item.language}"):
            tally = groups.setdefault(key, [0, 0])
            tally[0] += 1
            tally[1] += bool(r.correct)
    out = {
        k: {"n": n, "correct": c, "accuracy": c / n if n else None} for k, (n, c) in groups.items()
    }
    out.setdefault("overall", {"n": 0, "correct": 0, "accuracy": None})
    if json_seen[0]:
        out["json"] = {
            **out.get("json", {}),
            "items": json_seen[0],
            "valid_rate": json_seen[1] / json_seen[0],
            "schema_rate": json_seen[2] / json_seen[0],
        }
    return out


def fail_probe(run: ProbeRun, error: str) -> ProbeRun:
    run.refresh_from_db()
    if not run.is_finished:
        if run.status == OperationStatus.QUEUED:
            run.transition_to(OperationStatus.RUNNING)
        run.append_log(error)
        run.transition_to(OperationStatus.FAILED, error=error[:2000])
        publish_probe(run)
    return run


def publish_probe(run: ProbeRun) -> None:
    publish(
        group_name("probe", run.pk),
        "probe.updated",
        {
            "id": run.pk,
            "status": run.status,
            "done": run.done,
            "total": run.total,
            "accuracy": run.accuracy,
        },
    )


# --- comparing ---------------------------------------------------------------------------------
def item_results(run: ProbeRun) -> list[ItemResult]:
    return [
        ItemResult(
            id=r.item_id,
            answer=r.answer,
            correct=r.correct,
            json_valid=r.json_valid,
            schema_ok=r.schema_ok,
            prompt_tokens=r.prompt_tokens,
            completion_tokens=r.completion_tokens,
            latency_ms=r.latency_ms,
            error=r.error or None,
        )
        for r in run.results.all()
    ]


def compare_runs(baseline: ProbeRun, candidate: ProbeRun, *, max_loss: float = 0.01) -> dict:
    """The candidate against the baseline, item by item (``benchmarks.quality.compare``);
    refused unless both asked the same set version. Labelled simulated when either was.
    Its ``verdict``/``reason``/``text`` are ``quality_verdict``'s, the words every page and
    the API say (and the CLI); each group keeps its own statistical verdict for the table."""
    if baseline.probe_set_id != candidate.probe_set_id:
        raise ProbeRefused(
            f"Probe #{baseline.pk} asked {baseline.probe_set}, #{candidate.pk} asked "
            f"{candidate.probe_set}: only runs of the same set version compare."
        )
    items = items_of(candidate.probe_set)
    result = compare(item_results(baseline), item_results(candidate), items, max_loss=max_loss)
    data = result.to_dict()
    data["simulated"] = baseline.simulated or candidate.simulated
    data["baseline"], data["candidate"] = baseline.pk, candidate.pk
    return data


def comparison_table(result: dict) -> str:
    """The comparison as a fixed-width table for a timeline entry: every group (overall,
    then categories, languages and their crossings) with both accuracies, the loss and its
    interval, McNemar's p and the verdict."""
    rows = [("group", "n", "before", "after", "loss [CI]", "p", "verdict")]
    for g in result.get("groups", []):
        low, high = g["loss_ci"]
        rows.append(
            (
                g["key"],
                str(g["n"]),
                f"{g['baseline_accuracy']:.1%}",
                f"{g['candidate_accuracy']:.1%}",
                f"{g['loss'] * 100:+.1f} pp [{low * 100:+.1f}, {high * 100:+.1f}]",
                f"{g['mcnemar_p']:.3f}",
                g["verdict"],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    if result.get("simulated"):
        lines.append("(simulated engine: answers from the simulator's quality model)")
    return "\n".join(line.rstrip() for line in lines)
