"""What to run: a typed load specification (pure data, JSON-friendly)."""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from typing import Literal

DistKind = Literal["fixed", "uniform", "normal", "lognormal", "empirical"]


class SpecError(ValueError):
    """A load specification that cannot run; the message says which field and why."""


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution. ``empirical``: ``values`` = [[length, weight], ...]."""

    kind: DistKind = "fixed"
    mean: float = 512
    stddev: float = 0.0  # normal: absolute; lognormal: sigma of the underlying normal
    low: int | None = None  # uniform bounds; also clamps the others
    high: int | None = None
    values: tuple[tuple[int, float], ...] = ()

    def validate(self, name: str) -> None:
        if self.kind not in ("fixed", "uniform", "normal", "lognormal", "empirical"):
            raise SpecError(f"{name}: unknown distribution {self.kind!r}")
        if self.kind == "empirical":
            if not self.values or any(n < 1 or w < 0 for n, w in self.values):
                raise SpecError(f"{name}: empirical values must be [length >= 1, weight >= 0]")
            if sum(w for _, w in self.values) <= 0:
                raise SpecError(f"{name}: empirical weights must not all be zero")
        elif self.kind == "uniform":
            if self.low is None or self.high is None or not 1 <= self.low <= self.high:
                raise SpecError(f"{name}: uniform needs 1 <= low <= high")
        elif self.mean < 1:
            raise SpecError(f"{name}: mean must be >= 1")
        if self.stddev < 0:
            raise SpecError(f"{name}: stddev must be >= 0")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            value = self.mean
        elif self.kind == "uniform":
            value = rng.randint(self.low, self.high)
        elif self.kind == "normal":
            value = rng.gauss(self.mean, self.stddev)
        elif self.kind == "lognormal":
            # ``mean`` is the distribution's mean: mu = ln(mean) - sigma² / 2.
            sigma = self.stddev
            value = rng.lognormvariate(math.log(self.mean) - sigma * sigma / 2, sigma)
        else:
            lengths = [n for n, _ in self.values]
            weights = [w for _, w in self.values]
            value = rng.choices(lengths, weights)[0]
        value = round(value)
        if self.low is not None and self.kind != "uniform":
            value = max(value, self.low)
        if self.high is not None and self.kind != "uniform":
            value = min(value, self.high)
        return max(1, int(value))


@dataclass(frozen=True)
class Stage:
    """One load level. Closed loop (``concurrency``) unless ``request_rate`` is set; ends after
    ``num_requests`` or ``duration_s`` (whichever comes first), then waits for its requests."""

    name: str = "main"
    concurrency: int | None = 8
    request_rate: float | None = None  # requests/s; inf = all at once
    burstiness: float = 1.0  # gamma shape of the gaps: 1 = Poisson, < 1 burstier
    max_concurrency: int | None = None  # open loop: cap on requests in flight
    num_requests: int | None = 100
    duration_s: float | None = None

    def validate(self) -> None:
        where = f"stage {self.name!r}"
        if self.request_rate is None and not (self.concurrency and self.concurrency >= 1):
            raise SpecError(f"{where}: a closed-loop stage needs concurrency >= 1")
        if self.request_rate is not None and not self.request_rate > 0:
            raise SpecError(f"{where}: request_rate must be > 0")
        if self.burstiness <= 0:
            raise SpecError(f"{where}: burstiness must be > 0")
        if self.num_requests is None and self.duration_s is None:
            raise SpecError(f"{where}: give num_requests or duration_s")
        if self.num_requests is not None and self.num_requests < 1:
            raise SpecError(f"{where}: num_requests must be >= 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise SpecError(f"{where}: duration_s must be > 0")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise SpecError(f"{where}: max_concurrency must be >= 1")


@dataclass(frozen=True)
class Dataset:
    """Synthetic prompts: lengths, and shared-prefix groups for prefix-cache tests.

    A request that shares a prefix sends ``prefix_len`` shared tokens *and then* its own
    ``input_len`` tokens, as vLLM's ``--random-prefix-len`` does (the range ratio spreads the
    own part only). With ``prefix_within_input`` the input length is the whole prompt and the
    prefix's tokens are its first ones, cut to it: how a traffic sample counts a request, and
    the panel's former rule, which the profile versions saved under it keep.
    """

    input_len: LengthDist = field(default_factory=lambda: LengthDist("fixed", 512))
    output_len: LengthDist = field(default_factory=lambda: LengthDist("fixed", 128))
    prefix_len: int = 0  # tokens of a shared system prompt, on top of input_len
    prefix_groups: int = 1  # distinct shared prompts
    prefix_share: float = 1.0  # share of requests that use one (when prefix_len > 0)
    prefix_within_input: bool = False
    prompt_format: Literal["token_ids", "text"] = "token_ids"
    # A local tokenizer (a directory with tokenizer.json, or the file) makes text prompts exact.
    tokenizer: str | None = None

    def validate(self) -> None:
        self.input_len.validate("input_len")
        self.output_len.validate("output_len")
        if self.prefix_len < 0 or self.prefix_groups < 1 or not 0 <= self.prefix_share <= 1:
            raise SpecError("prefix: need prefix_len >= 0, prefix_groups >= 1, 0 <= share <= 1")
        if self.prompt_format not in ("token_ids", "text"):
            raise SpecError(f"prompt_format: unknown {self.prompt_format!r}")


@dataclass(frozen=True)
class Trace:
    """Replay a recorded load: rows of timestamp, input_tokens, output_tokens[, prefix_id]."""

    path: str
    time_scale: float = 1.0  # 0.5 = twice as fast


@dataclass(frozen=True)
class LoadSpec:
    """A whole load test."""

    base_url: str
    model: str
    endpoint: str = "/v1/completions"
    stages: tuple[Stage, ...] = (Stage(),)
    dataset: Dataset = field(default_factory=Dataset)
    trace: Trace | None = None
    warmup_requests: int = 0
    ignore_eos: bool = True
    request_timeout_s: float = 600.0
    ready_timeout_s: float = 60.0
    api_key: str | None = None
    seed: int = 0
    goodput: dict[str, float] = field(default_factory=dict)  # {"ttft": ms, "tpot": ms, ...}
    max_error_rate: float | None = None  # stop early above this share of failed requests
    min_requests_for_error_rate: int = 20
    scrape_metrics: bool = True
    metrics_interval_s: float = 1.0
    record_requests: bool = False
    workers: int = 1  # client processes sharing the load (one core each)

    def validate(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise SpecError(f"base_url: {self.base_url!r} is not an http(s) URL")
        if not self.model:
            raise SpecError("model: required")
        if self.endpoint not in ("/v1/completions", "/v1/chat/completions"):
            raise SpecError(
                f"endpoint: {self.endpoint!r} is not /v1/completions or /v1/chat/completions"
            )
        if self.endpoint == "/v1/chat/completions" and self.dataset.prompt_format == "token_ids":
            raise SpecError("dataset.prompt_format: the chat endpoint takes text prompts")
        if not self.stages and self.trace is None:
            raise SpecError("stages: at least one stage (or a trace)")
        for stage in self.stages:
            stage.validate()
        self.dataset.validate()
        if self.warmup_requests < 0:
            raise SpecError("warmup_requests: must be >= 0")
        if self.request_timeout_s <= 0:
            raise SpecError("request_timeout_s: must be > 0")
        for key, value in self.goodput.items():
            if key not in ("ttft", "tpot", "e2el", "itl"):
                raise SpecError(f"goodput: unknown metric {key!r} (ttft, tpot, itl, e2el)")
            if value <= 0:
                raise SpecError(f"goodput: {key} must be > 0 ms")
        if self.max_error_rate is not None and not 0 <= self.max_error_rate <= 1:
            raise SpecError("max_error_rate: must be between 0 and 1")
        if not 1 <= self.workers <= 64:
            raise SpecError("workers: must be between 1 and 64")
        if self.trace is not None and self.trace.time_scale <= 0:
            raise SpecError("trace.time_scale: must be > 0")

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("api_key", None)
        return data
