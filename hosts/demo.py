"""The embedded demo fleet: local host agents, each supervising a simulated GPU server.

``make run`` starts them so a new user sees live GPUs at once: every agent is the real
``python -m hosts.agent`` (token-authenticated, the same code a GPU server runs), told to
simulate its GPUs (``--simulate``), and the panel applies each deployment's config through it,
so the engines are the simulator started by the agent's supervisor.

Ports: agent *i* listens on ``DEMO_FLEET_PORT + i``, its engine on ``DEMO_FLEET_PORT + 100 + i``
(9101, 9102 and 9201, 9202 by default). Tokens live in ``var/demo-fleet/<host>/token`` (0600).
"""

from __future__ import annotations

import ctypes
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from hosts.choices import OperationKind
from hosts.models import Deployment, Host
from hosts.services.checks import request_host_check
from hosts.services.operations import OperationRefused, request_operation

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class DemoHost:
    name: str
    simulate: str  # the agent's --simulate: GPU key and count
    gpu_key: str
    gpus: int
    price: str
    deployment: str
    engine: str
    engine_version: str
    model: str
    versions: tuple[dict, ...]  # settings of config v1, v2, …
    notes: tuple[str, ...] = ()  # each version's note (seed_demo's default when missing)


FLEET = (
    DemoHost(
        "sim-h100-01",
        "h100-sxm:2",
        "h100-sxm",
        2,
        "9.80",
        "llama-8b",
        "vllm",
        "0.11.0",
        "meta-llama/Llama-3.1-8B-Instruct",
        (
            {"gpu_memory_utilization": 0.9, "max_num_seqs": 256, "max_model_len": 8192},
            {
                "gpu_memory_utilization": 0.9,
                "max_num_seqs": 512,
                "max_num_batched_tokens": 8192,
                "max_model_len": 8192,
            },
            # What a team does after a latency complaint without measuring first (DOMAIN §5):
            # cap the batch for steadier inter-token latency. It holds at the chat profile's
            # low and normal stages, and at its peak (48 users) it is the bottleneck the
            # advisor finds: requests queue at the cap while the KV cache is nearly empty.
            {
                "gpu_memory_utilization": 0.9,
                "max_num_seqs": 32,
                "max_num_batched_tokens": 8192,
                "max_model_len": 8192,
            },
        ),
        (
            "demo: initial settings",
            "demo: larger batches",
            "demo: cap the batch at 32 sequences for steadier ITL",
        ),
    ),
    DemoHost(
        "sim-a100-01",
        "a100-80g:1",
        "a100-80g",
        1,
        "3.67",
        "qwen-7b",
        "sglang",
        "0.5.3",
        "Qwen/Qwen2.5-7B-Instruct",
        ({"mem_fraction_static": 0.85, "max_running_requests": 256, "enable_metrics": True},),
    ),
)


def base_port() -> int:
    return int(os.environ.get("DEMO_FLEET_PORT", "9101"))


def agent_port(index: int) -> int:
    return base_port() + index


def engine_port(index: int) -> int:
    return base_port() + 100 + index


def token_for(var_dir: Path, host: DemoHost) -> str:
    """The agent's token, made once and kept private."""
    path = var_dir / "demo-fleet" / host.name / "token"
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    path.touch(mode=0o600)
    path.write_text(token)
    return token


def _die_with_parent() -> None:
    """In the agent, before exec: get SIGTERM when the panel dies, however it dies, so no
    demo agent (and so no simulated engine: the agent stops them) outlives it (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class DemoFleet:
    """Starts and stops the demo agents (child processes of the panel)."""

    def __init__(self, var_dir: Path):
        self.var_dir = var_dir
        self.procs: list[subprocess.Popen] = []

    def start(self, timeout: float = 30) -> None:
        for index, host in enumerate(FLEET):
            token_for(self.var_dir, host)
            home = self.var_dir / "demo-fleet" / host.name
            logfile = (home / "agent.log").open("ab")
            proc = subprocess.Popen(  # noqa: S603 - our own argv, no shell
                [
                    sys.executable,
                    "-m",
                    "hosts.agent",
                    "--listen",
                    f"127.0.0.1:{agent_port(index)}",
                    "--token-file",
                    str(home / "token"),
                    "--state-dir",
                    str(home / "state"),
                    "--simulate",
                    host.simulate,
                    # The demo's engines end with the panel that started them.
                    "--stop-engines-on-exit",
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=logfile,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - no threads touched before exec
            )
            self.procs.append(proc)
            self._await_listening(proc, host, logfile, timeout)
        log.info("demo fleet: %d agents started", len(self.procs))

    def _await_listening(self, proc, host, logfile, timeout) -> None:
        found = threading.Event()

        def pump():
            for line in proc.stdout:
                if b"agent listening on" in line:
                    found.set()
                logfile.write(line)
                logfile.flush()

        threading.Thread(target=pump, name=f"demo-agent-{host.name}", daemon=True).start()
        deadline = time.monotonic() + timeout
        while not found.wait(0.1):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the demo agent of {host.name} did not start (see "
                    f"{self.var_dir / 'demo-fleet' / host.name / 'agent.log'})"
                )

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()  # the agent stops its engines
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()


def bring_up() -> None:
    """After the worker runs: read each demo host's inventory and start its engine (an
    apply of the deployment's active config, through the agent, like any other)."""
    names = [host.name for host in FLEET]
    for host in Host.objects.filter(name__in=names):
        request_host_check(None, host)
    deployments = Deployment.objects.filter(host__name__in=names, runner="simulator")
    for deployment in deployments.select_related("active_config"):
        if deployment.active_config is None or deployment.active_operation() is not None:
            continue
        try:
            request_operation(None, deployment, OperationKind.APPLY, deployment.active_config)
        except OperationRefused as exc:
            log.warning("demo: %s", exc)
