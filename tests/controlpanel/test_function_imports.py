"""Issue 39, "seams, not lengths": no project module is imported inside a function unless a
comment there says why (a cycle that cannot be cut, a heavy import only one path needs, Django's
app registry). A late import without a reason usually hides a file cut in two."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("controlpanel", "hosts", "benchmarks", "changes", "scaling", "api", "home")


def project_import(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] in PACKAGES
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] in PACKAGES for alias in node.names)
    return False


def unexplained(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    found = []
    imports = {  # every line an import statement covers (0-based)
        line
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for line in range(node.lineno - 1, node.end_lineno)
    }
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if not project_import(node):
                continue
            # The reason: a comment on the import's line, or above its group of imports.
            here = lines[node.lineno - 1]
            above = node.lineno - 2
            while above >= 0 and above in imports:
                above -= 1
            said = "#" in here or (above >= 0 and lines[above].strip().startswith("#"))
            if not said:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {here.strip()}")
    return found


def test_every_late_project_import_says_why():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                found += unexplained(path)
    assert found == [], "\n".join(found)


def test_the_check_sees_an_unexplained_late_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f():\n    from hosts.models import Host\n    return Host\n\n"
        "def g():\n    # heavy: only this path needs it\n    from hosts.models import Gpu\n"
        "    return Gpu\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert unexplained(sample) == ["sample.py:2: from hosts.models import Host"]
    finally:
        ROOT = saved
