"""The engine matrix: every scheme x table mode x dtype x {decomposed, fused} graph, exported and built.

Test orchestration, not part of the package: used by the test suite (ahead-of-time builds with TensorRT-RTX)
and by ``scripts/gpu_check.py`` (datacenter TensorRT on a GPU). Exports are cached in a folder (one file per
case, locked with POSIX ``fcntl`` so parallel test workers export each graph once).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from posenc.config import AttentionConfig
from posenc.schemes import Placement, get_spec, specs

if TYPE_CHECKING:
    from posenc.export import ExportResult
    from posenc.graphs.optimize import ParityCheck

GRAPHS: tuple[str, ...] = ("decomposed", "fused")
DTYPES: tuple[str, ...] = ("float16", "float32")


ROPE_SCALINGS_WITHOUT_GRAPH = ("rope_linear", "rope_llama3", "rope_ntk", "rope_ntk_alpha", "rope_proportional",
                               "rope_truncation")  # fmt: skip
"""RoPE types whose scaling changes only the frequencies, which the export stores as constants, in both modes."""

SAME_GRAPH: dict[tuple[str, str, str, str], str] = {
    **{(name, mode, dtype, unit): "rope" for name in ROPE_SCALINGS_WITHOUT_GRAPH
       for mode in ("precomputed", "dynamic") for dtype, unit in (("float32", "op"), ("float16", "block"))},
    # YaRN's precomputed tables carry its attention factor; its dynamic graph multiplies by it (a graph of its own)
    **{("rope_yarn", "precomputed", dtype, unit): "rope" for dtype, unit in (("float32", "op"), ("float16", "block"))},
    # Leaky ReRoPE's precomputed graph is ReRoPE's (the leak is in the tables); its dynamic graph computes the leak
    **{("leaky_rerope", "precomputed", dtype, unit): "rerope"
       for dtype, unit in (("float32", "op"), ("float16", "block"))},
    ("floater", "precomputed", "float32", "op"): "learned",  # both ops add a row of a position table
}  # fmt: skip
"""Matrix graphs (scheme, table mode, dtype, unit of the default case) that are another scheme's graph up to the
values of floating-point constants: the same nodes, attributes, wiring and integer constants. An export, parity
check, fusion or engine build of one is the same behaviour as of the other, so the matrices run them in
``make test-slow`` only (:func:`slow_if_same_graph`); their numbers are checked eagerly (``tests/test_rope_types.py``
against transformers, ``tests/schemes/``), and ``tests/export/test_same_graph.py`` (slow) exports both sides and
holds each pair to this claim."""


def same_graph_as(scheme: str, table_mode: str, dtype: str, unit: str) -> str | None:
    """The scheme whose default-case graph this one repeats (:data:`SAME_GRAPH`), or None."""
    return SAME_GRAPH.get((scheme, table_mode, dtype, unit))


ONE_PER_PLACEMENT = ("rope", "rope_dynamic", "alibi", "sinusoidal", "shaw", "nope")
"""Embedding, rotary, score, attention and no placement, one scheme each, and a scheme with only dynamic tables: the
schemes whose decomposed engine builds stay in ``make test``."""


def slow_if_same_graph(case: MatrixCase, case_id: str | None = None) -> object:
    """``pytest.param(case)``, marked ``slow`` when :data:`SAME_GRAPH` says another scheme's graph is the same."""
    import pytest  # imported here: scripts/gpu_check.py uses this module without pytest

    repeated = case.case == "default" and same_graph_as(case.scheme, case.table_mode, case.dtype, case.unit)
    return pytest.param(case, id=case_id or case.id, marks=[pytest.mark.slow] if repeated else [])


@dataclasses.dataclass(frozen=True)
class MatrixCase:
    """One graph of the matrix: scheme, parameter case, table mode, dtype, export unit, decomposed/fused."""

    scheme: str
    table_mode: str
    dtype: str
    unit: str = "op"
    graph: str = "decomposed"
    case: str = "default"

    @property
    def id(self) -> str:
        case = "" if self.case == "default" else f"[{self.case}]"
        return f"{self.scheme}{case}-{self.table_mode}-{self.dtype}-{self.unit}-{self.graph}"

    @property
    def export_id(self) -> str:
        case = "" if self.case == "default" else f"_{self.case}"
        return f"{self.scheme}{case}_{self.table_mode}_{self.dtype}_{self.unit}"

    @property
    def params(self) -> dict:
        return dict(get_spec(self.scheme).cases[self.case])


