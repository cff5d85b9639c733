"""The package layout of docs/architecture.md: which package may import which, and no circles.

Read from the source (every ``import``, at module level or inside a function), so a lazy import
cannot hide a dependency. ``python -m pytest tests/test_layout.py -q -s`` prints the graph.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

from ops.procs import REPO

# package -> the project packages it may import (tests/ may import anything).
ALLOWED = {
    "modelformat": set(),
    "export": {"modelformat"},
    "modelserver": {"modelformat", "export"},
    "backend": {"modelformat", "export"},  # export: only the in-process transport, see below
    "finetune": {"modelformat", "export", "backend"},
    "ops": {"modelformat", "export", "backend"},
    "benchmarks": {"modelformat", "export", "modelserver", "backend", "finetune", "ops"},
    "scripts": {"modelformat", "export", "modelserver", "backend", "finetune", "ops", "benchmarks"},
}
# The gateway imports TensorFlow-side code only here, and only when GATEWAY_UPSTREAM=local.
GATEWAY_IMPORTS_EXPORT = {"backend.clients.local_client"}


def project_modules() -> dict[str, Path]:
    """Return module name -> file for every package in ALLOWED (generated protos left out)."""
    found = {}
    for package in ALLOWED:
        for path in (REPO / package).rglob("*.py"):
            if path.name.endswith("_pb2.py") or path.name.endswith("_pb2_grpc.py"):
                continue
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Return module -> the project modules it imports."""
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        named: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                named.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                named.add(node.module)
                named.update(f"{node.module}.{alias.name}" for alias in node.names)
        graph[name] = {m for m in named if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles() -> None:
    assert cycles(import_graph()) == []


def test_packages_import_only_what_the_layout_allows() -> None:
    graph = import_graph()
    between: dict[str, set[str]] = {package: set() for package in ALLOWED}
    wrong = []
    for module, imported in graph.items():
        package = module.split(".")[0]
        for target in imported:
            other = target.split(".")[0]
            if other == package:
                continue
            between[package].add(other)
            if other not in ALLOWED[package]:
                wrong.append(f"{module} imports {target}")
            if package == "backend" and other == "export" and module not in GATEWAY_IMPORTS_EXPORT:
                wrong.append(f"{module} imports {target} (only the local transport may)")
    print("\n" + "\n".join(f"{p} -> {', '.join(sorted(d)) or '-'}" for p, d in between.items()))
    assert wrong == []


def test_the_model_format_package_is_tensorflow_free() -> None:
    """modelformat is what the gateway, export and ops share: no TensorFlow import, even lazy."""
    for name, path in project_modules().items():
        if name.startswith("modelformat"):
            text = path.read_text(encoding="utf-8")
            assert "import tensorflow" not in text and "from tensorflow" not in text, name


def test_the_architecture_page_lists_the_tree() -> None:
    """docs/architecture.md's Layout table names every top-level directory, and only those."""
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = page.split("## Layout", 1)[1].split("\n## ", 1)[0]
    listed = {
        line.split("`")[1].split("/")[0] for line in section.splitlines() if line.startswith("| `")
    }
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    top = {path.split("/")[0] for path in tracked if "/" in path and not path.startswith(".")}
    assert listed == top
