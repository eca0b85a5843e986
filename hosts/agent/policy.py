"""What the agent agrees to execute: an allow-list of programs, the two CPU-placement wrappers,
and an environment without secrets or loader hooks.

The panel sends a LaunchConfig, not a command line, and hosts.engines.launch already refuses
values that could smuggle a flag. The agent checks again on its own side because it is the one
holding the process table: whoever gets the token should still only be able to start an
inference engine, not an arbitrary program.

Allow-list entries are a program (a name looked up on the agent's PATH, or an absolute path)
optionally followed by arguments that must come right after it: ``vllm`` allows any ``vllm``
command line, ``python3 -m sglang.launch_server`` allows python3 only for that module.

The same on the environment and the flags: a config may set only the variables named in
hosts.engines.launch's list (checked here again on the rendered environment), and flags that
make the engine load code (``--trust-remote-code``) are refused unless the agent was started
with ``--allow-code-loading``: a stolen token or a careless panel cannot turn them on.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from hosts.engines import ENGINES, redaction
from hosts.engines.environment import env_problem

ENGINE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


def default_allow_list() -> list[tuple[str, ...]]:
    """vLLM's CLI, SGLang's server module (under the usual interpreter names and the agent's
    own interpreter, which is what the launch renderer is given), and the simulator run by the
    agent's own interpreter (so its ``hosts`` package is the one imported)."""
    entries: list[tuple[str, ...]] = [("vllm",)]
    for python in ("python3", "python", sys.executable):
        entries.append((python, "-m", "sglang.launch_server"))
    entries.append((sys.executable, "-m", "hosts.simulator"))
    return entries


class ExecRefused(ValueError):
    """The rendered command must not run here; ``str()`` says why, for the operator."""


# CPU lists, node lists and hex masks: all a placement wrapper needs, nothing that could be
# read as another option or a program.
PLACEMENT_VALUE = re.compile(r"(?:all|[0-9][0-9,\-]*|0x[0-9a-fA-F]+)")
NUMACTL_VALUE_OPTIONS = {
    "--cpunodebind": "-N",
    "--membind": "-m",
    "--physcpubind": "-C",
    "--preferred": "-p",
    "--interleave": "-i",
}
NUMACTL_FLAGS = {"--localalloc", "-l"}
TASKSET_FLAGS = {"-c", "--cpu-list", "-a", "--all-tasks"}

