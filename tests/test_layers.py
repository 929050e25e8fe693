"""The layers of docs/ARCHITECTURE.md on the real import graph: ui -> app -> engines, never upwards,
no circle between files, and none between the folders of app/.

Two views of the same rule: every import statement in the source (lazy ones inside functions
included), and what a fresh interpreter actually loads when it imports every module of
`specdesk.engines` and `specdesk.app`.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
QT = ("PySide6", "PyQt5", "PyQt6", "pyqtgraph", "superqt")
FORBIDDEN = {
    "engines": ("specdesk.app", "specdesk.ui", *QT),
    "app": ("specdesk.ui", *QT),
}


def imported_names(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, relative imports resolved."""
    package = "specdesk." + ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    return [(node.lineno, module) for node, module in import_nodes(path, package)]


def from_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a `from ... import` reads from, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def import_nodes(path: Path, package: str):
    """(node, module) of every import statement in a file, lazy ones included."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name
        elif isinstance(node, ast.ImportFrom):
            yield node, from_module(node, package)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_one_above_it(layer):
    offences = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        for line, name in imported_names(path):
            if any(name == banned or name.startswith(banned + ".") for banned in FORBIDDEN[layer]):
                offences.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not offences, "imports against the layers (docs/ARCHITECTURE.md):\n" + "\n".join(offences)


LOAD_EVERYTHING = """
import importlib, json, pkgutil, sys
import specdesk.engines, specdesk.app
loaded = []
for package in (specdesk.engines, specdesk.app):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as e:  # an optional backend (torch) that is not installed
            if "torch" not in str(e):
                raise
        loaded.append(info.name)
print(json.dumps({"modules": loaded, "qt": sorted(m for m in sys.modules if m.split(".")[0] in %r),
                  "ui": sorted(m for m in sys.modules if m.startswith("specdesk.ui"))}))
""" % (QT,)


def test_importing_engines_and_app_loads_no_qt_and_no_ui():
    done = subprocess.run([sys.executable, "-c", LOAD_EVERYTHING], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "specdesk.app.main" in report["modules"] and "specdesk.engines.speculation.verify" in report["modules"]
    assert report["qt"] == [] and report["ui"] == [], report


def test_the_architecture_page_is_in_the_repository_and_cited_not_an_outside_file():
    assert (ROOT / "docs" / "ARCHITECTURE.md").is_file()
    citing_outside = [str(p.relative_to(ROOT)) for layer in ("engines", "app", "ui") for p in (ROOT / layer).rglob("*.py")
                      if "DESIGN.md" in p.read_text(encoding="utf-8")]
    assert citing_outside == []


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return "specdesk." + ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(folders=("engines", "app", "ui")) -> dict[str, set[str]]:
    """Module -> the project modules it imports (lazy imports inside functions included; `from
    package import module` is an edge to the module)."""
    files = {module_of(p): p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges = set()
        for node, module in import_nodes(path, package):
            if isinstance(node, ast.Import):
                edges.add(module)
                continue
            for alias in node.names:  # `from package import module` is an edge to the module
                target = f"{module}.{alias.name}"
                edges.add(target if target in files else module)
        graph[name] = {e for e in edges if e in files and e != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles_in_engines_app_or_ui():
    """One way through each room: no module imports, even lazily, one that imports it back."""
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def folder_of(module: str, root: str = "specdesk.app") -> str:
    """The folder of `root` a module lies in (`specdesk.app.models.pairing` -> `specdesk.app.models`);
    a module directly in `root` (`specdesk.app.options`) is a room of its own."""
    return ".".join(module.split(".")[: len(root.split(".")) + 1])


def folder_graph(graph: dict[str, set[str]], root: str = "specdesk.app") -> dict[str, set[str]]:
    """Folder -> the folders its modules import: the module graph of `root`, each module in its folder."""
    folders: dict[str, set[str]] = {}
    for module, imported in graph.items():
        if module == root or not module.startswith(root + "."):
            continue
        edges = folders.setdefault(folder_of(module, root), set())
        edges.update(folder_of(m, root) for m in imported if m.startswith(root + "."))
    for folder, edges in folders.items():
        edges.discard(folder)
    return folders


def crossings(graph: dict[str, set[str]], group: list[str], root: str = "specdesk.app") -> list[str]:
    """The module imports that tie the folders of `group` together, for the failure message."""
    return sorted(f"{module} imports {target}" for module, imported in graph.items() for target in imported
                  if folder_of(module, root) in group and folder_of(target, root) in group
                  and folder_of(module, root) != folder_of(target, root))


def test_no_folder_of_app_imports_one_that_imports_it_back():
    """The folders of app/ lie in layers too (docs/ARCHITECTURE.md): no folder imports, even lazily,
    from a folder that imports from it, directly or around a longer circle."""
    graph = import_graph(("app",))
    found = circles(folder_graph(graph))
    assert found == [], "\n".join(f"{' <-> '.join(group)}:\n  " + "\n  ".join(crossings(graph, group))
                                  for group in found)


def test_the_folder_check_finds_a_circle_that_no_file_circle_shows():
    graph = {"specdesk.app.models.pairing": {"specdesk.app.training.adopt"},
             "specdesk.app.training.adopt": {"specdesk.app.runtime.compare"},
             "specdesk.app.training.cli": {"specdesk.app.models.library"},
             "specdesk.app.models.library": {"specdesk.app.storage.paths"},
             "specdesk.app.runtime.compare": set(), "specdesk.app.storage.paths": set(),
             "specdesk.app.options": {"specdesk.app.runtime.compare"}}
    assert circles(graph) == []
    assert circles(folder_graph(graph)) == [["specdesk.app.models", "specdesk.app.training"]]
    assert folder_graph(graph)["specdesk.app.options"] == {"specdesk.app.runtime"}
    assert crossings(graph, ["specdesk.app.models", "specdesk.app.training"]) == [
        "specdesk.app.models.pairing imports specdesk.app.training.adopt",
        "specdesk.app.training.cli imports specdesk.app.models.library"]
    del graph["specdesk.app.training.cli"]
    assert circles(folder_graph(graph)) == []
