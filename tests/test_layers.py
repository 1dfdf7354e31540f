"""Layering: the graph and engine stages sit below posenc.validate and must not import it.

posenc.validate imports posenc.graphs (its optimize check receives a ``ModelInfo``), so an import the other
way would be a cycle; callers hand the check to ``optimize_file(check=...)`` instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "posenc"


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at module level or inside functions (``TYPE_CHECKING`` blocks too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


@pytest.mark.parametrize("layer", ["graphs", "engine"])
def test_lower_layers_do_not_import_validate(layer: str) -> None:
    files = sorted((SRC / layer).rglob("*.py"))
    assert files
    offenders = {
        str(path.relative_to(SRC)): sorted(m for m in _imported_modules(path) if m.startswith("posenc.validate"))
        for path in files
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_import_scan_sees_imports_inside_functions(tmp_path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f():\n    from posenc.validate.tolerance import outside_tolerance\n    import posenc.validate\n"
    )
    assert {"posenc.validate.tolerance", "posenc.validate"} <= _imported_modules(probe)
