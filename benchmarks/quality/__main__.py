"""``python -m benchmarks.quality``: run, compare and check quality probes from the command line.

    python -m benchmarks.quality run --base-url http://gpu1:8000 --model m --json base.json
    python -m benchmarks.quality run --base-url http://gpu1:8001 --model m-fp8 --json cand.json
    python -m benchmarks.quality compare base.json cand.json --max-loss 0.01
    python -m benchmarks.quality check my-set.jsonl

``run`` prints accuracy per category × language; ``compare`` prints each group's verdict and
the items whose correctness changed; ``check`` prints one line per bad line of a set and exits
2 when there is any. Bad input exits with status 2 and one line saying what is wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.quality.builtin import CORE, BuiltinSetError, builtin_set
from benchmarks.quality.compare import ItemResult, accuracy_table, compare
from benchmarks.quality.items import ItemError, ProbeItem, item_from_dict, parse_jsonl
from benchmarks.quality.runner import run_probe_sync

RESULTS_FORMAT = "panel-quality-probe/1"


class UsageError(Exception):
    """Bad input: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m benchmarks.quality", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="ask a probe set of one deployment")
    run.add_argument("--base-url", required=True, help="the engine, e.g. http://gpu1:8000")
    run.add_argument("--model", required=True)
    source = run.add_mutually_exclusive_group()
    source.add_argument("--set", default=None, help=f"a built-in set (default {CORE})")
    source.add_argument("--file", type=Path, default=None, help="a JSONL probe set")
    run.add_argument("--concurrency", type=int, default=8)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--timeout", type=float, default=120, help="seconds per request")
    run.add_argument("--api-key", default=None)
    run.add_argument("--structured-output", action="store_true", help="response_format for JSON")
    run.add_argument("--json", type=Path, default=None, help="write the results here")
    cmp = sub.add_parser("compare", help="judge a candidate run against a baseline run")
    cmp.add_argument("baseline", type=Path)
    cmp.add_argument("candidate", type=Path)
    cmp.add_argument("--max-loss", type=float, default=0.01, help="0.01 = one point")
    cmp.add_argument("--confidence", type=float, default=0.95)
    cmp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    check = sub.add_parser("check", help="validate a JSONL probe set")
    check.add_argument("file", type=Path)
    return p


def _read_set(args) -> list[ProbeItem]:
    if args.file is None:
        try:
            return builtin_set(args.set or CORE)
        except KeyError as exc:
            raise UsageError(exc.args[0]) from None
    try:
        parsed = parse_jsonl(args.file.read_bytes())
    except OSError as exc:
        raise UsageError(f"{args.file}: {exc.strerror}") from None
    if parsed.errors:
        first = parsed.errors[0]
        more = f" (and {len(parsed.errors) - 1} more)" if len(parsed.errors) > 1 else ""
        raise UsageError(f"{args.file} line {first.line}: {first.message}{more}")
    return parsed.items


def _pct(x: float | None) -> str:
    return "   -  " if x is None else f"{x * 100:5.1f}%"


def cmd_run(args) -> int:
    if args.concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    items = _read_set(args)
    results = run_probe_sync(
        args.base_url,
        args.model,
        items,
        api_key=args.api_key,
        concurrency=args.concurrency,
        seed=args.seed,
        structured_output=args.structured_output,
        timeout_s=args.timeout,
    )
    print(f"{'category':<14} {'lang':<5} {'n':>4} {'acc':>6}  95% CI")
    for row in accuracy_table(items, results):
        acc = row["correct"] / row["n"]
        print(
            f"{row['category']:<14} {row['language']:<5} {row['n']:>4} {_pct(acc)}"
            f"  [{_pct(row['low']).strip()}, {_pct(row['high']).strip()}]"
        )
    errors = sum(1 for r in results if r.error)
    if errors:
        print(f"{errors} request(s) failed; first: {next(r.error for r in results if r.error)}")
    if args.json:
        document = {
            "format": RESULTS_FORMAT,
            "base_url": args.base_url,
            "model": args.model,
            "set": str(args.file) if args.file else args.set or CORE,
            "seed": args.seed,
            "structured_output": args.structured_output,
            "items": [i.to_dict() for i in items],
            "results": [r.to_dict() for r in results],
        }
        args.json.write_text(json.dumps(document, ensure_ascii=False, indent=1), "utf-8")
    return 0


def _read_results(path: Path) -> tuple[list[ProbeItem], list[ItemResult]]:
    try:
        data = json.loads(path.read_text("utf-8"))
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not a JSON file ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != RESULTS_FORMAT:
        raise UsageError(f"{path}: not the output of `run --json` (format {RESULTS_FORMAT})")
    try:
        items = [item_from_dict(i) for i in data["items"]]
        results = [ItemResult.from_dict(r) for r in data["results"]]
    except (ItemError, KeyError, TypeError) as exc:
        raise UsageError(f"{path}: {exc}") from None
    return items, results


def cmd_compare(args) -> int:
    if not 0 <= args.max_loss < 1 or not 0 < args.confidence < 1:
        raise UsageError("--max-loss must be in [0, 1) and --confidence in (0, 1)")
    base_items, base = _read_results(args.baseline)
    cand_items, cand = _read_results(args.candidate)
    items = {i.id: i for i in cand_items} | {i.id: i for i in base_items}
    result = compare(
        base, cand, list(items.values()), max_loss=args.max_loss, confidence=args.confidence
    )
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False, indent=1))
        return 0
    print(f"{'group':<24} {'n':>4} {'base':>6} {'cand':>6} {'loss':>6}  {'p':>6}  verdict")
    for g in result.groups:
        print(
            f"{g.key:<24} {g.n:>4} {_pct(g.baseline_accuracy)} {_pct(g.candidate_accuracy)} "
            f"{_pct(g.loss)}  {g.mcnemar_p:6.3f}  {g.verdict}"
        )
    o = result.overall
    if o.json_items:
        print(
            f"JSON valid {_pct(o.baseline_json_valid)} -> {_pct(o.candidate_json_valid)}, "
            f"schema ok {_pct(o.baseline_schema_ok)} -> {_pct(o.candidate_schema_ok)}"
        )
    print(f"answers agree on {_pct(o.agreement).strip()} of items")
    for change in result.changed[:20]:
        side = "lost" if change["baseline_correct"] else "gained"
        print(f"  {side}: {change['id']} ({change['category']}/{change['language']})")
        print(f"    baseline:  {change['baseline_answer'][:100]!r}")
        print(f"    candidate: {change['candidate_answer'][:100]!r}")
    if result.only_in_baseline or result.only_in_candidate:
        print(
            f"unpaired: {len(result.only_in_baseline)} only in baseline, "
            f"{len(result.only_in_candidate)} only in candidate (not counted)"
        )
    print(f"verdict: {result.judged['text']}")
    return 0


def cmd_check(args) -> int:
    try:
        data = args.file.read_bytes()
    except OSError as exc:
        raise UsageError(f"{args.file}: {exc.strerror}") from None
    parsed = parse_jsonl(data)
    for error in parsed.errors:
        print(f"{args.file}:{error.line}: {error.message}")
    print(f"{len(parsed.items)} good item(s), {len(parsed.errors)} bad line(s)")
    return 2 if parsed.errors else 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        command = {"run": cmd_run, "compare": cmd_compare, "check": cmd_check}[args.command]
        return command(args)
    except (UsageError, BuiltinSetError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
