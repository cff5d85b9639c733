"""The package layout of docs/architecture.md: which package may import which, and no circles.

Read from the source (every ``import``, at module level or inside a function), so a lazy import
cannot hide a dependency. Inside ``ops/`` the same holds one level down: a floor of shared modules
and one package per family of tools, each family importing the floor and only the families
``OPS_FAMILIES`` allows, with one entry point each. ``python -m pytest tests/test_layout.py -q -s``
prints both graphs.
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

# ops family -> the other families it may import; every family may import the floor (ops/*.py),
# the floor imports no family. Lower families come first: nothing may import upwards.
OPS_FAMILIES: dict[str, set[str]] = {
    "demo": set(),  # the demo models and the local stack `make run` starts
    "lifecycle": {"demo"},  # push's default server is the running local stack's
    "load": set(),
    "batch": set(),  # batch jobs: the gateway's own stages (backend) straight to TF Serving
    # a rollout publishes and promotes through push; a migration re-embeds through a batch job
    "rollout": {"lifecycle", "batch"},
    "drills": {"lifecycle", "rollout", "load"},
}
# The floor's tools that deployments run by module name (deploy/k8s, the ops image, docs).
OPS_FLOOR_ENTRY_POINTS = {"ops.apikeys", "ops.tfs_ready"}
# benchmarks/e2e's modules, lower first: each imports only modules before it (its package's
# __init__ only ``headline``, the run scripts/bench.py calls).
E2E_LAYERS = ["plan", "models", "senders", "cells", "accuracy", "floor", "peers", "stacks"]
E2E_LAYERS += ["report", "headline"]


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


def ops_family(module: str) -> str | None:
    """Return the ops family a module belongs to (None: the floor, or not in ops)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "ops" and len(parts) > 2 else None


def ops_layer_violations(graph: dict[str, set[str]]) -> tuple[list[str], dict[str, set[str]]]:
    """Return (every import ops' layers forbid, the family -> families graph)."""
    wrong = []
    between: dict[str, set[str]] = {family: set() for family in ["floor", *OPS_FAMILIES]}
    for module, imported in graph.items():
        if module.split(".")[0] != "ops":
            continue
        family = ops_family(module)
        for target in imported:
            other = ops_family(target)
            if target.split(".")[0] != "ops" or other is None or other == family:
                continue
            between.setdefault(family or "floor", set()).add(other)
            if family is None:
                wrong.append(f"{module} (the floor) imports {target} (family {other})")
                continue
            if other not in OPS_FAMILIES.get(family, set()):
                wrong.append(f"{module} (family {family}) imports {target} (family {other})")
    return wrong, between


def entry_points(path: Path) -> bool:
    """Return whether a module runs as a program (an ``if __name__ == "__main__":`` block)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return True
    return False


def test_every_ops_package_is_a_declared_family() -> None:
    packages = {path.parent.name for path in (REPO / "ops").glob("*/__init__.py")}
    assert packages == set(OPS_FAMILIES)


def test_ops_families_import_the_floor_and_only_the_families_below() -> None:
    wrong, between = ops_layer_violations(import_graph())
    print(
        "\n"
        + "\n".join(
            f"ops.{f} -> {', '.join(['floor', *sorted(d)])}"
            for f, d in between.items()
            if f != "floor"
        )
    )
    print(f"ops floor -> {', '.join(sorted(between['floor'])) or 'no family'}")
    assert wrong == []
    assert cycles({family: d for family, d in between.items() if family != "floor"}) == []


def test_each_ops_family_has_one_entry_point() -> None:
    """``python -m ops.<family>`` (its ``__main__.py``) and no other module runs as a program."""
    modules = project_modules()
    runnable = {
        name for name, path in modules.items() if name.startswith("ops") and entry_points(path)
    }
    mains = {f"ops.{family}.__main__" for family in OPS_FAMILIES}
    assert mains <= set(modules), f"a family without __main__.py: {mains - set(modules)}"
    assert runnable == mains | OPS_FLOOR_ENTRY_POINTS


def test_an_upward_import_is_caught() -> None:
    """The floor importing a family, or a lower family a higher one, is reported."""
    graph = import_graph()
    graph["ops.procs"] = graph["ops.procs"] | {"ops.drills.common"}
    graph["ops.rollout.engine"] = graph["ops.rollout.engine"] | {"ops.drills.tickets"}
    wrong, _ = ops_layer_violations(graph)
    assert sorted(wrong) == [
        "ops.procs (the floor) imports ops.drills.common (family drills)",
        "ops.rollout.engine (family rollout) imports ops.drills.tickets (family drills)",
    ]


def test_the_e2e_benchmark_modules_import_only_lower_ones() -> None:
    graph = import_graph()
    package = "benchmarks.e2e"
    found = {name.removeprefix(package + ".") for name in graph if name.startswith(package + ".")}
    assert found == set(E2E_LAYERS)
    rank = {f"{package}.{name}": i for i, name in enumerate(E2E_LAYERS)} | {
        package: len(E2E_LAYERS)
    }
    wrong = [
        f"{module} imports {target}"
        for module, imported in graph.items()
        if module in rank
        for target in imported
        if target in rank and rank[target] >= rank[module]
    ]
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


def test_the_test_readme_states_the_areas_budgets() -> None:
    """tests/README.md's area table is tests/areas.py's AREAS, row for row."""
    from tests.areas import AREAS

    text = (REPO / "tests" / "README.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
    # a pattern's "|" is escaped in the table ("\\|"), as Markdown tables need
    escaped = [a.pattern.replace("|", "\\|") for a in AREAS]
    assert rows == [
        f"| {a.name} | `{p}` | {a.budget_s} |" for a, p in zip(AREAS, escaped, strict=True)
    ]


def test_the_slowest_first_list_names_test_modules_that_exist() -> None:
    """tests/conftest.py's SLOWEST_FIRST (the modules handed to xdist's workers first): each
    is a test module of the suite, once (a renamed one would silently go last again)."""
    from tests.conftest import SLOWEST_FIRST

    assert len(set(SLOWEST_FIRST)) == len(SLOWEST_FIRST)
    missing = [p for p in SLOWEST_FIRST if not (REPO / p).is_file()]
    assert not missing, missing
