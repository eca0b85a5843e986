"""How long a new replica takes to serve: measured from the deployment's own engine starts.

Every apply or restart the panel ran records when it began and when the engine answered
/health and /v1/models (outcome "ready"). A new replica of the same model on the same kind of
host takes about as long (weights loaded, CUDA graphs captured), so the scaler's warm minimum
and the what-if's start-up delay use the median of the recent ones; a deployment that was
never started by the panel falls back to a stated guess."""

from __future__ import annotations

import statistics

from hosts.choices import OperationOutcome
from hosts.models import Deployment, EngineOperation

RECENT = 10  # the starts the median is taken over
# Used when a deployment has no measured start: a mid-size model's load and CUDA-graph
# capture on a local NVMe disk. Said as a guess wherever it is used.
GUESS_SECONDS = 120.0


def engine_start_seconds(deployment: Deployment) -> tuple[float, str]:
    """``(seconds, basis)``: the median of the last ready starts of ``deployment``'s engine
    (or of the other deployments of its model when it has none), else a stated guess."""
    for scope, rows in (
        ("this deployment", EngineOperation.objects.filter(deployment=deployment)),
        (
            f"deployments of {deployment.model}",
            EngineOperation.objects.filter(
                deployment__model=deployment.model, deployment__engine=deployment.engine
            ),
        ),
    ):
        times = [
            (finished - started).total_seconds()
            for started, finished in rows.filter(
                outcome=OperationOutcome.READY,
                started_at__isnull=False,
                finished_at__isnull=False,
            )
            .order_by("-finished_at")
            .values_list("started_at", "finished_at")[:RECENT]
        ]
        if times:
            seconds = statistics.median(times)
            return seconds, (
                f"median of the last {len(times)} engine start(s) of {scope} "
                f"({seconds:.0f} s, from apply/restart to ready)"
            )
    return GUESS_SECONDS, (
        f"no engine start measured yet: {GUESS_SECONDS:.0f} s assumed (a mid-size model's "
        "load); apply or restart the engine once through the panel to measure it"
    )
