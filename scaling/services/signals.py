"""The engine signal poller: scrape every serving engine's /metrics, compute its live signals
and store them as one ``EngineSample`` per deployment (the beat task ``poll-engine-signals``,
every ``SCALING_SIGNAL_INTERVAL`` seconds).

The database is the source of truth: beat may hand consecutive polls to different worker
processes, so each poll reads the last five minutes of samples of every deployment it
computes (in one query). Their snapshots, the heavy part, are kept in a per-process cache
keyed by the sample's primary key, so only the rows another process wrote are read again.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import httpx
from django.conf import settings
from django.core.cache import cache
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from controlpanel.realtime import group_name, publish
from hosts.choices import DeploymentStatus, HostStatus
from hosts.engines.metrics import endpoints
from hosts.models import Deployment
from hosts.transport.tls import system_trust
from scaling.models import EngineSample
from scaling.planning import expo
from scaling.planning import signals as planning
from scaling.planning.types import Signals

log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_S = 3.0  # one slow engine must not hold the signals of the rest past the lag
MAX_PARALLEL = 16
HISTORY_S = planning.PENDING_WINDOW_S  # the longest window any signal looks back over
RETENTION_KEY = "scaling:signals:retention"
RETENTION_EVERY_S = 60

# sample pk → (deployment pk, epoch seconds, snapshot): rows this process wrote or read.
_snapshots: dict[int, tuple[int, float, dict]] = {}
# deployment pk → the kind of failure last logged for it ("" once it answers again).
_failing: dict[int, str] = {}
# Both are shared by every thread of the process (the embedded worker runs polls in threads;
# two overlapped when one ran long): read and changed only under this lock, never across a
# query. A poll works on its own copy of what it needs, so another poll trimming the cache
# meanwhile costs at most a re-read (it raised KeyError in ``del _snapshots[pk]``).
_lock = threading.Lock()


def serves_metrics(deployment: Deployment) -> bool:
    """Whether the engine serves /metrics at all (SGLang only with ``--enable-metrics``)."""
    flag = endpoints(deployment.engine).metrics_flag
    config = deployment.active_config
    return not flag or bool(config and config.settings.get(flag))


def pollable_deployments() -> list[Deployment]:
    """The running deployments on online hosts whose engines serve /metrics."""
    deployments = Deployment.objects.filter(
        status=DeploymentStatus.RUNNING, host__status=HostStatus.ONLINE
    ).select_related("host", "active_config")
    return [d for d in deployments if serves_metrics(d)]


def poll_signals() -> int:
    """Scrape, compute, store and publish the signals of every pollable deployment; the
    number of samples stored. An engine that fails is skipped (and logged once per change
    of state); the others are stored all the same."""
    deployments = pollable_deployments()
    if not deployments:
        return 0
    scraped = _scrape_all(deployments)
    # Times as the database keeps them (microseconds), so cached rows compare equal.
    answered = [
        (d, datetime.fromtimestamp(t, UTC).timestamp(), snap)
        for d, (t, snap, _) in zip(deployments, scraped, strict=True)
        if snap
    ]
    for d, (_, _, (kind, message)) in zip(deployments, scraped, strict=True):
        _note_state(d, kind, message)
    if not answered:
        _delete_old_samples()
        return 0
    history = _history([d.pk for d, _, _ in answered])
    samples = []
    for d, t, snap in answered:
        # Another worker's clock may run ahead: only what came before this scrape counts.
        before = [item for item in history.get(d.pk, []) if item[0] < t]
        computed = planning.compute([*before, (t, snap)])
        samples.append(
            EngineSample(
                deployment=d,
                time=datetime.fromtimestamp(t, UTC),
                snapshot=snap,
                signals=computed.as_dict(),
            )
        )
    EngineSample.objects.bulk_create(samples)
    with _lock:
        for sample in samples:
            if sample.pk is not None:
                _snapshots[sample.pk] = (
                    sample.deployment_id,
                    sample.time.timestamp(),
                    sample.snapshot,
                )
    for sample in samples:
        t = sample.time.timestamp()
        publish(
            group_name("host", sample.deployment.host_id),
            "deployment.signals",
            {"id": sample.deployment_id, "t": round(t * 1000), "signals": sample.signals},
        )
    _delete_old_samples()  # after the samples are out: not on the path of their lag
    return len(samples)


# --- scraping ----------------------------------------------------------------------------------
def _scrape_all(deployments: list[Deployment]) -> list[tuple[float, dict | None, tuple]]:
    """``(epoch seconds, snapshot or None, (failure kind, message))`` per deployment, in
    order; the engines are asked in parallel, each request bounded by SCRAPE_TIMEOUT_S."""
    requests = []
    for d in deployments:
        key = d.api_key()
        requests.append((d.metrics_url, {"Authorization": f"Bearer {key}"} if key else {}))
    with httpx.Client(timeout=SCRAPE_TIMEOUT_S, verify=system_trust()) as client:
        if len(requests) == 1:
            return [_scrape(client, *requests[0])]
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(requests))) as pool:
            return list(pool.map(lambda r: _scrape(client, *r), requests))


def _scrape(client: httpx.Client, url: str, headers: dict) -> tuple[float, dict | None, tuple]:
    try:
        response = client.get(url, headers=headers)
        response.raise_for_status()
        snap = expo.parse_snapshot(response.text)
    except httpx.HTTPStatusError as exc:
        return time.time(), None, (f"HTTP {exc.response.status_code}", f"{url}: {exc}")
    except Exception as exc:  # noqa: BLE001 - whatever one engine does, the others are polled
        return time.time(), None, (type(exc).__name__, f"{url}: {type(exc).__name__}: {exc}")
    if snap["engine"] is None:
        return time.time(), None, ("no engine metrics", f"no vllm: or sglang: metrics at {url}")
    return time.time(), snap, ("", "")


def _note_state(deployment: Deployment, kind: str, message: str) -> None:
    """Log a deployment's scrape failing, or answering again, once per change of state: an
    engine that is down stays down for many polls a second apart."""
    with _lock:
        before = _failing.get(deployment.pk, "")
        if kind == before:
            return
        _failing[deployment.pk] = kind
    if kind:
        log.warning("signals of %s: %s", deployment.name, message[:300])
    else:
        log.info("signals of %s: the engine's /metrics answers again", deployment.name)


# --- samples -----------------------------------------------------------------------------------
def _history(deployment_ids: list[int]) -> dict[int, list[tuple[float, dict]]]:
    """Each deployment's stored snapshots of the last HISTORY_S, oldest first: which rows
    those are comes from the database; their snapshots from this process's cache, reading
    only those it has not seen (in one more query)."""
    since = timezone.now() - timedelta(seconds=HISTORY_S)
    window = EngineSample.objects.filter(deployment_id__in=deployment_ids, time__gte=since)
    rows = [
        (pk, dep, t.timestamp())
        for pk, dep, t in window.order_by().values_list("pk", "deployment_id", "time")
    ]
    # A cached entry counts only for the very row it was read from: SQLite hands a deleted
    # row's id to the next one once the table has emptied.
    with _lock:
        known = {
            pk: entry
            for pk, dep, t in rows
            if (entry := _snapshots.get(pk)) is not None and entry[:2] == (dep, t)
        }
    unseen = [t for pk, _, t in rows if pk not in known]
    fresh: dict[int, tuple[int, float, dict]] = {}
    if unseen:
        # From the oldest unseen row on: no long IN list, and usually just the newest rows.
        rows_since = window.filter(time__gte=datetime.fromtimestamp(min(unseen), UTC)).order_by()
        for pk, dep, t, snap in rows_since.values_list("pk", "deployment_id", "time", "snapshot"):
            fresh[pk] = (dep, t.timestamp(), snap)
    in_window = {pk for pk, _, _ in rows}
    polled, oldest = set(deployment_ids), since.timestamp()
    with _lock:
        _snapshots.update(fresh)
        # Out of this poll's window: older than any poll looks back, or gone from the
        # database. Other deployments' rows are another poll's business (unless too old).
        stale = [
            pk
            for pk, (dep, t, _) in _snapshots.items()
            if t < oldest or (dep in polled and pk not in in_window)
        ]
        for pk in stale:
            _snapshots.pop(pk, None)
    found = {**known, **fresh}
    history: dict[int, list[tuple[float, dict]]] = {}
    for pk in in_window:
        if pk in found:  # a row written after this poll's first query is the next poll's
            dep, t, snap = found[pk]
            history.setdefault(dep, []).append((t, snap))
    for snaps in history.values():
        snaps.sort(key=lambda item: item[0])
    return history


def _delete_old_samples() -> None:
    """Samples older than SCALING_SAMPLE_RETENTION_MINUTES go, at most once a minute (the
    cache key is shared by every worker when the cache is Redis)."""
    if not cache.add(RETENTION_KEY, True, timeout=RETENTION_EVERY_S):
        return
    cutoff = timezone.now() - timedelta(minutes=settings.SCALING_SAMPLE_RETENTION_MINUTES)
    EngineSample.objects.filter(time__lt=cutoff).delete()


# --- reading -------------------------------------------------------------------------------------
def recent_samples(deployment: Deployment, seconds: float) -> list[EngineSample]:
    """The deployment's samples of the last ``seconds``, oldest first."""
    since = timezone.now() - timedelta(seconds=seconds)
    return list(
        EngineSample.objects.filter(deployment=deployment, time__gte=since).order_by("time")
    )


def latest_signals(
    deployment_ids, max_age_s: float | None = None
) -> dict[int, tuple[datetime, Signals]]:
    """The newest signals of each deployment that has a sample (younger than ``max_age_s``
    when given), in one query: the newest sample's pk is looked up once per deployment
    (on the deployment-time index), not once per stored sample."""
    newest = EngineSample.objects.filter(deployment_id=OuterRef("pk"))
    if max_age_s is not None:
        newest = newest.filter(time__gte=timezone.now() - timedelta(seconds=max_age_s))
    newest_pks = (
        Deployment.objects.filter(pk__in=list(deployment_ids))
        .annotate(sample=Subquery(newest.order_by("-time", "-pk").values("pk")[:1]))
        .values("sample")
    )
    rows = EngineSample.objects.filter(pk__in=newest_pks).order_by()
    return {
        dep: (t, Signals.from_dict(data))
        for dep, t, data in rows.values_list("deployment_id", "time", "signals")
    }
