"""The engine core: a continuous-batching scheduler stepping like vLLM V1 (or SGLang).

Time-agnostic: ``step(now)`` plans one step, asks the cost model how long it takes and applies
its effects at ``now + duration``. The real-time server sleeps that long between steps; the
virtual-time predictor just adds it to a clock. Both therefore run exactly this code.

vLLM (mixed batches): running requests first — decodes take one token each, unfinished prefills
their next chunk — then waiting requests' prefill chunks fill what is left of the token budget,
with at most ``max_num_seqs`` running. When KV blocks run out the newest running request is
preempted: its blocks are freed and it goes back to the front of the queue to be recomputed.
SGLang (``mixed_batches=False``) runs a prefill step whenever it can admit waiting requests and
a decode step of every running request otherwise.

Simplifications: SGLang's lpm/dfs-weight/lof/random policies queue first-come first-served here,
and KV is accounted in blocks of 16 tokens for SGLang too (its page size is 1).
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from dataclasses import dataclass, field

from hosts.simulator.config import SimConfig, ceil_div
from hosts.simulator.costmodel import CostModel
from hosts.simulator.kvcache import KVCache

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


@dataclass(eq=False, slots=True)
class Request:
    """One generation request and its progress through the engine."""

    id: str
    prompt_len: int
    block_hashes: list[int]  # hashes of the prompt's full blocks (prefix caching)
    max_tokens: int
    output_target: int  # tokens it will generate: max_tokens, or fewer if it "hits EOS"
    arrival: float
    priority: int = 0
    params_n: int = 1  # the client's ``n`` (choices asked for); vLLM's request_params_n
    # The n>1 choices of one client request run as ``params_n`` requests sharing this id, as
    # vLLM fans a parent request out to children: its per-parent histograms observe once.
    parent_id: str | None = None
    # Whether the client streams: SGLang's scheduler sends a non-streamed request's output
    # only every 50 tokens and at the end, which is when its tokenizer observes TTFT.
    stream: bool = True
    seq: int = 0
    status: str = WAITING
    num_computed: int = 0
    num_output: int = 0
    blocks: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    preemptions: int = 0
    stage_tic: float | None = None  # SGLang's Req.last_tic: when its last stage began
    sink: object = None  # whoever waits for this request's tokens (the HTTP handler)

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.prompt_len


@dataclass(slots=True)
class StepResult:
    """What one step did."""

    start: float
    duration: float
    emitted: list[Request]  # requests that got a token at ``start + duration``
    finished: list[Request]
    preempted: list[Request]
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    # Requests that computed prompt tokens in this step (new, chunked, or recomputed after a
    # preemption), for the engines' per-request scheduling histograms.
    prefilled: list = field(default_factory=list)
    admitted: int = 0  # requests taken from the waiting queue in this step

    @property
    def end(self) -> float:
        return self.start + self.duration


class EngineCore:
    """Scheduler + KV cache + cost model of one engine."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.cost = CostModel.for_config(cfg)
        self.kv = KVCache(cfg.num_blocks, cfg.block_size, cfg.prefix_caching)
        self.priority = cfg.scheduling_policy == "priority"
        self.waiting: deque[Request] | list = [] if self.priority else deque()
        self.running: list[Request] = []
        self._seq = itertools.count()
        # Counters, as the engines export them.
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.num_preemptions = 0
        self.finished_requests = 0
        self.num_aborted = 0  # requests dropped by abort() (the client went away)
        self._admitted = 0
        # When set, called as (request, was_running) for each request abort() drops: SGLang
        # counts aborts, and finishes a running one with its tokens so far.
        self.on_abort = None
        # When set (a list, or anything with append), every inter-token gap in seconds.
        self.itl = None

    # --- queue ---------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.seq = next(self._seq)
        req.status = WAITING
        self._enqueue(req, front=False)

    def _enqueue(self, req: Request, front: bool) -> None:
        if self.priority:
            keys = [(r.priority, r.seq) for r in self.waiting]
            self.waiting.insert(bisect.bisect(keys, (req.priority, req.seq)), req)
        elif front:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)

    def abort(self, req: Request, now: float) -> None:
        """Drop a request (client went away): free its blocks, never emit again."""
        if req.status == FINISHED:
            return
        was_running = req.status == RUNNING
        if was_running:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        self._finish(req, now, "abort")
        self.num_aborted += 1
        if self.on_abort is not None:
            self.on_abort(req, was_running)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # --- one step ------------------------------------------------------------------------
    def step(self, now: float) -> StepResult | None:
        """Plan and account one step starting at ``now``; None when there is nothing to do."""
        if not self.has_work:
            return None
        self._admitted = 0
        if self.cfg.mixed_batches:
            scheduled, preempted = self._schedule_mixed()
        else:
            scheduled, preempted = self._schedule_alternating()
        if not scheduled:
            # Nothing fits (e.g. one request longer than the whole cache): fail the head.
            head = self.waiting.popleft() if not self.priority else self.waiting.pop(0)
            self._finish(head, now, "abort")
            return StepResult(
                now, 0.0, [], [head], preempted, 0, 0, len(self.running), len(self.waiting)
            )

        # The two loops below run for every request in every step: kept flat and local.
        new_tokens = kv_read = prefill_tokens = 0
        attn_pairs = 0.0
        for req, n in scheduled:
            computed = req.num_computed
            new_tokens += n
            kv_read += computed + n
            attn_pairs += n * (computed + n / 2)
            if computed < req.prompt_len:
                prefill_tokens += min(n, req.prompt_len - computed)
        duration = self.cost.step_time(
            new_tokens, kv_read, attn_pairs, len(scheduled), prefill_tokens
        )
        end = now + duration

        emitted, finished, prefilled = [], [], []
        bs = self.cfg.block_size
        itl = self.itl
        for req, n in scheduled:
            if req.first_scheduled is None:
                req.first_scheduled = now
            prompt_len = req.prompt_len
            was_prefill = req.num_computed < prompt_len
            computed = req.num_computed = req.num_computed + n
            if was_prefill:
                prefilled.append(req)
                done_blocks = (computed if computed < prompt_len else prompt_len) // bs
                self.kv.cache_blocks(req.blocks, req.block_hashes, 0, done_blocks)
            if computed >= prompt_len + req.num_output:
                req.num_output += 1
                if req.first_token is None:
                    req.first_token = end
                elif itl is not None:
                    itl.append(end - req.last_token)
                req.last_token = end
                emitted.append(req)
                if req.num_output >= req.output_target:
                    finished.append(req)
        self.prompt_tokens += prefill_tokens
        self.generation_tokens += len(emitted)
        for req in finished:
            reason = "length" if req.num_output >= req.max_tokens else "stop"
            self._finish(req, end, reason)
        if finished:
            self.running = [r for r in self.running if r.status == RUNNING]
        return StepResult(
            now,
            duration,
            emitted,
            finished,
            preempted,
            prefill_tokens,
            new_tokens - prefill_tokens,
            len(self.running),
            len(self.waiting),
            prefilled,
            self._admitted,
        )

    def _finish(self, req: Request, when: float, reason: str) -> None:
        self.kv.release(req.blocks)
        req.blocks = []
        req.status = FINISHED
        req.finished_at = when
        req.finish_reason = reason
        self.finished_requests += 1

    def _preempt_newest(self) -> Request:
        victim = self.running.pop()
        self.kv.release(victim.blocks)
        victim.blocks = []
        victim.num_computed = 0
        victim.status = WAITING
        victim.preemptions += 1
        self.num_preemptions += 1
        self._enqueue(victim, front=True)
        return victim

    def _schedule_running(
        self,
        budget: int,
        scheduled: list,
        preempted: list,
        decode_only: bool = False,
        prefill_only: bool = False,
    ) -> int:
        kv, bs, running = self.kv, self.cfg.block_size, self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed
            prefill = computed < req.prompt_len
            if (decode_only and prefill) or (prefill_only and not prefill):
                i += 1
                continue
            n = req.prompt_len + req.num_output - computed
            if n > budget:
                n = budget
            need = -(-(computed + n) // bs) - len(req.blocks)
            if need > 0:
                while not kv.can_allocate(need):
                    victim = self._preempt_newest()
                    preempted.append(victim)
                    if victim is req:
                        break
                if req.status != RUNNING:
                    break
                req.blocks.extend(kv.allocate(need))
            scheduled.append((req, n))
            budget -= n
            i += 1
        return budget

    def _schedule_waiting(self, budget: int, scheduled: list) -> int:
        cfg, kv, bs = self.cfg, self.kv, self.cfg.block_size
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = self.waiting[0]
            cached = kv.lookup(req.block_hashes, req.num_tokens)
            computed = len(cached) * bs
            remaining = req.num_tokens - computed
            if not cfg.chunked_prefill and remaining > budget:
                break
            n = min(remaining, budget)
            need = ceil_div(computed + n, bs) - len(cached)
            if not kv.can_allocate(need, cached):
                break
            kv.take_cached(cached)
            req.blocks = cached + kv.allocate(need)
            if req.first_scheduled is None:
                req.cached_tokens = computed
                kv.count_lookup(req.num_tokens, computed)
            req.num_computed = computed
            if self.priority:
                self.waiting.pop(0)
            else:
                self.waiting.popleft()
            req.status = RUNNING
            self.running.append(req)
            self._admitted += 1
            scheduled.append((req, n))
            budget -= n
        return budget

    def _schedule_mixed(self):
        scheduled, preempted = [], []
        budget = self._schedule_running(self.cfg.token_budget, scheduled, preempted)
        if not preempted:
            self._schedule_waiting(budget, scheduled)
        return scheduled, preempted

    def _schedule_alternating(self):
        scheduled, preempted = [], []
        # Prefill step: unfinished chunked prefills, then new requests, if any can run.
        budget = self._schedule_running(
            self.cfg.token_budget, scheduled, preempted, prefill_only=True
        )
        self._schedule_waiting(budget, scheduled)
        if scheduled:
            return scheduled, preempted
        # Decode step: every running request, one token each.
        self._schedule_running(len(self.running) or 1, scheduled, preempted, decode_only=True)
        return scheduled, preempted
