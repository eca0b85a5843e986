#!/usr/bin/env python3
"""How long a capacity-planning what-if takes (docs/: "Capacity planning"; issue 20's target:
a 24-hour day at one-minute resolution for 4 policies in under 20 s on the panel's machine).

For each demo fleet deployment (``hosts.demo.FLEET``, its active config: the last version)
it times what the worker does for a plan: the replica curve calibrated by the simulator in
virtual time (the built-in "Interactive chat" profile's request sizes), then the default day
(``scaling.services.whatif.default_hourly``) under the four policies, and prints the seconds,
the machine, and each policy's results. No database, no engine.

    .venv/bin/python scripts/bench_whatif.py [--delay 120] [--peak 45]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")
os.environ.setdefault("SECRET_KEY", "bench-only-" + "x" * 50)

import django  # noqa: E402

django.setup()  # the service module holds the default day; it imports models

from benchmarks.loadgen.profile import BUILTINS  # noqa: E402
from benchmarks.sweep.load import sweep_workload  # noqa: E402
from hosts.demo import FLEET  # noqa: E402
from scaling.planning.replica import calibrate  # noqa: E402
from scaling.planning.whatif import POLICIES, DayParams, run_day  # noqa: E402
from scaling.services.whatif import DEFAULT_PEAK_RPS, DEFAULT_SHAPE  # noqa: E402


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"nproc {os.cpu_count()}, {cpu}, Python {platform.python_version()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=120.0, help="start-up delay, s")
    parser.add_argument("--peak", type=float, default=DEFAULT_PEAK_RPS, help="peak req/s")
    args = parser.parse_args()
    hourly = [round(share * args.peak, 2) for share in DEFAULT_SHAPE]
    workload = sweep_workload(BUILTINS["Interactive chat"]["spec"], "rate")
    print(f"machine: {machine()}")
    print(f"day: peak {args.peak:g} req/s, start-up delay {args.delay:g} s, SLO p95 TTFT 500 ms")
    worst = 0.0
    for host in FLEET:
        started = time.perf_counter()
        curve = calibrate(
            host.engine, host.model, host.versions[-1], host.gpu_key, workload, host.gpus
        )
        calibrated = time.perf_counter()
        params = DayParams(
            start_delay_s=args.delay, price_per_gpu_hour=float(host.price) / host.gpus
        )
        result = run_day(hourly, curve, params)
        done = time.perf_counter()
        total = done - started
        worst = max(worst, total)
        print(
            f"\n{host.deployment} ({host.engine}, {host.model}, {host.gpus}× {host.gpu_key}, "
            f"config v{len(host.versions)}): {total:.2f} s "
            f"(calibration {calibrated - started:.2f} s, {len(POLICIES)} policies "
            f"{done - calibrated:.2f} s)"
        )
        print(
            f"  replica: saturation {curve.max_rps:.2f} req/s, "
            f"{curve.rps_at_slo(500) or 0:.2f} req/s within the SLO; "
            f"fixed N = {result['fixed_replicas']}"
        )
        print(
            f"  {'policy':<48} {'min out':>7} {'worst p95':>10} {'GPU-h':>7} "
            f"{'cost/day':>9} {'$/1M tok':>8} {'peak':>4} {'mean':>5} {'in SLO':>6} "
            f"{'timed out':>9}"
        )
        for day in result["policies"].values():
            s = day["summary"]
            worst_p95 = f"{s['worst_ttft_p95_ms']:.0f} ms" if s["worst_ttft_p95_ms"] else "-"
            print(
                f"  {day['label']:<48} {s['minutes_out_of_slo']:>7} {worst_p95:>10} "
                f"{s['gpu_hours']:>7.1f} {s['cost_per_day']:>9.2f} "
                f"{s['cost_per_million_tokens']:>8.3f} {s['peak_replicas']:>4.0f} "
                f"{s['mean_replicas']:>5.2f} {s['served_in_slo_share']:>6.1%} "
                f"{s['timed_out']:>9,}"
            )
    print(f"\nslowest what-if: {worst:.2f} s (target: under 20 s)")
    return 0 if worst < 20 else 1


if __name__ == "__main__":
    raise SystemExit(main())
