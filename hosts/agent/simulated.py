"""Simulated GPUs for hosts without NVML (``--simulate h100-sxm:2``): the demo fleet and tests.

A GPU that a running simulator engine holds reports that engine's own readings (memory it
reserved, utilisation, power, clocks — ``GET /simulator/gpus``, see hosts.simulator.telemetry);
the others report idle readings built from the catalog. Identity (name, UUID, total memory) is
always the agent's, so a GPU keeps its UUID whichever engine runs on it.
"""

from __future__ import annotations

import logging
import uuid

import httpx

from hosts.agent.host import numa_nodes
from hosts.agent.nvml import decode_reasons
from hosts.engines.catalog import GPUS, GpuSpec

log = logging.getLogger("hosts.agent.simulated")

IDLE_USED_BYTES = 256 * 2**20  # what an idle driver shows on a GPU (the simulator's figure)
IDLE_SM_CLOCK_MHZ = 345
IDLE_REASON = 0x1


def parse_simulate(value: str) -> tuple[GpuSpec, int]:
    """``"h100-sxm:2"`` → (spec, 2); ValueError naming the choices otherwise."""
    key, _, count = value.partition(":")
    if key not in GPUS:
        raise ValueError(f"unknown GPU {key!r} (choose from {', '.join(sorted(GPUS))})")
    try:
        number = int(count) if count else 1
    except ValueError:
        raise ValueError(f"bad GPU count {count!r}") from None
    if not 1 <= number <= 64:
        raise ValueError("the GPU count must be between 1 and 64")
    return GPUS[key], number


class SimulatedGpus:
    """``count`` GPUs of one catalog model. ``seed`` makes the UUIDs this host's own (several
    simulated hosts run side by side in the demo, and the panel tells GPUs apart by UUID)."""

    def __init__(self, spec: GpuSpec, count: int, seed: str):
        self.spec = spec
        self.count = count
        self.uuids = [
            f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'hosts-agent:{seed}:{spec.key}:{i}')}"
            for i in range(count)
        ]
        nodes = numa_nodes() or [{"node": 0, "cpus": None}]
        # Spread GPUs over the host's real NUMA nodes in order, the way boards usually wire
        # them (first half on node 0, …), so placement advice works against real CPU lists.
        per_node = max(1, -(-count // len(nodes)))
        self.nodes = [nodes[min(i // per_node, len(nodes) - 1)] for i in range(count)]

    def idle(self, index: int) -> dict:
        spec = self.spec
        return {
            "index": index,
            "uuid": self.uuids[index],
            "name": spec.nvml_name,
            "memory_total_bytes": spec.memory_bytes,
            "memory_used_bytes": IDLE_USED_BYTES,
            "utilization_gpu_pct": 0,
            "utilization_memory_pct": 0,
            "temperature_c": 31,
            "power_w": float(spec.idle_watts),
            "power_limit_w": float(spec.tdp_watts),
            "sm_clock_mhz": IDLE_SM_CLOCK_MHZ,
            "max_sm_clock_mhz": spec.max_sm_clock_mhz,
            "mem_clock_mhz": spec.max_mem_clock_mhz,
            "max_mem_clock_mhz": spec.max_mem_clock_mhz,
            "clocks_event_reasons": IDLE_REASON,
            "throttle_reasons": decode_reasons(IDLE_REASON),
            "pcie_tx_kbps": 40,
            "pcie_rx_kbps": 0,
            "numa_node": self.nodes[index]["node"],
            "cpu_affinity": self.nodes[index]["cpus"],
            "ecc_corrected": 0,
            "ecc_uncorrected": 0,
            "processes": [],
            "missing": [],
        }

    def inventory_gpus(self) -> list[dict]:
        keys = ("index", "uuid", "name", "memory_total_bytes", "numa_node", "cpu_affinity")
        return [{k: self.idle(i)[k] for k in keys} for i in range(self.count)]

    def gpus(self, engines: list[dict]) -> list[dict]:
        """Readings for every GPU. ``engines``: running simulator engines as ``{"name", "pid",
        "url", "gpu_indices"}`` (host GPU indices the engine holds, in its device order)."""
        readings = [self.idle(i) for i in range(self.count)]
        covered: set[int] = set()
        for engine in engines:
            try:
                response = httpx.get(engine["url"] + "/simulator/gpus", timeout=1.0)
                response.raise_for_status()
                sim = response.json()["gpus"]
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                log.debug("engine %s gave no GPU readings: %s", engine["name"], exc)
                continue
            for position, host_index in enumerate(engine["gpu_indices"]):
                if position >= len(sim) or not 0 <= host_index < self.count:
                    continue
                self._merge(readings[host_index], sim[position], host_index in covered)
                readings[host_index]["processes"].append(
                    {
                        "pid": engine["pid"],
                        "used_memory_bytes": sim[position].get("memory_used_bytes"),
                    }
                )
                covered.add(host_index)
        return readings

    def _merge(self, reading: dict, sim: dict, shared: bool) -> None:
        """Take the engine's dynamic values; two engines on one GPU add their memory and the
        busier one sets the rest."""
        used = int(sim.get("memory_used_bytes") or 0)
        if shared:
            reading["memory_used_bytes"] = min(
                reading["memory_used_bytes"] + used, reading["memory_total_bytes"]
            )
            if (sim.get("utilization_gpu_pct") or 0) <= reading["utilization_gpu_pct"]:
                return
        else:
            reading["memory_used_bytes"] = min(used, reading["memory_total_bytes"])
        for key in (
            "utilization_gpu_pct",
            "utilization_memory_pct",
            "temperature_c",
            "power_w",
            "sm_clock_mhz",
            "mem_clock_mhz",
            "clocks_event_reasons",
            "pcie_tx_kbps",
            "pcie_rx_kbps",
        ):
            if sim.get(key) is not None:
                reading[key] = sim[key]
        reading["throttle_reasons"] = decode_reasons(reading["clocks_event_reasons"])
