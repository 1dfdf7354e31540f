"""Layering: posenc's parts import one way, from the bottom up, and no modules import each other in a cycle.

The layers, lowest first (docs/architecture.md, "Layers": schemes -> blocks -> export -> graphs -> engine ->
validate -> report -> bench -> demo -> cli, with the small shared modules below them). A part may import parts of
lower layers only; parts that share a layer are independent of each other. Every module of the package must belong
to a listed part, so a new top-level module needs an explicit place here.

The import graph is grimp's (the library import-linter is built on): every import, at module level, inside
functions and under ``TYPE_CHECKING``. Cycles are checked on the imports that run (``TYPE_CHECKING`` ones left out,
as they never execute).
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

grimp = pytest.importorskip("grimp", reason="grimp (a dev dependency: pip install -e '.[dev]') builds the graph")

LAYERS: tuple[tuple[str, ...], ...] = (
    ("posenc.errors", "posenc._lazy", "posenc.citations", "posenc.process"),
    ("posenc.artifacts",),  # safe paths, memory checks, atomic landing and locks: every layer's files
    ("posenc.records", "posenc.dtypes", "posenc.params"),
    ("posenc.provenance", "posenc.rope_types"),
    ("posenc.functional", "posenc.config"),
    ("posenc.schemes",),
    ("posenc.blocks",),  # AttentionBlock, the MLA block and the factory that picks one for a geometry
    ("posenc",),  # the package's public API: re-exports of the layers above
    ("posenc.checkpoints", "posenc.plugins"),
    ("posenc.trace",),  # the traced path's capture and unit: a checkpoint's own attention module, as its model calls it
    ("posenc.export",),
    ("posenc.graphs",),
    ("posenc.engine",),
    ("posenc.validate",),
    ("posenc.report",),  # rendering toolkit (Markdown/HTML documents, figures); knows nothing of bench or demo
    ("posenc.bench",),
    ("posenc.cli_parser",),  # the argparse parser of every subcommand and its old spellings: only CLIs use it
    ("posenc.cli_args",),  # the CLI vocabulary (argument groups, the one shape parser's CLI side): only CLIs use it
    ("posenc.demo",),  # a stage package: records -> stages, report, landing -> checkpoints -> pipeline -> cli
    ("posenc.export.cli", "posenc.graphs.cli", "posenc.engine.cli", "posenc.validate.cli", "posenc.bench.cli"),
    ("posenc.cli",),
    ("posenc.census",),  # drives the command line (posenc.cli.main) per model type; `posenc models` loads it by name
)
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def part_of(module: str) -> str | None:
    """The listed part a module belongs to: the longest listed prefix (``posenc.graphs.rope`` -> ``posenc.graphs``)."""
    pieces = module.split(".")
    for end in range(len(pieces), 0, -1):
        candidate = ".".join(pieces[:end])
        if candidate in RANK:
            return candidate
    return None


def violations(edges: Iterable[tuple[str, str]]) -> list[str]:
    """Every import ``(importer, imported)`` that goes up a layer or sideways between parts of one layer."""
    found = []
    for importer, imported in edges:
        a, b = part_of(importer), part_of(imported)
        if a is None or b is None or a == b:
            continue
        if RANK[b] > RANK[a]:
            found.append(f"{importer} imports {imported}: {b} is a layer above {a}")
        elif RANK[b] == RANK[a]:
            found.append(f"{importer} imports {imported}: {b} and {a} share a layer and must stay independent")
    return sorted(found)


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph.find_modules_directly_imported_by(module):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return components


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("posenc", cache_dir=None)


def _edges(graph: grimp.ImportGraph) -> set[tuple[str, str]]:
    return {(m, t) for m in graph.modules for t in graph.find_modules_directly_imported_by(m)}


def test_every_module_has_a_layer(graph) -> None:
    assert sorted(m for m in graph.modules if part_of(m) is None) == []


def test_imports_go_down_the_layers(graph) -> None:
    assert violations(_edges(graph)) == []


def test_no_import_cycles() -> None:
    assert cycles(grimp.build_graph("posenc", exclude_type_checking_imports=True, cache_dir=None)) == []


def test_the_graph_sees_imports_inside_functions(graph) -> None:
    """posenc.cli composes the parity check by importing posenc.validate inside a function."""
    assert ("posenc.cli", "posenc.validate.optimize_check") in _edges(graph)


def test_the_checks_catch_an_upward_import_a_sideways_import_and_a_cycle() -> None:
    found = violations(
        [
            ("posenc.graphs.inspect", "posenc.engine.parse_check"),  # up
            ("posenc.plugins.rope.spec", "posenc.checkpoints.load"),  # sideways, within one layer
            ("posenc.engine.build", "posenc.graphs.manifests"),  # down: fine
            ("posenc.export.cli", "posenc.export.manifest"),  # within a part: fine
        ]
    )
    assert found == [
        "posenc.graphs.inspect imports posenc.engine.parse_check: posenc.engine is a layer above posenc.graphs",
        "posenc.plugins.rope.spec imports posenc.checkpoints.load: posenc.checkpoints and posenc.plugins share a "
        "layer and must stay independent",
    ]
    looped = grimp.ImportGraph()
    for module in ("a", "b", "c", "d"):
        looped.add_module(module)
    looped.add_import(importer="a", imported="b")
    looped.add_import(importer="b", imported="c")
    looped.add_import(importer="c", imported="a")
    looped.add_import(importer="c", imported="d")
    assert cycles(looped) == [["a", "b", "c"]]
