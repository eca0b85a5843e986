"""A simulated fleet in one process: ``python -m hosts.agent.fleet --hosts 500 --gpus 8``.

Each simulated host is an agent on a port of its own (``--base-port`` + i), so the panel
reaches it through its real agent transport, unchanged (one address and port per host, the
bearer token, ``/v1/info``, ``/v1/inventory``, ``/v1/telemetry``). 500 real agent processes
would cost 500 Python interpreters; one asyncio loop serving 500 listening sockets costs one.

It lives under ``hosts/agent/`` because it is the agent's API and the agent's simulated GPUs
(``SimulatedGpus``: the same UUIDs, names and idle readings as ``--simulate``) with values
that change every second, nothing of Django. Only the read-only endpoints exist: engines are
not supervised here (every host reports none).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import math
import random
import time

from hosts.agent.host import host_readings
from hosts.agent.nvml import decode_reasons
from hosts.agent.simulated import SimulatedGpus, parse_simulate

log = logging.getLogger("hosts.agent.fleet")

AGENT_VERSION = "fleet-sim"
MAX_REQUEST_BYTES = 16384


class FleetHost:
    """One simulated host: its GPUs and readings that drift with time (a slow sine per GPU
    plus noise), so the panel's charts and aggregates see real variation."""

    def __init__(self, number: int, simulate: str):
        spec, count = parse_simulate(simulate)
        self.name = f"fleet-{number:04d}"
        self.gpus = SimulatedGpus(spec, count, seed=self.name)
        self.phase = [
            random.Random(f"{self.name}:{i}").random() * 6.28  # noqa: S311
            for i in range(count)
        ]

    def inventory_gpus(self) -> list[dict]:
        return self.gpus.inventory_gpus()

    def readings(self, now: float) -> list[dict]:
        spec = self.gpus.spec
        out = []
        for i in range(self.gpus.count):
            item = self.gpus.idle(i)
            load = 0.5 + 0.5 * math.sin(now / 60.0 + self.phase[i])  # 0..1, a ~6 min cycle
            util = max(0.0, min(100.0, 100 * load + random.uniform(-3, 3)))  # noqa: S311 (noise)
            reasons = 0x4 if load > 0.9 else (0x1 if load < 0.05 else 0)
            item.update(
                utilization_gpu_pct=round(util, 1),
                memory_used_bytes=int(spec.memory_bytes * (0.1 + 0.8 * load)),
                power_w=round(spec.idle_watts + (spec.tdp_watts - spec.idle_watts) * load, 1),
                temperature_c=round(31 + 45 * load + random.uniform(-0.5, 0.5), 1),  # noqa: S311
                sm_clock_mhz=int(345 + (spec.max_sm_clock_mhz - 345) * min(1.0, load * 1.2)),
                clocks_event_reasons=reasons,
                throttle_reasons=decode_reasons(reasons),
                pcie_tx_kbps=round(40 + 2e6 * load, 1),
                pcie_rx_kbps=round(1e6 * load, 1),
            )
            out.append(item)
        return out


class Fleet:
    """Every host, the shared token, and the host readings (this machine's, refreshed once a
    second for all: psutil per request would cost more than the simulated GPUs)."""

    def __init__(self, hosts: int, simulate: str, token: str):
        self.hosts = [FleetHost(i, simulate) for i in range(hosts)]
        self.token = token.encode()
        self._host_readings: tuple[float, dict] = (0.0, {})

    def host_readings(self) -> dict:
        at, value = self._host_readings
        if time.monotonic() - at > 1.0:
            value = host_readings()
            self._host_readings = (time.monotonic(), value)
        return value

    def answer(self, number: int, path: str) -> tuple[int, dict]:
        host = self.hosts[number]
        if path == "/v1/telemetry":
            now = time.time()
            return 200, {
                "time": now,
                "source": "simulator",
                "note": f"fleet simulator ({host.gpus.count} × {host.gpus.spec.nvml_name})",
                "gpus": host.readings(now),
                "host": self.host_readings(),
                "engines": {},
            }
        if path == "/v1/inventory":
            return 200, {
                "hostname": host.name,
                "driver_version": None,
                "cuda_version": None,
                "source": "simulator",
                "note": "fleet simulator",
                "gpus": host.inventory_gpus(),
            }
        if path == "/v1/info":
            return 200, {
                "agent_version": AGENT_VERSION,
                "hostname": host.name,
                "telemetry_source": "simulator",
                "detail": "fleet simulator",
                "libraries": {},
            }
        return 404, {"error": f"no route {path}"}

    async def serve_connection(self, number: int, reader, writer) -> None:
        """HTTP/1.1 with keep-alive (the panel's pooled client reuses its connection)."""
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if len(head) > MAX_REQUEST_BYTES:
                    break
                lines = head.decode("latin-1").split("\r\n")
                method, path, _version = (lines[0].split(" ") + ["", ""])[:3]
                headers = {}
                for line in lines[1:]:
                    key, _, value = line.partition(":")
                    headers[key.strip().lower()] = value.strip()
                length = int(headers.get("content-length") or 0)
                if length:
                    await reader.readexactly(length)
                given = headers.get("authorization", "").removeprefix("Bearer ").encode()
                if not hmac.compare_digest(given, self.token):
                    status, body = 401, {"error": "a valid bearer token is required"}
                elif method != "GET":
                    status, body = 405, {"error": "read-only fleet simulator"}
                else:
                    status, body = self.answer(number, path.split("?")[0])
                data = json.dumps(body).encode()
                reason = {200: "OK", 401: "Unauthorized", 404: "Not Found"}.get(status, "Error")
                writer.write(
                    f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(data)}\r\n\r\n".encode()
                    + data
                )
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()


async def serve(fleet: Fleet, bind: str, base_port: int) -> None:
    servers = []
    for number in range(len(fleet.hosts)):

        async def handle(reader, writer, number=number):
            await fleet.serve_connection(number, reader, writer)

        servers.append(await asyncio.start_server(handle, bind, base_port + number))
    log.info("%d simulated hosts on %s:%d-%d", len(servers), bind, base_port, base_port + number)
    print(f"ready {len(servers)} hosts", flush=True)  # scripts wait for this line
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Many simulated host agents in one process.")
    parser.add_argument("--hosts", type=int, default=500)
    parser.add_argument("--gpus", default="h100-sxm:8", help="GPU model and count per host")
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--base-port", type=int, default=20000)
    parser.add_argument("--token", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(serve(Fleet(args.hosts, args.gpus, args.token), args.bind, args.base_port))


if __name__ == "__main__":
    main()
