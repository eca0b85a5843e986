"""The launch part of a proposal beside the flags: its environment as text (one NAME=value a
line, secret values never shown) and its CPU placement checked against what the host has.

The launch rules themselves (which variables, which values, what a CPU list looks like) are
``hosts.engines.launch``'s, asked by ``ProposeForm.clean`` through the same
``Deployment.launch_config(...).validated()`` the apply runs; this module adds only what those
pure rules cannot know: the secrets already stored, and the host's NUMA nodes and CPUs."""

from __future__ import annotations

import re

from django import forms
from django.core.exceptions import ValidationError

from hosts.engines import cpulist
from hosts.engines.redaction import MASK, is_secret
from hosts.models import Host

# How a stored secret stands in the text: the value is never sent to a browser, and this line
# sent back keeps it. Any run of bullets (people type three or four) with or without "(kept)".
KEPT = f"{MASK} (kept)"
KEEP_MARK = re.compile(r"^•+(\s*\(kept\))?$")


# --- the environment as text -----------------------------------------------------------------
def env_text(env: dict) -> str:
    """The text the field shows for an environment, by name (PostgreSQL's jsonb keeps no
    order of its own): secret values as the keep mark."""
    return "\n".join(
        f"{name}={KEPT if is_secret(name) else value}" for name, value in sorted(env.items())
    )


