"""The fleet as a list: which hosts match the hosts list's filters (name, status, GPU model,
labels) and the rows one page shows, in the same few queries whatever the fleet's size
(issue 22: 500 hosts x 8 GPUs made the unpaginated list take 4.6 s and 719 KiB).

The filters mean what the API's ``/api/v1/hosts/`` filters mean: ``q`` and ``gpu`` are
case-insensitive "contains", a label term is ``key`` (the host has the label) or
``key=value``, and several terms must all hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count, Exists, OuterRef, Prefetch, TextField
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from hosts.choices import HostStatus
from hosts.credentials import SECRET_FIELDS
from hosts.models import Gpu, Host

PAGE_SIZE = 50
# A status filter of its own: every red badge at once (unreachable, credentials refused, ...),
# what the dashboard's "needs my attention" card lists and links on to.
TROUBLE = "trouble"
TROUBLED = tuple(status.value for status in HostStatus if status.colour == "red")
# What a row never shows stays in the database: the credentials (each decrypted per row when
# read) and the inventory's larger JSON.
NOT_SHOWN = (*SECRET_FIELDS, "libraries", "host_readings", "numa_nodes", "credential_bindings")


@dataclass(frozen=True)
class HostFilter:
    """What the list is narrowed to; empty fields narrow nothing."""

    q: str = ""
    status: str = ""  # a HostStatus value, TROUBLE, or "" for any
    gpu: str = ""
    labels: tuple[tuple[str, str | None], ...] = ()  # (key, value or None for "has the key")

    @property
    def active(self) -> bool:
        return bool(self.q or self.status or self.gpu or self.labels)


def filter_hosts(hosts, chosen: HostFilter):
    if chosen.q:
        hosts = hosts.filter(name__icontains=chosen.q)
    if chosen.status == TROUBLE:
        hosts = hosts.filter(status__in=TROUBLED)
    elif chosen.status:
        hosts = hosts.filter(status=chosen.status)
    if chosen.gpu:
        # EXISTS rather than a join: a host with eight matching GPUs stays one row, no DISTINCT.
        gpus = Gpu.objects.filter(host=OuterRef("pk"), name__icontains=chosen.gpu)
        hosts = hosts.filter(Exists(gpus))
    return with_labels(hosts, chosen.labels)


def with_labels(hosts, labels):
    for n, (key, value) in enumerate(labels):
        if value is None:
            hosts = hosts.filter(labels__has_key=key)
            continue
        # A transform, not ``labels__<key>``: a key such as "contains" must stay a key; cast
        # so the comparison is of text (the JSON key lookups would parse the value as JSON).
        alias = f"_label_{n}"
        text = Cast(KeyTextTransform(key, "labels"), TextField())
        hosts = hosts.alias(**{alias: text}).filter(**{alias: value})
    return hosts


def list_rows():
    """Hosts with what a row of the list shows: deployments counted by the database, GPUs
    by one prefetch for the whole page."""
    return (
        Host.objects.defer(*NOT_SHOWN)
        .annotate(deployment_count=Count("deployments"))
        .prefetch_related(Prefetch("gpus", queryset=Gpu.objects.order_by("index")))
        .order_by("name")
    )


def gpu_models() -> list[str]:
    """The GPU models in the fleet (a handful, however many GPUs): the filter's suggestions."""
    return list(Gpu.objects.order_by("name").values_list("name", flat=True).distinct())
