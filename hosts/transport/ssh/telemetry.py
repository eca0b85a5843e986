"""Telemetry and inventory of an SSH host: one TELEMETRY_SCRIPT run (``nvidia-smi`` CSV queries
plus ``/proc``), the GPUs' NUMA placement from sysfs, and, on hosts without ``nvidia-smi``, the
readings of the simulated engines of ours that run there (``/simulator/gpus``)."""

from __future__ import annotations

import secrets
import time

from hosts.transport import nvidia_smi, procfs
from hosts.transport.ssh import parsing
from hosts.transport.ssh.parsing import EngineFiles, GpuRows, probe_host
from hosts.transport.ssh.scripts import PCI_SCRIPT, TELEMETRY_SCRIPT, sh
from hosts.transport.ssh.session import SshSession
from hosts.transport.ssh.styles import LaunchStyle


class HostReader:
    """Reads one host's telemetry and inventory over ``session``; ``style`` says whether an
    engine may be up and which CPUs it runs on."""

    def __init__(self, session: SshSession, style: LaunchStyle, nvidia_smi_program: str):
        self.session = session
        self.style = style
        self.nvidia_smi = nvidia_smi_program
        self._numa: dict[str, tuple[int | None, str | None]] = {}  # they do not move: cached

    def telemetry(self) -> dict:
        now = time.time()
        values, engines = self._sample(inventory=False)
        smi = parsing.gpu_rows(values, self.session.address)
        source, note, gpus = smi.source, smi.note, []
        if smi.source == "nvidia-smi":
            self._pci_numa(smi.rows)
            for row in smi.rows:
                node, cpus = self._gpu_numa(row)
                processes = smi.apps.get(row.get("uuid"), [])
                gpus.append(
                    nvidia_smi.telemetry_gpu(
                        row, processes=processes, numa_node=node, cpu_affinity=cpus
                    )
                )
        elif simulated := self._simulator_gpus(engines):
            source = "simulator"
            note = f"{note}; readings from the simulated engines running there"
            gpus = [parsing.from_simulator(reading) for reading in simulated]
        return {
            "time": now,
            "source": source,
            "note": note,
            "gpus": gpus,
            "host": parsing.host_readings(values),
            "engines": self._engines_summary(engines),
        }

    def inventory(self) -> dict:
        values, engines = self._sample(inventory=True)
        smi = parsing.gpu_rows(values, self.session.address)
        inventory = {**parsing.host_inventory(values), "source": smi.source, "note": smi.note}
        if smi.source == "nvidia-smi":
            self._nvidia_inventory(inventory, smi, values)
        elif simulated := self._simulator_gpus(engines):
            inventory["source"] = "simulator"
            inventory["note"] = f"{smi.note}; GPUs of the simulated engines running there"
            inventory["gpus"] = [
                nvidia_smi.inventory_gpu(
                    g, numa_node=g.get("numa_node"), cpu_affinity=g.get("cpu_affinity")
                )
                for g in simulated
            ]
        return inventory

    def _nvidia_inventory(self, inventory: dict, smi: GpuRows, values: dict) -> None:
        self._pci_numa(smi.rows)
        inventory["driver_version"] = next(
            (row["driver_version"] for row in smi.rows if row.get("driver_version")), None
        )
        inventory["cuda_version"] = nvidia_smi.cuda_version(values.get("smi", ""))
        for row in smi.rows:
            node, cpus = self._gpu_numa(row)
            inventory["gpus"].append(
                nvidia_smi.inventory_gpu(row, numa_node=node, cpu_affinity=cpus)
            )

    def simulators(self, engines: dict[str, EngineFiles]) -> list[EngineFiles]:
        """Our engines that run the simulator and may be up, for hosts without GPUs."""
        return [
            files
            for files in engines.values()
            if (files.config or {}).get("runner") == "simulator" and self.style.may_be_up(files)
        ]

    def _sample(self, inventory: bool) -> tuple[dict, dict[str, EngineFiles]]:
        marker = "@@" + secrets.token_hex(8)
        script = sh(
            TELEMETRY_SCRIPT,
            marker,
            self.nvidia_smi,
            nvidia_smi.query_gpu_argv()[1],
            nvidia_smi.query_gpu_argv(legacy=True)[1],
            nvidia_smi.query_apps_argv()[1],
            nvidia_smi.CSV_FORMAT,
            self.session.remote_dir(),
            "inventory" if inventory else "",
        )
        result = self.session.run(script, what="reading telemetry")
        found = parsing.sections(result.out, marker)
        return dict(found), parsing.engine_files(found)

    def _pci_numa(self, rows: list[dict]) -> None:
        """Learn the NUMA node and local CPU list of each GPU not seen before, from sysfs."""
        wanted = {
            address
            for row in rows
            if (address := nvidia_smi.sysfs_pci_address(row.get("pci_bus_id")))
            and address not in self._numa
        }
        if wanted:
            marker = "@@" + secrets.token_hex(8)
            result = self.session.run(sh(PCI_SCRIPT, marker, *sorted(wanted)), what="reading sysfs")
            self._numa.update(parsing.pci_numa(result.out, marker))

    def _gpu_numa(self, row: dict) -> tuple[int | None, str | None]:
        address = nvidia_smi.sysfs_pci_address(row.get("pci_bus_id"))
        return self._numa.get(address, (None, None)) if address else (None, None)

    def _simulator_gpus(self, engines: dict[str, EngineFiles]) -> list[dict]:
        readings: dict[str, dict] = {}
        for files in self.simulators(engines):
            launch = files.launch()
            if launch is None:
                continue
            host = probe_host(launch.host)
            answer = self.session.http_get(launch.port, "/simulator/gpus", host=host)
            if answer is None or answer[0] != 200:
                continue
            for gpu in parsing.simulator_gpus(answer[1]):
                # Engines simulating the same GPU model report the same uuids: one reading each.
                readings.setdefault(str(gpu.get("uuid")), gpu)
        return list(readings.values())

    def _engines_summary(self, engines: dict[str, EngineFiles]) -> dict:
        summary = {}
        for name, files in engines.items():
            status = self.style.status(name, files)
            cpus = None
            if status.alive:
                state = "ready" if files.state.get("ready_at") else "starting"
                cpus = self.style.cpus(files, status.pid)
            else:
                state = "failed" if files.state.get("error") else status.state
            summary[name] = {
                "state": state,
                "pid": status.pid,
                "cpu_affinity": procfs.parse_cpulist(cpus) if cpus else None,
            }
        return summary
