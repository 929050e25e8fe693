"""The layers of docs/ARCHITECTURE.md on the real import graph: ui -> app -> engines, never upwards.

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
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.append((node.lineno, module))
    return names


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
