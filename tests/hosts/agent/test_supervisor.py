"""Process-group stopping and error-line picking, on real processes."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from hosts.agent.engine import error_line
from hosts.agent.process import stop_group

pytestmark = pytest.mark.integration

STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
    "print('up', flush=True)\n"
    "time.sleep(60)\n"
)


def test_stop_group_reaches_workers_that_ignore_sigterm():
    leader = subprocess.Popen(
        [sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert leader.stdout.readline().strip() == "up"
        deadline = time.monotonic() + 5
        while not psutil.Process(leader.pid).children() and time.monotonic() < deadline:
            time.sleep(0.02)
        worker = psutil.Process(leader.pid).children()[0]
        started = time.monotonic()
        stop_group(leader.pid, grace=0.5, leader=leader)
        assert time.monotonic() - started < 5
        assert leader.returncode == -9
        worker.wait(5)
        assert not worker.is_running()
    finally:
        if leader.poll() is None:
            leader.kill()


def test_stop_group_of_a_process_that_exits_on_sigterm_is_quick():
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    started = time.monotonic()
    stop_group(proc.pid, grace=10, leader=proc)
    assert proc.returncode == -15 and time.monotonic() - started < 3


def test_error_line():
    lines = [
        "INFO starting",
        "ERROR 2026 EngineCore failed to start.",
        "ValueError: No available memory for the cache blocks.",
        "--- agent: pid 1 exited with code 1 ---",
    ]
    assert error_line(lines) == "ValueError: No available memory for the cache blocks."
    usage = ["usage: vllm serve [model_tag] [options]", "vllm serve: error: argument --x: bad"]
    assert error_line(usage) == "vllm serve: error: argument --x: bad"
    assert error_line(["INFO all good", ""]) == "INFO all good"
    assert error_line([]) == ""
