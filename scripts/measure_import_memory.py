#!/usr/bin/env python3
"""How much memory and time importing a large ``vllm bench serve --save-detailed`` file costs
(issue 14: a 33 MB file grew the process by 1.3 GB before imports were streamed).

Writes a vllm-bench-style file of about ``--mib`` MiB (default 256, the upload limit) into a
temporary directory — request count, per-request token gaps (``itls``), generated texts and
errors as vllm writes them — then imports it through the code path of the background task:
``benchmarks.services.imports.start_import`` saves it under VAR_DIR and makes the job row,
``benchmarks.tasks.import_result`` reads it (run here, in this process, as the embedded
worker would). Prints the peak RSS above what the process held just before the import
(sampled every 5 ms by a thread, and from ``getrusage``'s high-water mark), and seconds.

    .venv/bin/python scripts/measure_import_memory.py [--mib 256] [--tokens 600]
    .venv/bin/python scripts/measure_import_memory.py --json-load   # also json.load it

``--json-load`` also measures, in a child process, a plain ``json.load`` of the same file:
the floor of what reading it whole (the code before streaming) cost.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MIB = 2**20


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=float, default=256, help="size of the file to import")
    p.add_argument("--tokens", type=int, default=600, help="mean output tokens a request")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json-load", action="store_true", help="also measure json.load of it")
    return p.parse_args()


def write_vllm_file(path: Path, target_bytes: int, tokens: int, seed: int) -> int:
    """A detailed vllm bench file of about ``target_bytes``, written a request at a time
    (this process must not hold it: its RSS is what is measured). Returns the requests."""
    rng = random.Random(seed)
    # A request costs about: its gaps (~21 bytes each as Python's repr writes them), its
    # text (~5 bytes a token) and a few numbers.
    per_request = tokens * 25.2 + 60
    n = max(10, int(target_bytes / per_request))
    failed = {i for i in range(n) if rng.random() < 0.02}
    lengths = [0 if i in failed else rng.randint(tokens // 2, tokens * 3 // 2) for i in range(n)]
    head = {
        "date": "20250612-150000",
        "endpoint_type": "openai",
        "backend": "vllm",
        "label": "memory-check",
        "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct",
        "num_prompts": n,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": 256,
        "duration": 600.0,
        "completed": n - len(failed),
        "failed": len(failed),
        "total_input_tokens": 512 * (n - len(failed)),
        "total_output_tokens": sum(lengths),
        "request_throughput": (n - len(failed)) / 600.0,
        "output_throughput": sum(lengths) / 600.0,
        "mean_ttft_ms": 150.0,
        "median_ttft_ms": 140.0,
        "std_ttft_ms": 30.0,
        "p99_ttft_ms": 300.0,
        "mean_itl_ms": 20.0,
        "median_itl_ms": 19.0,
        "std_itl_ms": 4.0,
        "p99_itl_ms": 45.0,
    }
    with path.open("w") as out:
        out.write(json.dumps(head)[:-1])

        def column(name, values):
            out.write(f', "{name}": [')
            for i, value in enumerate(values):
                if i:
                    out.write(", ")
                out.write(value)
            out.write("]")

        column("input_lens", (str(rng.randint(100, 1000)) for _ in range(n)))
        column("output_lens", (str(length) for length in lengths))
        column("ttfts", ("0.0" if i in failed else repr(rng.random() / 4) for i in range(n)))
        column(
            "itls",
            (
                "[" + ", ".join(repr(rng.random() / 25) for _ in range(length)) + "]"
                for length in lengths
            ),
        )
        column("generated_texts", (json.dumps("tok " * length) for length in lengths))
        column(
            "errors",
            ('"ClientConnectorError: timed out"' if i in failed else '""' for i in range(n)),
        )
        column("start_times", (repr(1000.0 + i * 0.005) for i in range(n)))
        out.write("}")
    return n


def setup(scratch: Path):
    os.environ["VAR_DIR"] = str(scratch / "var")
    os.environ.pop("REDIS_URL", None)
    os.environ["DATABASE_URL"] = f"sqlite:///{scratch / 'measure.sqlite3'}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


class PeakRSS:
    """The highest resident set size seen by a thread sampling every 5 ms."""

    def __init__(self):
        import psutil

        self.process = psutil.Process()
        self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            self._stop.wait(0.005)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def json_load_peak(path: Path) -> tuple[float, float]:
    """Peak RSS (MiB) and seconds of ``json.load`` of ``path`` in a fresh child process."""
    code = (
        "import json, resource, sys, time\n"
        "t = time.perf_counter()\n"
        "with open(sys.argv[1], 'rb') as f: json.load(f)\n"
        "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
    )
    seconds, maxrss_kib = out.stdout.split()
    return int(maxrss_kib) / 1024, float(seconds)


def main() -> int:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="measure-import-") as tmp:
        scratch = Path(tmp)
        path = scratch / "vllm-bench.json"
        t = time.perf_counter()
        requests = write_vllm_file(path, int(args.mib * MIB), args.tokens, args.seed)
        size = path.stat().st_size
        print(
            f"file: {size / MIB:.1f} MiB, {requests:,} requests "
            f"(written in {time.perf_counter() - t:.1f} s)"
        )
        setup(scratch)

        from django.core.files import File
        from django.db import transaction

        from benchmarks import tasks
        from benchmarks.models import ImportJob, RunRequestLog
        from benchmarks.services.imports import start_import
        from hosts.models import Deployment, Host

        host = Host.objects.create(name="gpu-measure", address="127.0.0.1", port=9100)
        deployment = Deployment.objects.create(
            host=host, name="engine", model="meta-llama/Llama-3.1-8B-Instruct", port=8000
        )
        with path.open("rb") as handle, transaction.atomic():
            job = start_import(None, File(handle, name=path.name), deployment)
        # The task was queued on commit to the in-memory broker; run it here instead, as the
        # worker would, so this process is the one measured.
        import gc

        gc.collect()
        before = PeakRSS().process.memory_info().rss
        maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        t = time.perf_counter()
        with PeakRSS() as peak:
            tasks.import_result(job.pk)
        seconds = time.perf_counter() - t
        maxrss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        job = ImportJob.objects.select_related("run").get(pk=job.pk)
        if job.status != "succeeded":
            print(f"import failed: {job.error}")
            return 1
        log = RunRequestLog.objects.get(run=job.run)
        print(
            f"imported: run #{job.run.pk}, {job.run.completed:,} succeeded, "
            f"{job.run.failed:,} failed, request log {log.count:,} requests "
            f"({len(bytes(log.data)) / MIB:.1f} MiB compressed)"
        )
        print(f"seconds: {seconds:.1f}")
        print(f"RSS before the import: {before / MIB:.0f} MiB")
        print(f"peak extra RSS (sampled every 5 ms): {(peak.peak - before) / MIB:.0f} MiB")
        if maxrss_after > maxrss_before:
            print(f"peak extra RSS (getrusage): {(maxrss_after - before) / MIB:.0f} MiB")
        else:
            print("peak extra RSS (getrusage): below the process's earlier high-water mark")
        if args.json_load:
            rss, secs = json_load_peak(path)
            print(
                f"for comparison, json.load alone in a fresh process: {rss:.0f} MiB, {secs:.1f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
