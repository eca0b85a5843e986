#!/usr/bin/env python3
"""How long the built-in quality probe takes on the simulator, and what it finds between a
full-precision model and its FP8 and AWQ (INT4) variants (docs/: "Quality probes").

Starts one simulated vLLM engine per variant (Llama-3.1-8B on an H100, real time, given the
built-in sets' knowledge file, each in its own process), asks each the probe set
(``panel-core`` by default) at concurrency 16 through the OpenAI API with the panel's pure
runner, then compares each variant with the full-precision run. Prints seconds per run,
accuracy per category × language, and the verdicts.

    .venv/bin/python scripts/bench_probe.py [--set panel-core] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.quality import builtin_set, compare, run_probe_sync  # noqa: E402
from benchmarks.quality.knowledge import knowledge_lines  # noqa: E402

BASE = "meta-llama/Llama-3.1-8B-Instruct"
VARIANTS = (
    ("bf16", BASE, []),
    ("fp8", BASE, ["--quantization", "fp8"]),
    ("awq", f"{BASE}-AWQ", []),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def knowledge_file(items, path: Path) -> Path:
    """The items as the simulator's --knowledge lines (what the demo fleet writes)."""
    lines = knowledge_lines(items)
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    return path


def start(model: str, extra: list[str], knowledge: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "hosts.simulator",
        "vllm",
        model,
        "--max-model-len",
        "8192",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--knowledge",
        str(knowledge),
        *extra,
    ]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1):  # noqa: S310 - loopback
                return process, url
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the simulator for {model} did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", default="panel-core")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    items = builtin_set(args.set)
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        knowledge = knowledge_file(items, Path(scratch) / "knowledge.jsonl")
        for name, model, extra in VARIANTS:
            process, url = start(model, extra, knowledge)
            try:
                started = time.perf_counter()
                results[name] = run_probe_sync(url, model, items, concurrency=args.concurrency)
                seconds = time.perf_counter() - started
            finally:
                process.terminate()
                process.wait(timeout=10)
            right = sum(1 for r in results[name] if r.correct)
            print(
                f"{name:>5}: {len(items)} items in {seconds:5.1f} s at concurrency "
                f"{args.concurrency}: {right / len(items):.1%} right"
            )
    for name in ("fp8", "awq"):
        result = compare(results["bf16"], results[name], items)
        print(f"\nbf16 → {name}: {result.judged['text']}")
        for group in result.groups:
            if ":" in group.key or group.key == "overall":
                print(
                    f"  {group.key:<22} n={group.n:<4} {group.baseline_accuracy:6.1%} → "
                    f"{group.candidate_accuracy:6.1%}  p={group.mcnemar_p:.4f}  {group.verdict}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
