"""``python -m benchmarks.loadgen``: flags as `vllm bench serve` has them, plus stages, traces,
length distributions and shared prefixes.

    python -m benchmarks.loadgen --base-url http://127.0.0.1:8000 --model M \\
        --max-concurrency 16 --num-prompts 200 --random-input-len 512 --random-output-len 128 \\
        --ignore-eos --goodput ttft:500 tpot:50 --save-result --result-filename out.json
    # three load levels in one run:
    ... --stage low:concurrency=4,requests=100 --stage peak:rate=20,requests=400
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import sys
from datetime import datetime

from benchmarks.loadgen.runner import LoadGenError, LoadRun
from benchmarks.loadgen.shard import ShardedRun
from benchmarks.loadgen.spec import Dataset, LengthDist, LoadSpec, SpecError, Stage, Trace


def parse_stage(text: str) -> Stage:
    """``name:concurrency=8,requests=100`` or ``name:rate=5,burstiness=0.5,duration=60``."""
    name, _, params = text.partition(":")
    if not params:
        raise SpecError(f"--stage {text!r}: expected NAME:key=value,...")
    values = {}
    for item in params.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise SpecError(f"--stage {text!r}: {item!r} is not key=value")
        values[key.strip()] = value.strip()
    known = {"concurrency", "rate", "burstiness", "max_concurrency", "requests", "duration"}
    unknown = set(values) - known
    if unknown:
        raise SpecError(f"--stage {text!r}: unknown {sorted(unknown)} (known: {sorted(known)})")
    try:
        rate = float(values["rate"]) if "rate" in values else None
        return Stage(
            name=name,
            concurrency=int(values["concurrency"]) if "concurrency" in values else None,
            request_rate=rate,
            burstiness=float(values.get("burstiness", 1.0)),
            max_concurrency=int(values["max_concurrency"]) if "max_concurrency" in values else None,
            num_requests=int(values["requests"]) if "requests" in values else None,
            duration_s=float(values["duration"]) if "duration" in values else None,
        )
    except ValueError as exc:
        raise SpecError(f"--stage {text!r}: {exc}") from None


def parse_goodput(items: list[str]) -> dict[str, float]:
    slo = {}
    for item in items or []:
        key, sep, value = item.partition(":")
        try:
            slo[key] = float(value)
        except ValueError:
            raise SpecError(f"--goodput {item!r}: expected metric:milliseconds") from None
        if not sep:
            raise SpecError(f"--goodput {item!r}: expected metric:milliseconds")
    return slo


def histogram(text: str) -> LengthDist:
    try:
        pairs = tuple(
            (int(n), float(w)) for n, _, w in (item.partition(":") for item in text.split(","))
        )
    except ValueError:
        raise SpecError(f"histogram {text!r}: expected LEN:WEIGHT,...") from None
    return LengthDist("empirical", values=pairs)


def length(kind: str, mean: int, stddev: float, ratio: float) -> LengthDist:
    if not 0 <= ratio < 1:  # vLLM refuses the same
        raise SpecError("--random-range-ratio: must be in [0, 1)")
    if kind == "fixed" and ratio > 0:  # vllm's --random-range-ratio: uniform around the mean
        # vLLM's bounds (RandomDataset.get_sampling_params): floor below, ceil above.
        low, high = max(1, math.floor(mean * (1 - ratio))), math.ceil(mean * (1 + ratio))
        return LengthDist("uniform", mean, low=low, high=high)
    if kind == "uniform":
        spread = stddev or mean * 0.5
        return LengthDist(
            "uniform", mean, low=max(1, round(mean - spread)), high=round(mean + spread)
        )
    return LengthDist(kind, mean, stddev=stddev)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.loadgen",
        description="Load test an OpenAI-compatible LLM server.",
    )
    p.add_argument("--base-url", help="e.g. http://127.0.0.1:8000")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", required=True)
    p.add_argument(
        "--endpoint", default="/v1/completions", choices=["/v1/completions", "/v1/chat/completions"]
    )
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--request-rate", type=float, default=math.inf)
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="as vLLM's: input/output lengths uniform in "
        "[floor(len * (1 - ratio)), ceil(len * (1 + ratio))]; the prefix is not spread",
    )
    p.add_argument(
        "--random-prefix-len",
        type=int,
        default=0,
        help="as vLLM's: shared prefix tokens sent before each request's own "
        "--random-input-len tokens (the total input is their sum)",
    )
    p.add_argument(
        "--prefix-groups", type=int, default=1, help="distinct shared prefixes (default 1)"
    )
    p.add_argument(
        "--prefix-share",
        type=float,
        default=1.0,
        help="share of requests that send a shared prefix (default 1: all, as vLLM)",
    )
    p.add_argument(
        "--input-dist", default="fixed", choices=["fixed", "uniform", "normal", "lognormal"]
    )
    p.add_argument("--input-stddev", type=float, default=0.0)
    p.add_argument(
        "--output-dist", default="fixed", choices=["fixed", "uniform", "normal", "lognormal"]
    )
    p.add_argument("--output-stddev", type=float, default=0.0)
    p.add_argument(
        "--input-hist",
        default=None,
        metavar="LEN:WEIGHT,...",
        help="empirical input lengths, e.g. 200:5,1000:3,4000:1",
    )
    p.add_argument("--output-hist", default=None, metavar="LEN:WEIGHT,...")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="local tokenizer.json (or its directory) for exact text prompts",
    )
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--goodput", nargs="+", default=None, metavar="METRIC:MS")
    p.add_argument(
        "--stage",
        action="append",
        default=[],
        metavar="NAME:key=value,...",
        help="a load level; repeat for low/normal/peak (overrides --request-rate "
        "/--max-concurrency/--num-prompts)",
    )
    p.add_argument(
        "--trace",
        help="replay a JSONL/CSV trace (timestamp, input_tokens, output_tokens[, prefix_id])",
    )
    p.add_argument("--trace-time-scale", type=float, default=1.0)
    p.add_argument("--warmup", type=int, default=0, help="warm-up requests, not measured")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--ready-timeout", type=float, default=60.0)
    p.add_argument(
        "--max-error-rate",
        type=float,
        default=None,
        help="stop early (exit status 3) when more than this share (0-1) of the last 20 "
        "finished requests failed: the engine is failing, the numbers would describe that",
    )
    p.add_argument("--no-server-metrics", action="store_true")
    p.add_argument("--save-result", action="store_true")
    p.add_argument("--save-detailed", action="store_true", help="include per-request records")
    p.add_argument("--result-dir", default=".")
    p.add_argument("--result-filename", default=None)
    p.add_argument(
        "--workers", type=int, default=1, help="client processes sharing the load (one core each)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress line")
    return p


def spec_from_args(args) -> LoadSpec:
    if args.stage:
        stages = tuple(parse_stage(s) for s in args.stage)
    else:
        stages = (
            Stage(
                name="main",
                concurrency=None,
                request_rate=args.request_rate,
                burstiness=args.burstiness,
                max_concurrency=args.max_concurrency,
                num_requests=args.num_prompts,
            ),
        )
    dataset = Dataset(
        input_len=histogram(args.input_hist)
        if args.input_hist
        else length(
            args.input_dist, args.random_input_len, args.input_stddev, args.random_range_ratio
        ),
        output_len=histogram(args.output_hist)
        if args.output_hist
        else length(
            args.output_dist, args.random_output_len, args.output_stddev, args.random_range_ratio
        ),
        tokenizer=args.tokenizer,
        prefix_len=args.random_prefix_len,
        prefix_groups=args.prefix_groups,
        prefix_share=args.prefix_share,
        prompt_format="text" if args.endpoint.endswith("chat/completions") else "token_ids",
    )
    return LoadSpec(
        base_url=args.base_url or f"http://{args.host}:{args.port}",
        model=args.model,
        endpoint=args.endpoint,
        stages=stages,
        dataset=dataset,
        trace=Trace(args.trace, args.trace_time_scale) if args.trace else None,
        warmup_requests=args.warmup,
        ignore_eos=args.ignore_eos,
        request_timeout_s=args.request_timeout,
        ready_timeout_s=args.ready_timeout,
        api_key=os.environ.get("OPENAI_API_KEY"),
        seed=args.seed,
        goodput=parse_goodput(args.goodput),
        max_error_rate=args.max_error_rate,
        scrape_metrics=not args.no_server_metrics,
        record_requests=args.save_detailed,
    )


def progress_line(point: dict) -> None:
    ttft = f"{point['ttft_p50_ms']:.0f} ms" if point["ttft_p50_ms"] is not None else "—"
    sys.stderr.write(
        f"\r[{point['t']:6.0f}s] {point['stage']:<10} in flight {point['in_flight']:>4} · "
        f"done {point['completed']:>6} · failed {point['failed']:>4} · "
        f"{point['output_tokens_per_s']:>8.0f} tok/s · TTFT p50 {ttft:<9}"
    )
    sys.stderr.flush()


def print_summary(data: dict) -> None:
    rows = [
        ("Successful requests", data["completed"]),
        ("Failed requests", data["failed"]),
        ("Benchmark duration (s)", f"{data['duration']:.2f}"),
        ("Request throughput (req/s)", f"{data['request_throughput']:.2f}"),
        ("Output token throughput (tok/s)", f"{data['output_throughput']:.2f}"),
        ("Mean / p99 TTFT (ms)", f"{data['mean_ttft_ms']:.2f} / {data['p99_ttft_ms']:.2f}"),
        ("Mean / p99 TPOT (ms)", f"{data['mean_tpot_ms']:.2f} / {data['p99_tpot_ms']:.2f}"),
        ("Mean / p99 ITL (ms)", f"{data['mean_itl_ms']:.2f} / {data['p99_itl_ms']:.2f}"),
        ("Mean client queue (ms)", f"{data['mean_client_queue_ms']:.2f}"),
        ("Token counts from", data["token_count_source"]),
        ("Timestamps from", data.get("timestamps", "read")),
    ]
    if "request_goodput" in data:
        rows.append(("Request goodput (req/s)", f"{data['request_goodput']:.2f}"))
    print("=" * 20 + " Serving Benchmark Result " + "=" * 20)
    for label, value in rows:
        print(f"{label:<40}{value}")
    if data.get("errors_by_class"):
        print(f"{'Errors':<40}{data['errors_by_class']}")
    if data.get("stopped_early"):
        print(f"{'Stopped early':<40}{data['stopped_early']}")
    if data.get("failures"):
        print(f"{'Failures':<40}{data['failures']}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        spec = spec_from_args(args)
        progress = None if args.quiet else progress_line
        if spec.workers > 1:
            runner = ShardedRun(spec, on_progress=progress)
        else:
            runner = LoadRun(spec, on_progress=progress)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    if spec.workers > 1:
        signal.signal(signal.SIGINT, lambda *_: runner.cancel())
        try:
            result = runner.execute()
        except LoadGenError as exc:
            print(f"\nerror: {exc}", file=sys.stderr)
            return 1
        return finish(args, result)

    async def go():
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, runner.cancel)
        loop.add_signal_handler(signal.SIGTERM, runner.cancel)
        return await runner.execute()

    try:
        result = asyncio.run(go())
    except LoadGenError as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        return 1
    return finish(args, result)


def finish(args, result) -> int:
    if not args.quiet:
        sys.stderr.write("\n")
    data = result.to_dict()
    print_summary(data)
    if args.save_result or args.result_filename:
        name = args.result_filename or (
            f"openai-{args.model.replace('/', '_')}-{datetime.now():%Y%m%d-%H%M%S}.json"
        )
        path = os.path.join(args.result_dir, name)
        with open(path, "w") as handle:
            handle.write(result.to_json(indent=2))
        print(f"Saved {path}")
    if result.cancelled:
        return 130
    # A run the engine's failures stopped measured no working engine: scripts must see that.
    return 3 if result.stopped_on_errors else 0


if __name__ == "__main__":
    sys.exit(main())
