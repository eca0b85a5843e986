"""Run the production process commands (from docker-compose.yml) natively, for tests."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis.exceptions
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def compose_command(service: str) -> list[str]:
    """The service's command, with executables resolved in this virtualenv."""
    cmd = list(COMPOSE["services"][service]["command"])
    if cmd[0] == "python":
        cmd[0] = sys.executable
    elif (BIN / cmd[0]).exists():
        cmd[0] = str(BIN / cmd[0])
    return cmd


def compose_healthcheck(service: str) -> str:
    """The service's CMD-SHELL healthcheck as a shell line ($$ is compose's escape for $)."""
    test = COMPOSE["services"][service]["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL", test
    line = test[1].replace("$$", "$")
    first, _, rest = line.partition(" ")
    if (BIN / first).exists():
        line = f"{shlex.quote(str(BIN / first))} {rest}"
    return line


class Process:
    """A child process with its output in a file, stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, name: str, cmd: list[str], env: dict, logdir: Path):
        self.name = name
        self.log_path = logdir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_output(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.output()}")
            time.sleep(0.1)
        raise AssertionError(f"{self.name} never printed {text!r}:\n{self.output()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self._log.close()


def wait_until(predicate, timeout: float, message, interval: float = 0.1):
    """Poll ``predicate``; on time-out fail with ``message`` (a string, or a callable for one
    built at failure time, such as a process's log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(message() if callable(message) else message)


def run_healthcheck(service: str, env: dict) -> subprocess.CompletedProcess:
    """Run the compose healthcheck of ``service`` here, as Docker would inside its container."""
    return subprocess.run(
        ["sh", "-c", compose_healthcheck(service)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def use_redis_channel_layer(settings, url: str) -> None:
    """This test process's channel layer on ``url``'s Redis, where the started processes
    publish (pytest-django's ``settings`` fixture restores it)."""
    from controlpanel.settings import redis_channel_layers

    # The panel's own definition: with redis-py's default 5 s socket timeout, a receive that
    # waits in channels_redis's 5 s blocking pop is cut off mid-read on a busy machine.
    settings.CHANNEL_LAYERS = redis_channel_layers(url)


async def group_events(
    layer, channel, finished, workers, what: str, timeout: float = 120, on_event=None
) -> list[dict]:
    """The events on ``channel`` (already in the group a page would listen on) until
    ``finished(event)``; ``on_event`` (async) sees each event first. On time-out, fail with
    the workers' logs."""
    events = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        try:
            message = await asyncio.wait_for(layer.receive(channel), timeout=5)
        except (TimeoutError, redis.exceptions.TimeoutError):
            # redis-py turns a wait cut off mid-read into its own TimeoutError (not the
            # builtin one): seen on a busy machine. The layer reconnects on the next receive.
            continue
        events.append(message)
        if on_event is not None:
            await on_event(message)
        if finished(message):
            return events
    logs = "\n".join(w.output()[-3000:] for w in workers)
    raise AssertionError(f"the {what} never finished:\n" + logs)


async def run_events(broker, run, workers, timeout: float = 120, on_event=None) -> list[dict]:
    """Send the run's task to the started workers and listen on the run's group (as its page
    would) until the run says it finished; ``on_event`` (async) sees each event first."""
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(f"run-{run.pk}", channel)
    broker.send_task("benchmarks.tasks.run_benchmark", args=[run.pk])
    return await group_events(
        layer,
        channel,
        lambda m: m["type"] == "run.status" and m["data"]["finished"],
        workers,
        "run",
        timeout,
        on_event,
    )