# The agent's own environment may hold the panel's secrets (the embedded demo runs both on one
# machine); engines get none of them. Hugging Face tokens stay: gated models need them. This
# filters what the engine inherits (dropping too much is safe); what a config may set is the
# named list of hosts.engines.launch, and what is masked in logs is hosts.engines.redaction.
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|API_KEY|PRIVATE_KEY", re.IGNORECASE)
KEPT_SECRETS = {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"}
# The engine options that make it run code or read files it names (Flag.loads_code), of every
# engine: rendered values never start with "-", so an argv item equal to one is that option.
CODE_LOADING_OPTIONS = frozenset(
    option
    for module in ENGINES.values()
    for flag in module.SPEC.flags
    if flag.loads_code
    for option in flag.options
)


class ExecPolicy:
    """Checks a rendered argv and resolves its programs to absolute paths."""

    def __init__(
        self,
        entries: Iterable[str | tuple[str, ...]] | None = None,
        *,
        allow_code_loading: bool = False,
    ):
        # Code-loading flags (--trust-remote-code) run code the panel never saw: refused unless
        # whoever runs this host opted in (``--allow-code-loading``), whatever the panel sends.
        self.allow_code_loading = allow_code_loading
        if entries is None:
            self.entries = default_allow_list()
        else:
            self.entries = [
                tuple(shlex.split(e)) if isinstance(e, str) else tuple(e) for e in entries
            ]
            self.entries = [e for e in self.entries if e]
            if not self.entries:
                raise ValueError("the allow-list is empty")

    def describe(self) -> str:
        return ", ".join(" ".join(e) for e in self.entries)

    def check(self, argv: Iterable[str]) -> list[str]:
        """The argv to execute (programs as absolute paths) or ExecRefused."""
        argv = list(argv)
        if not argv:
            raise ExecRefused("the launch config rendered an empty command")
        out: list[str] = []
        rest = argv
        while rest and Path(rest[0]).name in ("numactl", "taskset"):
            consumed = _wrapper_args(rest)
            out += [_resolve(rest[0]), *rest[1:consumed]]
            rest = rest[consumed:]
        if not rest:
            raise ExecRefused(f"{argv[0]} is not followed by a program")
        program = rest[0]
        if not any(self._matches(entry, rest) for entry in self.entries):
            raise ExecRefused(
                f"program {program!r} (command {_short(rest)}) is not on this agent's "
                f"allow-list ({self.describe()}); start the agent with --allow-exec to allow it"
            )
        if not self.allow_code_loading:
            loading = sorted(
                {a.partition("=")[0] for a in rest[1:]} & CODE_LOADING_OPTIONS,
            )
            if loading:
                raise ExecRefused(
                    f"{', '.join(loading)} makes the engine run code that is not the engine's "
                    "(e.g. a model repository's Python): this agent refuses it; start the "
                    "agent with --allow-code-loading to allow it"
                )
        out += [_resolve(program), *rest[1:]]
        return out

    @staticmethod
    def _matches(entry: tuple[str, ...], argv: list[str]) -> bool:
        program, prefix = entry[0], entry[1:]
        if tuple(argv[1 : 1 + len(prefix)]) != prefix:
            return False
        if argv[0] == program:
            return True
        # Names mean "what the agent's PATH gives": an absolute argv[0] matches a name entry
        # only when it is that very file, so /tmp/x/vllm is not "vllm".
        found = shutil.which(argv[0])
        wanted = program if "/" in program else shutil.which(program)
        return bool(found and wanted and os.path.abspath(found) == os.path.abspath(wanted))


def _short(argv: list[str]) -> str:
    text = " ".join(shlex.quote(a) for a in mask_argv(argv[:4]))
    return text + (" …" if len(argv) > 4 else "")


def _resolve(program: str) -> str:
    found = shutil.which(program)
    if not found:
        where = "" if "/" in program else " on the agent's PATH"
        raise ExecRefused(f"{program!r} was not found{where}: is it installed on this host?")
    return os.path.abspath(found)


def _wrapper_args(argv: list[str]) -> int:
    """How many items of ``argv`` the leading numactl/taskset and its options take."""
    name = Path(argv[0]).name
    i = 1
    if name == "taskset":
        while i < len(argv) and argv[i] in TASKSET_FLAGS:
            i += 1
        if i >= len(argv) or not PLACEMENT_VALUE.fullmatch(argv[i]):
            raise ExecRefused(f"taskset needs a CPU list or mask, got {argv[i : i + 1]}")
        return i + 1
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        if arg == "--":
            return i + 1
        if arg in NUMACTL_FLAGS:
            i += 1
            continue
        option, eq, value = arg.partition("=")
        if option in NUMACTL_VALUE_OPTIONS or option in NUMACTL_VALUE_OPTIONS.values():
            if not eq:
                if i + 1 >= len(argv):
                    raise ExecRefused(f"numactl {option} needs a value")
                value = argv[i + 1]
                i += 1
            if not PLACEMENT_VALUE.fullmatch(value):
                raise ExecRefused(f"numactl {option}: {value!r} is not a CPU or node list")
            i += 1
            continue
        raise ExecRefused(f"numactl option {arg!r} is not allowed (only CPU and memory binding)")
    return i


def check_config_env(env: Mapping[str, str]) -> None:
    """Refuse variables that are not on the named list of hosts.engines.launch (the same rule
    the panel applies: the agent does not take the panel's word for it)."""
    problems = [problem for k, v in env.items() if (problem := env_problem(k, v))]
    if problems:
        raise ExecRefused("; ".join(problems))


def child_env(extra: Mapping[str, str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    base = os.environ if base is None else base
    env = {
        k: v
        for k, v in base.items()
        if (k in KEPT_SECRETS or not SECRET_NAME.search(k)) and k not in ("LD_PRELOAD", "LD_AUDIT")
    }
    # Python engines buffer a pipe's output by the block; unbuffered, their last lines (the
    # error) reach the log before they exit.
    env["PYTHONUNBUFFERED"] = "1"
    env.update({str(k): str(v) for k, v in extra.items()})
    return env


def mask_argv(argv: Iterable[str]) -> list[str]:
    """The argv for logs: the values of the flags the engine specs mark secret masked."""
    return redaction.mask_argv(argv)
