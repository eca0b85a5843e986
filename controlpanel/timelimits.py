"""Every background task's time limit, in one place (pure: no Django import).

Settings read it for the broker's visibility timeout, the task modules for their decorators'
defaults, and the services for the per-call limits they send with a task (a benchmark's from
its profile, a change's pipeline from its two benchmarks and three engine operations). A task's
soft limit raises ``SoftTimeLimitExceeded`` inside it so the job runner records "ran out of
time" on the row; the hard limit, a margin later, kills a task that ignored it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimeLimit:
    """A task's soft and hard limit in seconds."""

    soft: int
    hard: int

    @classmethod
    def of(cls, soft: float, margin: int) -> TimeLimit:
        return cls(int(soft), int(soft) + margin)

    def options(self) -> dict:
        """Keyword arguments for ``@shared_task`` and ``apply_async``."""
        return {"soft_time_limit": self.soft, "time_limit": self.hard}


# Short housekeeping tasks: a host check, the fleet sweep, telemetry, notifications.
HOST_CHECK = TimeLimit(50, 60)
CHECK_ALL_HOSTS = TimeLimit(110, 120)
POLL_TELEMETRY = TimeLimit(25, 30)
# The engines' /metrics, every SCALING_SIGNAL_INTERVAL seconds (requests bounded by 3 s each).
POLL_ENGINE_SIGNALS = TimeLimit(25, 30)
# A day at one-minute steps under four policies takes seconds; a slow machine gets minutes.
WHAT_IF = TimeLimit(280, 300)
DOWNSAMPLE_TELEMETRY = TimeLimit(280, 300)
FAIL_STALE_RUNS = TimeLimit(100, 120)
NOTIFY_CHANGE = TimeLimit(50, 60)
RESUME_LOST_PIPELINES = TimeLimit(50, 60)
# The lost-work sweep: its passes are the above's (silent runs, lost pipelines) and quick
# queries; a pending restore it retries runs on its own task.
SWEEP_LOST_WORK = TimeLimit(100, 120)
# Reading an imported result file (up to 256 MiB, streamed: well under a minute).
IMPORT_RESULT = TimeLimit(570, 600)

# A change pipeline queued without a computed limit (never by the panel itself) gets this.
DEFAULT_PIPELINE = TimeLimit(4 * 3600 - 60, 4 * 3600)

# Redis may hold a message this long before a worker takes it; the visibility timeout adds it
# so a task that waited in the queue is not redelivered while it runs.
QUEUE_WAIT_MARGIN = 1800


def operation_budget(ready_timeout: float) -> int:
    """Seconds an engine apply or restart may take: it may wait for the new engine and then
    for the rolled-back one (twice the ready timeout), plus stopping and starting."""
    return int(ready_timeout * 2 + 120)


def operation(ready_timeout: float) -> TimeLimit:
    return TimeLimit.of(operation_budget(ready_timeout), 30)


def benchmark_budget(planned_seconds: float | None, cap: float) -> int:
    """Seconds a run may take: three times what its profile plans plus five minutes for
    readiness and warm-up, capped (also the budget of a profile whose length is unknown)."""
    if planned_seconds is None:
        return int(cap)
    return int(min(cap, planned_seconds * 3 + 300))


def benchmark(budget: int) -> TimeLimit:
    """The run's task: its budget plus a minute to record the results, then a hard stop."""
    return TimeLimit(budget + 60, budget + 120)


def pipeline(benchmark_budget: int, operation_budget: int, health_timeout: float) -> TimeLimit:
    """A change's apply pipeline holds up to two benchmarks (baseline, verification), three
    engine operations (the restart before the baseline, the change, a rollback) and the health
    check, with margin."""
    soft = int(2 * benchmark_budget + 3 * operation_budget + health_timeout + 300)
    return TimeLimit.of(soft, 60)


def longest_task(
    *, benchmark_max: float, ready_timeout: float, health_timeout: float, default_hard: int
) -> int:
    """The longest hard limit any task can get under these settings."""
    budget = int(benchmark_max)
    return max(
        benchmark(budget).hard,
        operation(ready_timeout).hard,
        pipeline(budget, operation_budget(ready_timeout), health_timeout).hard,
        DEFAULT_PIPELINE.hard,
        default_hard,
    )


def visibility_timeout(
    *, benchmark_max: float, ready_timeout: float, health_timeout: float, default_hard: int
) -> int:
    """With late acks, Redis hands a task still unacknowledged after this many seconds to
    another worker even while the first still runs it: that copy would find its row running
    and fail it. So it outlasts the longest task plus a wait in the queue. Erring long only
    delays Redis noticing a lost worker machine; the beat sweeps close such rows sooner."""
    longest = longest_task(
        benchmark_max=benchmark_max,
        ready_timeout=ready_timeout,
        health_timeout=health_timeout,
        default_hard=default_hard,
    )
    return longest + QUEUE_WAIT_MARGIN
