"""``python -m benchmarks.sweep``: predict a tuning sweep from the command line.

    python -m benchmarks.sweep --engine vllm --model meta-llama/Llama-3.1-8B-Instruct \\
        --gpu h100-sxm --flag max_num_seqs=16,32,64,128 \\
        --flag gpu_memory_utilization=0.8:0.95:0.05 --slo ttft_p95_ms=500 --slo itl_p95_ms=50

Prints the points that meet the SLO, best first, then the configs the engine would refuse with
its own words; ``--json`` prints the whole prediction instead. Bad input exits with status 2
and one line saying what is wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.loadgen.spec import SpecError
from benchmarks.sweep.load import SWEEP_REQUESTS, sweep_workload
from benchmarks.sweep.predict import MODES, OBJECTIVES, PointScore, Prediction, predict_space
from benchmarks.sweep.slo import Slo
from benchmarks.sweep.space import SpaceError, parse_dimension_text, parse_space
from hosts.engines import ENGINES, EngineArgError, get_spec


class UsageError(Exception):
    """Bad input: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m benchmarks.sweep", description=__doc__.splitlines()[0])
    p.add_argument("--engine", required=True, choices=sorted(ENGINES))
    p.add_argument("--engine-version", default=None, help="refuse flags this version lacks")
    p.add_argument("--model", required=True)
    p.add_argument("--gpu", required=True, help="simulator GPU key (h100-sxm) or NVML name")
    p.add_argument("--num-gpus", type=int, default=1)
    p.add_argument(
        "--flag",
        action="append",
        default=[],
        metavar="DEST=VALUES",
        help="a varied flag: 16,32,64 or min:max:step or true,false (repeat)",
    )
    p.add_argument("--base", action="append", default=[], metavar="DEST=VALUE")
    p.add_argument("--slo", action="append", default=[], metavar="KEY=NUMBER")
    p.add_argument("--max-error-rate", type=float, default=None)
    p.add_argument("--profile", type=Path, help="a load profile document (JSON)")
    p.add_argument("--input-len", type=int, default=None)
    p.add_argument("--output-len", type=int, default=None)
    p.add_argument("--num-requests", type=int, default=None)
    p.add_argument("--mode", choices=MODES, default="rate")
    p.add_argument("--objective", choices=sorted(OBJECTIVES), default="tps_per_gpu")
    p.add_argument("--price-per-gpu-hour", type=float, default=None)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print the prediction as JSON")
    return p


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{what} {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _profile(args) -> dict:
    if args.profile is not None:
        if any(v is not None for v in (args.input_len, args.output_len, args.num_requests)):
            raise UsageError("give either --profile or --input-len/--output-len/--num-requests")
        try:
            return json.loads(args.profile.read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read the profile {str(args.profile)!r}: {exc}") from None
    return {
        "input_len": {"kind": "fixed", "mean": args.input_len or 512},
        "output_len": {"kind": "fixed", "mean": args.output_len or 128},
        "stages": [
            {"name": "main", "concurrency": 8, "num_requests": args.num_requests or SWEEP_REQUESTS}
        ],
    }


def run(args) -> Prediction:
    spec = get_spec(args.engine)
    raw = {}
    for dest, text in _pairs(args.flag, "--flag").items():
        flag = spec.by_dest.get(dest)
        try:
            raw[dest] = parse_dimension_text(flag, text) if flag else [text]
        except ValueError as exc:
            raise UsageError(f"--flag {dest}: {exc}") from None
    if not raw:
        raise UsageError("give at least one --flag DEST=VALUES")
    space = parse_space(args.engine, args.engine_version, raw)
    slo_data: dict = dict(_pairs(args.slo, "--slo"))
    if args.max_error_rate is not None:
        slo_data["max_error_rate"] = args.max_error_rate
    slo = Slo.from_dict(slo_data)
    workload = sweep_workload(_profile(args), args.mode)
    return predict_space(
        args.engine,
        args.model,
        _pairs(args.base, "--base"),
        space,
        args.gpu,
        args.num_gpus,
        workload,
        args.mode,
        slo,
        args.objective,
        price_per_gpu_hour=args.price_per_gpu_hour,
        time_scale=args.time_scale,
        workers=args.workers,
    )


def _num(value, digits: int = 0, scale: float = 1.0) -> str:
    return "—" if value is None else f"{value * scale:,.{digits}f}"


def _flags(point: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items())


def _row(rank: str, p: PointScore) -> list[str]:
    n = p.numbers
    return [
        rank,
        _flags(p.point),
        _num(p.max_load, 2),
        _num(n.get("ttft_p95_ms")),
        _num(n.get("itl_p95_ms"), 1),
        _num(n.get("output_tps_per_gpu")),
        _num(n.get("output_tps_per_user"), 1),
        _num(p.cost_per_million, 3),
        _num(p.margin, 0, 100) + ("" if p.margin is None else " %"),
    ]


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 1 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    )


def report(prediction: Prediction, slo: dict, top: int) -> str:
    c = prediction.counts
    unit = "req/s" if prediction.mode == "rate" else "clients"
    lines = [
        f"{c['total']} points: {c['feasible']} start, {c['meeting']} meet the SLO "
        f"({Slo(**slo).describe()}); {prediction.elapsed_s:.1f} s on "
        f"{prediction.workers} worker(s). Ranked by {OBJECTIVES[prediction.objective]}.",
        "",
    ]
    ranked = prediction.ranked()[:top]
    if ranked:
        head = ["#", "flags", f"max {unit}", "p95 TTFT ms", "p95 ITL ms", "tok/s/GPU"]
        head += ["tok/s/user", "cost/1M", "margin"]
        lines.append(_table([head] + [_row(str(i), p) for i, p in enumerate(ranked, 1)]))
    else:
        lines.append("No point meets the SLO at any load tried.")
        closest = prediction.closest
        if closest is not None and closest.closest:
            near = closest.closest
            lines.append(
                f"Closest: {_flags(closest.point)} at {_num(near['load'], 2)} {unit}: "
                + "; ".join(near["violations"])
            )
    for group in prediction.infeasible:
        lines += ["", f"{group['count']} config(s) would not start: {group['error']}"]
        lines += [f"  {_flags(point)}" for point in group["points"][:3]]
        if group["count"] > 3:
            lines.append(f"  … and {group['count'] - 3} more")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        prediction = run(args)
    except (UsageError, SpaceError, SpecError, EngineArgError, ValueError) as exc:
        # SloError and PredictError are ValueErrors: every refusal of the input lands here.
        print(f"benchmarks.sweep: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(prediction.to_dict(), indent=1))
    else:
        print(report(prediction, prediction.slo, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