def exportable(scheme: str, unit: str) -> bool:
    spec = get_spec(scheme)
    if unit == "op":
        return "op" in spec.exports and spec.placement is not Placement.NONE
    if unit == "op-3d":
        return "op" in spec.exports and spec.placement is Placement.QK
    return unit in spec.exports


def matrix_cases(
    units: Sequence[str] = ("op",),
    dtypes: Sequence[str] = DTYPES,
    graphs: Sequence[str] = GRAPHS,
    schemes: Sequence[str] | None = None,
) -> list[MatrixCase]:
    """Every (scheme, table mode, dtype, unit, graph) of the registry's default cases."""
    cases = []
    for spec in specs():
        if schemes is not None and spec.name not in schemes:
            continue
        for unit in units:
            if not exportable(spec.name, unit):
                continue
            for mode in sorted(m.value for m in spec.table_modes):
                for dtype in dtypes:
                    if dtype not in spec.tolerances:
                        continue
                    cases.extend(MatrixCase(spec.name, mode, dtype, unit, graph) for graph in graphs)
    return cases


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``<path>.lock`` (parallel test workers export or optimize each file once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def exported(case: MatrixCase, folder: str | os.PathLike[str], config: AttentionConfig) -> Path:
    """The exported (decomposed) ONNX of ``case`` in ``folder``, exported on first use."""
    from posenc.export import export_scheme

    path = Path(folder) / f"{case.export_id}.onnx"
    with locked(path):
        if not path.exists():
            export_scheme(
                case.scheme,
                path,
                unit=case.unit,
                params=case.params,
                config=config,
                table_mode=case.table_mode,
                dtype=case.dtype,
            )
    return path


def result_of(path: Path) -> ExportResult:
    """The :class:`posenc.export.ExportResult` of the export at ``path`` (its manifest read back and verified)."""
    from posenc.artifacts.files import manifest_path_for, weights_path_for
    from posenc.export import ExportResult, load_manifest

    return ExportResult(path, load_manifest(path), manifest_path_for(path), weights_path_for(path))


def exported_result(case: MatrixCase, folder: str | os.PathLike[str], config: AttentionConfig) -> ExportResult:
    """:func:`exported` as an :class:`posenc.export.ExportResult`, for tests that read an export of the matrix instead
    of making their own. The files are shared: a test that changes them works on a copy
    (``tests.conftest.private_export``)."""
    return result_of(exported(case, folder, config))


def graph_for(
    case: MatrixCase,
    folder: str | os.PathLike[str],
    config: AttentionConfig,
    target: str = "trt",
    check: ParityCheck | None = None,
) -> Path:
    """The ONNX file of ``case``: the export itself (decomposed) or its ``posenc optimize`` output (fused).

    ``check``: the before/after parity check of the optimization (e.g. :func:`posenc.validate.check_ort_parity`;
    the engine layer does not import ``posenc.validate``, so callers pass it).
    """
    from posenc.graphs.optimize import optimize_file

    source = exported(case, folder, config)
    if case.graph == "decomposed":
        return source
    path = source.with_name(f"{source.stem}.{target}.onnx")
    with locked(path):
        if not path.exists():
            optimize_file(source, path, target, check=check)
    return path


def build_case(
    case: MatrixCase,
    folder: str | os.PathLike[str],
    config: AttentionConfig,
    targets: Sequence[str] | None = ("sm89",),
    backend: str | None = None,
    profile: Sequence[str] | None = None,
    check: ParityCheck | None = None,
):
    """Export (+ optimize, with the parity ``check`` of :func:`graph_for`) and build ``case``; returns
    :class:`posenc.engine.EngineResult`."""
    from posenc.engine.build import build_engine

    onnx_path = graph_for(case, folder, config, check=check)
    engine = Path(folder) / f"{case.id}.engine"
    return build_engine(onnx_path, engine, targets=targets, backend=backend, profile=profile)