def parse_env(text: str, stored: dict) -> tuple[dict, dict[str, str]]:
    """``(environment, problems by name)`` from the field's text. A secret written as the keep
    mark is the stored value; a problem never quotes a secret's value."""
    env: dict[str, str] = {}
    problems: dict[str, str] = {}
    for number, raw in enumerate((text or "").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name:
            problems[f"line {number}"] = "expected NAME=value"
            continue
        if name in env or name in problems:
            problems[name] = "set twice: give each variable once"
            continue
        if KEEP_MARK.match(value):
            if not is_secret(name) or stored.get(name) is None:
                problems[name] = (
                    f"{MASK} stands for a stored secret, and there is none: type the value"
                )
                continue
            value = stored[name]
        elif is_secret(name) and not value:
            problems[name] = "a secret is not shown again: type its value, or remove the line"
            continue
        env[name] = value
    return env, problems


class EnvTextarea(forms.Textarea):
    """The environment's text, re-shown after an error without any secret's value: a stored
    one as the keep mark, a newly typed one as empty (typed again, like a password)."""

    def __init__(self, stored: dict, attrs=None):
        super().__init__(attrs)
        self.stored = stored

    def format_value(self, value):
        lines = []
        for raw in (value or "").splitlines():
            name, sep, typed = raw.partition("=")
            name, typed = name.strip(), typed.strip()
            if sep and is_secret(name) and not KEEP_MARK.match(typed):
                same = typed and typed == self.stored.get(name)
                raw = f"{name}={KEPT if same else ''}"
            lines.append(raw)
        return super().format_value("\n".join(lines))


def env_field(stored: dict) -> forms.CharField:
    return forms.CharField(
        required=False,
        strip=True,
        label="Environment",
        widget=EnvTextarea(stored, attrs={"rows": 4, "spellcheck": "false"}),
        help_text=(
            "One NAME=value a line; a variable left out is not set. Only variables known to "
            "be safe for an engine are allowed. Secret values (HF_TOKEN, VLLM_API_KEY, …) are "
            f"never shown: {KEPT} keeps the stored value, a new value replaces it (after an "
            "error, type it again)."
        ),
    )


# --- CPU placement on this host --------------------------------------------------------------
def cpu_set(cpus: str) -> set[int]:
    """The CPUs of a CPU list (``0-3,8``); what is not a CPU list, or one beyond the limits,
    gives nothing (the launch rules say why: hosts.engines.cpulist, bounded before it
    expands)."""
    try:
        return set(cpulist.parse(cpus or ""))
    except cpulist.CpuListError:
        return set()


def cpu_list(cpus: set[int]) -> str:
    """A set of CPUs written as a CPU list (``0-3,8``)."""
    return cpulist.format_list(cpus)


def host_nodes(host: Host) -> dict[int, str]:
    """The host's NUMA nodes as it reported them: ``{node: its CPU list}`` ("" unknown)."""
    nodes = {}
    for item in host.numa_nodes or []:
        node = item.get("node") if isinstance(item, dict) else None
        if isinstance(node, int) and not isinstance(node, bool):
            nodes[node] = item.get("cpus") or ""
    return dict(sorted(nodes.items()))


def host_cpus(host: Host) -> set[int]:
    """The host's CPUs: those of its NUMA nodes, else 0 to its CPU count; empty: not known."""
    cpus = set().union(*(cpu_set(c) for c in host_nodes(host).values()))
    if not cpus and host.cpu_count:
        cpus = set(range(host.cpu_count))
    return cpus


def node_choices(host: Host, running: int | None) -> list[tuple[str, str]]:
    choices = [("", "none")]
    nodes = host_nodes(host)
    for node, cpus in nodes.items():
        choices.append((str(node), f"node {node}" + (f" (CPUs {cpus})" if cpus else "")))
    if running is not None and running not in nodes:
        choices.append((str(running), f"node {running} (running; not on this host)"))
    return choices


def host_placement_problems(host: Host, placement: dict, running: dict) -> dict[str, str]:
    """A placement's problems on this host (``placement.numa_node``, ``placement.cpus``): a
    node or CPUs it does not have, named with what it has. Only what the proposal changes is
    checked (a running placement is not refused for what the host reports since). What the
    host has not reported cannot be checked: a new node is refused then (there is nothing to
    choose from), new CPUs pass."""
    errors = {}
    node = placement.get("numa_node")
    nodes = host_nodes(host)
    if node is not None and node != running.get("numa_node") and node not in nodes:
        if nodes:
            have = ", ".join(map(str, nodes))
            plural = "s" if len(nodes) > 1 else ""
            errors["placement.numa_node"] = (
                f"{host.name} has no NUMA node {node}: it has node{plural} {have}"
            )
        else:
            errors["placement.numa_node"] = (
                f"{host.name} has not reported its NUMA nodes yet: check the host first"
            )
    cpus = placement.get("cpus")
    have = host_cpus(host)
    if cpus and cpus != running.get("cpus") and have:
        missing = cpu_set(cpus) - have
        if missing:
            errors["placement.cpus"] = (
                f"{host.name} has no CPU {cpu_list(missing)}: it has CPUs {cpu_list(have)}"
            )
    return errors


def placement_fields(host: Host, running: dict) -> dict[str, forms.Field]:
    node = running.get("numa_node")
    numa = forms.IntegerField(
        required=False,
        label="NUMA node",
        widget=forms.Select(choices=node_choices(host, node)),
        help_text="Bind the engine's CPU work and memory to one NUMA node (numactl), or none.",
    )
    cpus = forms.CharField(
        required=False,
        strip=True,
        max_length=200,
        label="CPUs",
        widget=forms.TextInput(attrs={"placeholder": "e.g. 0-15,32-47", "spellcheck": "false"}),
        help_text="A CPU list to pin the engine to (taskset/numactl); empty: no pinning.",
    )
    numa.initial = node
    cpus.initial = running.get("cpus")
    return {"numa_node": numa, "cpus": cpus}


def field_errors(errors: dict[str, str]) -> dict[str, list[ValidationError]]:
    """Launch-rule errors (``env.NAME``, ``placement.cpus``) as the form's field errors."""
    out: dict[str, list[ValidationError]] = {}
    for key, message in errors.items():
        if key.startswith("env.") or key == "env":
            name = key.removeprefix("env.").removeprefix("env")
            out.setdefault("env", []).append(
                ValidationError(f"{name}: {message}" if name else message)
            )
        elif key in ("placement.numa_node", "placement.cpus"):
            out.setdefault(key.removeprefix("placement."), []).append(ValidationError(message))
        elif key == "placement":
            out.setdefault("cpus", []).append(ValidationError(message))
    return out
