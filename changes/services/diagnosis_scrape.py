"""The advisor's live look at an engine: its /metrics scraped about once a second for a few
seconds, gauges sampled, counters and histograms as deltas (``changes.advisor.facts.EngineWindow``).
Part of the snapshot ``changes.services.diagnosis_facts`` gathers."""

from __future__ import annotations

import statistics
import time

import httpx

from benchmarks.loadgen import scrape
from changes.advisor.facts import EngineWindow
from hosts.engines.metrics import endpoints
from hosts.models import Deployment
from hosts.transport.tls import system_trust

# Each HTTP request of the scrape gives up after this long: a hung engine must not hold the
# beat task (the whole scrape is bounded by ADVISOR_SCRAPE_SECONDS + 2 of these).
SCRAPE_REQUEST_TIMEOUT_S = 3.0


def scrape_engine(deployment: Deployment, seconds: float) -> tuple[EngineWindow | None, str]:
    """Scrape the engine about once a second for ``seconds``: gauges sampled, counters and
    histograms as deltas between the first and the last scrape. ``(None, why)`` when the
    engine does not answer or serves no engine metrics."""
    flag = endpoints(deployment.engine).metrics_flag
    config = deployment.active_config
    if flag and not (config and config.settings.get(flag)):
        return None, f"{deployment.engine} serves /metrics only with --{flag.replace('_', '-')}"
    url = deployment.metrics_url
    key = deployment.api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    samples: list[dict] = []
    deadline = None
    try:
        with httpx.Client(
            timeout=SCRAPE_REQUEST_TIMEOUT_S, headers=headers, verify=system_trust()
        ) as client:
            while True:
                response = client.get(url)
                received, now = time.time(), time.monotonic()
                response.raise_for_status()
                snap = scrape.parse(response.text)
                if snap.get("engine") is None:
                    return None, f"no vllm: or sglang: metrics at {url}"
                # Stamped when the answer came, and the window counted from the first one:
                # the first request's connect and each parse must not shorten the window.
                snap["t"] = received
                samples.append(snap)
                if deadline is None:
                    deadline = now + max(seconds, 0.0)
                left = deadline - time.monotonic()
                if left <= 0 or len(samples) > seconds + 1:
                    break
                time.sleep(min(1.0, left))
    except (httpx.HTTPError, ValueError) as exc:
        return None, f"{url}: {type(exc).__name__}: {exc}"[:300]
    first, last = samples[0], samples[-1]
    return window_from(first, last, samples, source="live"), ""


def gauge(samples: list[dict], key: str) -> tuple[float | None, float | None]:
    values = [s[key] for s in samples if s.get(key) is not None]
    if not values:
        return None, None
    return statistics.fmean(values), max(values)


def window_from(first: dict, last: dict, samples: list[dict], *, source: str) -> EngineWindow:
    """An ``EngineWindow`` from two /metrics snapshots (``scrape.parse``) and the gauges
    sampled between them."""
    delta = scrape.deltas(first, last)
    running = gauge(samples, "running")
    waiting = gauge(samples, "waiting")
    kv = gauge(samples, "kv_cache_usage")
    return EngineWindow(
        seconds=max(last["t"] - first["t"], 0.0),
        ended_at=last["t"],
        source=source,
        requests=as_int(delta.get("server_e2e_count")),
        running_mean=running[0],
        running_max=running[1],
        waiting_mean=waiting[0],
        waiting_max=waiting[1],
        kv_usage_mean=kv[0],
        kv_usage_max=kv[1],
        preemptions=as_int(delta.get("preemptions")),
        prefix_cache_queries=delta.get("prefix_cache_queries"),
        prefix_cache_hits=delta.get("prefix_cache_hits"),
        hit_rate=delta.get("prefix_cache_hit_rate"),
        queue_ms=delta.get("server_mean_queue_ms"),
        prefill_ms=delta.get("server_mean_prefill_ms"),
        decode_ms=delta.get("server_mean_decode_ms"),
        ttft_ms=delta.get("server_mean_ttft_ms"),
        itl_ms=delta.get("server_mean_itl_ms"),
        prompt_tokens=delta.get("prompt_tokens"),
        generation_tokens=delta.get("generation_tokens"),
    )


def as_int(value) -> int | None:
    return None if value is None else int(value)
