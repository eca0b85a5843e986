"""A host's inventory: its ``Gpu`` rows and machine facts, from what the host reported."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from hosts.choices import HostStatus
from hosts.models import Gpu, Host
from hosts.services.hosts import set_status


def refresh_inventory(host: Host, inventory: dict) -> list[Gpu]:
    """Create or update the host's ``Gpu`` rows and facts from what the host reported.
    GPUs are matched by UUID (a GPU moved to another slot keeps its history); GPUs the host
    no longer reports are kept (their samples are history) but lose their index claim."""
    with transaction.atomic():
        host = Host.objects.select_for_update().get(pk=host.pk)
        seen = [_store_gpu(host, item) for item in inventory.get("gpus") or []]
        _store_facts(host, inventory)
    set_status(host, HostStatus.ONLINE)
    return seen


def _store_gpu(host: Host, item: dict) -> Gpu:
    uuid = str(item.get("uuid") or f"{host.name}-gpu{item['index']}")[:64]
    gpu = Gpu.objects.filter(uuid=uuid).first()
    # The slot may still be held by a GPU that was swapped out: free it.
    Gpu.objects.filter(host=host, index=item["index"]).exclude(uuid=uuid).delete()
    if gpu is None:
        gpu = Gpu(uuid=uuid)
    gpu.host = host
    gpu.index = item["index"]
    gpu.name = (item.get("name") or "unknown GPU")[:100]
    gpu.memory_bytes = int(item.get("memory_total_bytes") or 0)
    gpu.numa_node = item.get("numa_node")
    gpu.cpu_affinity = (item.get("cpu_affinity") or "")[:200]
    gpu.save()
    return gpu


def _store_facts(host: Host, inventory: dict) -> None:
    host.hostname = (inventory.get("hostname") or "")[:255]
    host.driver_version = (inventory.get("driver_version") or "")[:40]
    host.cuda_version = (inventory.get("cuda_version") or "")[:40]
    host.cpu_count = inventory.get("cpu_count")
    host.cpu_model = (inventory.get("cpu_model") or "")[:200]
    host.memory_total_bytes = inventory.get("memory_total_bytes")
    host.numa_nodes = inventory.get("numa_nodes") or []
    host.telemetry_source = (inventory.get("source") or "")[:20]
    host.telemetry_note = (inventory.get("note") or "")[:300]
    host.inventory_at = timezone.now()
    host.save(
        update_fields=[
            "hostname",
            "driver_version",
            "cuda_version",
            "cpu_count",
            "cpu_model",
            "memory_total_bytes",
            "numa_nodes",
            "telemetry_source",
            "telemetry_note",
            "inventory_at",
        ]
    )
