"""The import-linter contracts in pyproject.toml: the real tree keeps them, and they bite.

The second half copies the real contracts onto a throw-away tree with the same module names, so
a contract that silently matched nothing (a renamed package, a typo) would fail here too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXTERNAL = {"django", "celery", "channels"}


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the pyproject.toml in ``cwd``, as CI runs it."""
    command = [str(Path(sys.executable).with_name("lint-imports")), "--no-cache", "--no-logo"]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)  # noqa: S603


def real_config() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["importlinter"]


def contract(config: dict, contract_id: str) -> dict:
    return next(c for c in config["contracts"] if c["id"] == contract_id)


def named_modules(config: dict) -> set[str]:
    """Every project module the contracts name (layers, sources, targets, ignored imports)."""
    names = set(config["root_packages"])
    for c in config["contracts"]:
        names.update(c.get("layers", ()))
        names.update(c.get("source_modules", ()))
        names.update(c.get("forbidden_modules", ()))
        for rule in c.get("ignore_imports", ()):
            names.update(part.strip() for part in rule.split("->"))
    return {n for n in names if n.split(".")[0] not in EXTERNAL}


def write_module(root: Path, name: str, body: str = "") -> None:
    """``name`` as a package (every level gets an __init__), ``body`` appended to its own."""
    path = root
    for part in name.split("."):
        path = path / part
        path.mkdir(exist_ok=True)
        (path / "__init__.py").touch()
    with open(path / "__init__.py", "a") as f:
        f.write(body)


def throwaway_tree(tmp_path: Path, violations: dict[str, str]) -> Path:
    """A tree with every module the real contracts name, the real contracts, and the imports
    of ``violations`` (module -> source lines) added; the stated exceptions are mirrored."""
    config = real_config()
    for name in sorted(named_modules(config)):
        write_module(tmp_path, name)
    for c in config["contracts"]:
        for rule in c.get("ignore_imports", ()):
            importer, imported = (part.strip() for part in rule.split("->"))
            write_module(tmp_path, importer, f"import {imported}\n")
    for name, body in violations.items():
        write_module(tmp_path, name, body)
    # JSON strings, lists and booleans are valid TOML values.
    lines = ["[tool.importlinter]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in config.items() if key != "contracts"]
    for c in config["contracts"]:
        lines.append("[[tool.importlinter.contracts]]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in c.items()]
    (tmp_path / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_the_project_keeps_its_layers():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_clean_copy_keeps_every_contract(tmp_path):
    # The control for the next test: the throw-away tree itself breaks nothing.
    result = lint_imports(throwaway_tree(tmp_path, {}))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(real_config()['contracts'])} kept, 0 broken" in result.stdout


def test_contracts_bite(tmp_path):
    config = real_config()
    tree = throwaway_tree(
        tmp_path,
        {
            "hosts.models": "import changes.models\n",  # an app importing upward
            # Inside a function counts too.
            "hosts.engines": "def later():\n    from django.conf import settings\n",
            "benchmarks.loadgen": "import celery\n",
            "hosts.agent": "from hosts import models\n",  # the agent reaching the panel side
            "hosts.engines.launch": "import hosts.simulator\n",  # the foundation reaching up
        },
    )
    result = lint_imports(tree)
    out = " ".join(result.stdout.split())  # the report wraps long names
    assert result.returncode == 1, out
    assert f"0 kept, {len(config['contracts'])} broken" in out
    for contract_id in ("layers", "pure", "engines", "agent"):
        assert f"{contract(config, contract_id)['name']} BROKEN" in out
    assert "hosts.models -> changes" in out
    assert "hosts.engines -> django" in out
    assert "benchmarks.loadgen -> celery" in out
    assert "hosts.agent -> hosts.models" in out
    assert "hosts.engines.launch -> hosts.simulator" in out


@pytest.mark.parametrize("module", ["hosts", "benchmarks", "changes"])
def test_the_base_app_imports_no_other_app(tmp_path, module):
    # Beyond the stated exception (the ASGI entry point), controlpanel reaches no app above it.
    tree = throwaway_tree(tmp_path, {"controlpanel.views": f"import {module}\n"})
    result = lint_imports(tree)
    out = " ".join(result.stdout.split())
    assert result.returncode == 1 and f"controlpanel.views -> {module}" in out, out


def test_the_manual_lists_the_pure_packages_the_contract_checks():
    """The ground floor a newcomer reads (docs/architecture.md) is the one the machine checks:
    a package made pure (or no longer) changes both, or this fails."""
    root = Path(__file__).resolve().parents[2]
    contracts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]
    pure = next(c for c in contracts["contracts"] if c["id"] == "pure")["source_modules"]
    page = (root / "docs" / "architecture.md").read_text()
    section = page.split("## The ground floor: pure packages", 1)[1].split("\n## ", 1)[0]
    listed = [line[3:-1] for line in section.splitlines() if line.startswith("- `")]
    assert sorted(listed) == sorted(pure)
