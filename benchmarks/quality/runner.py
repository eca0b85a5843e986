"""Run a probe set against one deployment through its OpenAI-compatible API.

Greedy decoding (temperature 0) and a fixed seed make a run repeatable on engines that honour
them, so a difference between two runs is the model's, not the sampler's. Requests are plain
(non-streaming): the probe measures answers, not latency under load. A failed request is
recorded on its item and never raised, so one bad item cannot lose a long run.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable

import httpx

from benchmarks.quality.compare import ItemResult
from benchmarks.quality.items import ProbeItem
from benchmarks.quality.scorers import score
from hosts.transport.tls import system_trust

ERROR_CHARS = 300


def request_for(
    item: ProbeItem, model: str, *, seed: int = 0, structured_output: bool = False
) -> tuple[str, dict]:
    """(path, JSON body) of the request that asks this item."""
    body: dict = {"model": model, "temperature": 0, "seed": seed, "max_tokens": item.max_tokens}
    if item.messages is not None:
        path = "/v1/chat/completions"
        body["messages"] = [dict(m) for m in item.messages]
        if structured_output and item.structured and item.answer.schema is not None:
            # The OpenAI shape, which vLLM and SGLang both accept for guided JSON.
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": item.answer.schema},
            }
    else:
        path = "/v1/completions"
        body["prompt"] = item.prompt
    return path, body


def _answer_text(path: str, data: dict) -> str:
    choice = data["choices"][0]
    if path.endswith("chat/completions"):
        return (choice.get("message") or {}).get("content") or ""
    return choice.get("text") or ""


async def _ask(
    client: httpx.AsyncClient,
    item: ProbeItem,
    model: str,
    seed: int,
    structured_output: bool,
) -> ItemResult:
    path, body = request_for(item, model, seed=seed, structured_output=structured_output)
    started = time.perf_counter()
    try:
        response = await client.post(path, json=body)
        latency_ms = (time.perf_counter() - started) * 1000
        if response.status_code >= 400:
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:ERROR_CHARS]}")
        data = response.json()
        answer = _answer_text(path, data)
    except Exception as exc:  # noqa: BLE001 - any failure is this item's result, not the run's
        message = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
        return ItemResult(
            id=item.id,
            correct=False,
            latency_ms=(time.perf_counter() - started) * 1000,
            error=message,
        )
    usage = data.get("usage") or {}
    verdict = score(item, answer)
    return ItemResult(
        id=item.id,
        answer=answer,
        correct=verdict.correct,
        json_valid=verdict.json_valid,
        schema_ok=verdict.schema_ok,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        latency_ms=latency_ms,
        detail=verdict.detail,
    )


async def run_probe(
    base_url: str,
    model: str,
    items: list[ProbeItem],
    *,
    api_key: str | None = None,
    concurrency: int = 8,
    seed: int = 0,
    structured_output: bool = False,
    timeout_s: float = 120,
    on_result: Callable[[ItemResult], object] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[ItemResult]:
    """Ask every item once; results in the items' order. ``on_result`` sees each as it lands.
    ``should_stop`` (a cancel): items not yet sent when it turns true are not asked, and
    are left out of the results."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    base = base_url.rstrip("/")
    if base.endswith("/v1"):  # people paste the OpenAI base URL; the paths add /v1 themselves
        base = base[: -len("/v1")]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limit = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(
        base_url=base,
        headers=headers,
        timeout=timeout_s,
        limits=limits,
        transport=transport,
        verify=system_trust(),
    ) as client:

        async def one(item: ProbeItem) -> ItemResult | None:
            async with limit:
                if should_stop is not None and should_stop():
                    return None
                result = await _ask(client, item, model, seed, structured_output)
            if on_result is not None:
                outcome = on_result(result)
                if inspect.isawaitable(outcome):
                    await outcome
            return result

        results = await asyncio.gather(*(one(i) for i in items))
        return [r for r in results if r is not None]


def run_probe_sync(
    base_url: str, model: str, items: list[ProbeItem], **options
) -> list[ItemResult]:
    """``run_probe`` for callers without an event loop (a Celery task, the CLI)."""
    return asyncio.run(run_probe(base_url, model, items, **options))
