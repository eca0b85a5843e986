"""How long a new replica takes to serve: measured from the deployment's own engine starts.

Every apply or restart the panel ran records when it began and when the engine answered
/health and /v1/models (outcome "ready"). A new replica of the same model on the same kind of
host takes about as long (weights loaded, CUDA graphs captured), so the scaler's warm minimum
and the what-if's start-up delay use the median of the recent ones; a deployment that was
never started by the panel falls back to a stated guess."""

from __future__ import annotations

import statistics
from collections import defaultdict

from hosts.choices import OperationOutcome
from hosts.models import Deployment, EngineOperation

RECENT = 10  # the starts the median is taken over
# The newest ready starts read at once for a whole fleet (a bound on one query's rows).
MAX_STARTS = 2000
# Used when a deployment has no measured start: a mid-size model's load and CUDA-graph
# capture on a local NVMe disk. Said as a guess wherever it is used.
GUESS_SECONDS = 120.0


def engine_start_seconds(deployment: Deployment) -> tuple[float, str]:
    """``(seconds, basis)``: the median of the last ready starts of ``deployment``'s engine
    (or of the other deployments of its model on its engine when it has none), else a stated
    guess."""
    return engine_starts([deployment])[deployment.pk]


def engine_starts(deployments: list[Deployment]) -> dict[int, tuple[float, str]]:
    """``engine_start_seconds`` for every deployment at once, in one query."""
    own: dict[int, list[float]] = defaultdict(list)
    by_model: dict[tuple[str, str], list[float]] = defaultdict(list)
    found = (
        EngineOperation.objects.filter(
            deployment__model__in={d.model for d in deployments},
            outcome=OperationOutcome.READY,
            started_at__isnull=False,
            finished_at__isnull=False,
        )
        .order_by("-finished_at")
        .values_list(
            "deployment_id", "deployment__model", "deployment__engine", "started_at", "finished_at"
        )[:MAX_STARTS]
    )
    for dep, model, engine, started, finished in found:
        seconds = (finished - started).total_seconds()
        if len(own[dep]) < RECENT:
            own[dep].append(seconds)
        if len(by_model[(model, engine)]) < RECENT:
            by_model[(model, engine)].append(seconds)
    out = {}
    for d in deployments:
        for scope, times in (
            ("this deployment", own.get(d.pk)),
            (f"deployments of {d.model}", by_model.get((d.model, d.engine))),
        ):
            if times:
                seconds = statistics.median(times)
                out[d.pk] = (
                    seconds,
                    f"median of the last {len(times)} engine start(s) of {scope} "
                    f"({seconds:.0f} s, from apply/restart to ready)",
                )
                break
        else:
            out[d.pk] = (
                GUESS_SECONDS,
                f"no engine start measured yet: {GUESS_SECONDS:.0f} s assumed (a mid-size "
                "model's load); apply or restart the engine once through the panel to measure it",
            )
    return out
