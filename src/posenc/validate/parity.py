"""Parity of an exported model against the float64 eager reference, through polygraphy.

For each :class:`~posenc.export.FeedShape` the feed (realistic position ids, random activations in
the graph dtype) goes through the runners (ONNX Runtime, or any polygraphy runner such as a
``TrtRunner``) and through :class:`~posenc.validate.runners.EagerTorchRunner`; ``Comparator.run``
collects the outputs and ``Comparator.compare_accuracy`` with ``SimpleCompareFunc`` (per-output
atol/rtol from :mod:`posenc.validate.tolerance`, ``check_error_stat="elemwise"``) decides.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posenc.errors import BackendUnavailable, ConfigError
from posenc.export.files import write_text_atomic
from posenc.export.manifest import Manifest, load_manifest
from posenc.export.runtime import check_feed, check_model_file, load_eager, ort_providers
from posenc.export.units import FeedShape, make_feed
from posenc.schemes.base import Tolerance
from posenc.validate.runners import REFERENCE_NAME, EagerTorchRunner, onnxrt_runner, session_from_onnx
from posenc.validate.tolerance import outside_tolerance, tolerances_for

DEFAULT_SHAPES: tuple[FeedShape, ...] = (
    FeedShape(batch=1, seq=1, past=0),
    FeedShape(batch=3, seq=7, past=0),
    FeedShape(batch=2, seq=1, past=9),
    FeedShape(batch=2, seq=13, past=5),
)
"""Shapes other than the export sample (2, 4, 3): one token, odd prefill with batch 3, decode after 9
cached tokens, a prefill longer than the sample after 5 cached tokens."""


def default_shapes(manifest: Manifest) -> list[FeedShape]:
    """:data:`DEFAULT_SHAPES`, shrunk (past first, then seq) to fit a short precomputed table."""
    limit = manifest.max_positions
    if limit is None:
        return list(DEFAULT_SHAPES)
    shapes: list[FeedShape] = []
    for shape in DEFAULT_SHAPES:
        seq = min(shape.seq, limit)
        fitted = FeedShape(shape.batch, seq, min(shape.past, limit - seq))
        if fitted not in shapes:
            shapes.append(fitted)
    return shapes


@dataclasses.dataclass(frozen=True)
class OutputParity:
    """One output at one shape: the largest errors against the reference and the verdict."""

    shape: FeedShape
    runner: str
    output: str
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    passed: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": dataclasses.asdict(self.shape),
            "runner": self.runner,
            "output": self.output,
            "max_abs_error": self.max_abs,
            "max_rel_error": self.max_rel,
            "atol": self.atol,
            "rtol": self.rtol,
            "passed": self.passed,
        }


@dataclasses.dataclass
class ParityReport:
    """Result of :func:`validate_onnx`.

    Attributes:
        model: path of the ONNX file.
        manifest: its manifest.
        rows: one :class:`OutputParity` per (shape, runner, output).
        mode: ``"numeric"``, or ``"bf16-emulated"`` (see :mod:`posenc.validate.bf16`).
        notes: remarks of the exporter, the bf16 emulation and structural checks.
        run_results: polygraphy ``RunResults`` of all shapes (reference first).
    """

    model: str
    manifest: Manifest
    rows: list[OutputParity]
    mode: str = "numeric"
    notes: list[str] = dataclasses.field(default_factory=list)
    run_results: Any = None

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(row.passed for row in self.rows)

    def failures(self) -> list[OutputParity]:
        return [row for row in self.rows if not row.passed]

    def to_dict(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "model": self.model,
            "scheme": m.scheme,
            "unit": m.unit,
            "dtype": m.dtype,
            "table_mode": m.table_mode,
            "opset": m.opset,
            "reference": REFERENCE_NAME,
            "mode": self.mode,
            "passed": self.passed,
            "rows": [row.to_dict() for row in self.rows],
            "notes": list(self.notes),
        }

    def to_markdown(self) -> str:
        """A Markdown table: per shape and output, max abs/rel error, tolerance and verdict."""
        m = self.manifest
        verdict = "PASS" if self.passed else "FAIL"
        lines = [
            f"### Parity: {m.scheme} ({m.unit}, {m.dtype}, {m.table_mode}, opset {m.opset}) — {verdict}",
            "",
            f"Model `{self.model}` against {REFERENCE_NAME} (float64 eager PyTorch on CPU), mode: {self.mode}.",
            "",
            "| shape (B, S, P) | runner | output | max abs error | max rel error | atol | rtol | result |",
            "|---|---|---|---:|---:|---:|---:|---|",
        ]
        for row in self.rows:
            s = row.shape
            lines.append(
                f"| {s.batch}, {s.seq}, {s.past} | {row.runner} | {row.output} | {row.max_abs:.3e} | "
                f"{row.max_rel:.3e} | {row.atol:.1e} | {row.rtol:.1e} | {'pass' if row.passed else '**FAIL**'} |"
            )
        if self.notes:
            lines += ["", *[f"- {note}" for note in self.notes]]
        return "\n".join(lines) + "\n"

    def save(
        self,
        markdown: str | os.PathLike[str] | None = None,
        json_path: str | os.PathLike[str] | None = None,
        run_results: str | os.PathLike[str] | None = None,
    ) -> list[Path]:
        """Write the Markdown table, the JSON report and polygraphy's RunResults JSON (atomically)."""
        written = []
        if markdown is not None:
            written.append(write_text_atomic(markdown, self.to_markdown()))
        if json_path is not None:
            written.append(write_text_atomic(json_path, json.dumps(self.to_dict(), indent=2) + "\n"))
        if run_results is not None and self.run_results is not None:
            from polygraphy.json import to_json

            written.append(write_text_atomic(run_results, to_json(self.run_results)))
        return written


def _relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    got64, ref64 = got.astype(np.float64), ref.astype(np.float64)
    if got64.size == 0:
        return 0.0
    denom = np.abs(ref64)
    err = np.abs(got64 - ref64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(denom > 0, err / np.where(denom > 0, denom, 1.0), np.where(err > 0, np.inf, 0.0))
    return float(rel.max())


def validate_onnx(
    path: str | os.PathLike[str],
    *,
    shapes: Sequence[FeedShape] | None = None,
    runners: Sequence[Any] = ("onnxrt",),
    providers: Sequence[str] | None = None,
    tolerances: Mapping[str, Tolerance] | None = None,
    seed: int = 0,
    manifest: Manifest | None = None,
    quiet: bool = True,
) -> ParityReport:
    """Compare an exported model with its float64 eager reference at several shapes.

    Args:
        path: the ONNX file; its manifest and weights must lie beside it.
        shapes: feed sizes (default :func:`default_shapes`: S = 1, odd S, S longer than the export
            sample, decode with past > 0, batch > 1).
        runners: ``"onnxrt"`` and/or polygraphy runner instances (e.g. a ``TrtRunner``) to compare.
        providers: ONNX Runtime providers (default: CUDA when present, then CPU).
        tolerances: per-output overrides of the tolerance policy.
        seed: seed of the random activations.
        manifest: an already loaded manifest (default: read and hash-verified from beside ``path``).
        quiet: silence polygraphy's logging.

    Returns:
        :class:`ParityReport` (``.passed``, ``.to_markdown()``, ``.save(...)``).

    Raises:
        ModelFileError: missing/corrupt ONNX file, manifest or weights, or hash mismatch.
        PositionError: a shape reaches past the precomputed table.
        BackendUnavailable: ONNX Runtime lacks a kernel the graph needs.
    """
    import onnx
    from polygraphy.comparator import Comparator, SimpleCompareFunc
    from polygraphy.comparator.struct import RunResults
    from polygraphy.logger import G_LOGGER

    path = Path(path)
    check_model_file(path)
    manifest = manifest or load_manifest(path)
    shapes = list(shapes) if shapes is not None else default_shapes(manifest)
    if not shapes:
        raise ConfigError("validate_onnx needs at least one FeedShape.")
    reference, _ = load_eager(path, manifest=manifest)
    notes: list[str] = list(manifest.notes)
    providers = list(providers or ort_providers())
    mode = "numeric"
    emulated = manifest.dtype == "bfloat16"
    model_source: str | bytes = str(path)
    if emulated:
        from posenc.validate.bf16 import check_bf16_structure, emulate_bf16

        proto = onnx.load(str(path))
        notes += check_bf16_structure(proto)
        model_source = emulate_bf16(proto).SerializeToString()
        mode = "bf16-emulated"
        notes.append(
            "bf16: ONNX Runtime CPU has no bf16 kernels; the graph ran with float32 arithmetic and bf16 rounding "
            "at every bf16 value (posenc.validate.bf16). Native bf16 runs on TensorRT."
        )
    feeds = [_feed(manifest, shape, seed + i, emulated) for i, shape in enumerate(shapes)]
    for feed in feeds:
        check_feed(manifest, _as_graph_dtypes(manifest, feed) if emulated else feed)
    tols = tolerances_for(manifest.scheme, {o.name: o.dtype for o in manifest.outputs}, tolerances)
    compare = SimpleCompareFunc(
        atol={name: t.atol for name, t in tols.items()},
        rtol={name: t.rtol for name, t in tols.items()},
        check_error_stat="elemwise",
    )
    merged: dict[str, list[Any]] = {}
    rows: list[OutputParity] = []
    with G_LOGGER.verbosity(G_LOGGER.CRITICAL if quiet else G_LOGGER.INFO):
        backends = _backends(runners, model_source, providers)
        for shape, feed in zip(shapes, feeds, strict=True):
            feed_dtypes = {k: v.dtype for k, v in feed.items()}
            eager = EagerTorchRunner(reference, manifest, shape, feed_dtypes)
            results = Comparator.run([eager, *backends], data_loader=[feed])
            for name, iterations in results.items():
                merged.setdefault(name, []).extend(iterations)
            accuracy = Comparator.compare_accuracy(results, compare_func=compare)
            rows += _rows(shape, results, accuracy, tols)
    run_results = RunResults(list(merged.items()))
    return ParityReport(str(path), manifest, rows, mode=mode, notes=notes, run_results=run_results)


def _feed(manifest: Manifest, shape: FeedShape, seed: int, emulated: bool) -> dict[str, np.ndarray]:
    feed = make_feed(manifest, shape, seed=seed)
    if emulated:  # bf16 values carried as float32 (exact)
        feed = {k: (v.astype(np.float32) if v.dtype.kind not in "iu" else v) for k, v in feed.items()}
    return feed


def _as_graph_dtypes(manifest: Manifest, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    from posenc.export.units import NUMPY_DTYPES

    return {k: v.astype(NUMPY_DTYPES[manifest.input(k).dtype]) for k, v in feed.items()}


def _backends(runners: Sequence[Any], model: str | bytes, providers: Sequence[str]) -> list[Any]:
    from polygraphy.backend.base import BaseRunner

    built = []
    for runner in runners:
        if isinstance(runner, BaseRunner):
            built.append(runner)
        elif runner == "onnxrt":
            try:
                session = session_from_onnx(model, providers)
            except Exception as exc:
                text = str(exc)
                if "NOT_IMPLEMENTED" in text:
                    raise BackendUnavailable(f"ONNX Runtime lacks a kernel for this graph: {text[:300]}") from None
                raise
            label = "onnxrt-cuda" if providers and providers[0].startswith("CUDA") else "onnxrt-cpu"
            built.append(onnxrt_runner(session, name=label))
        else:
            raise ConfigError(f"unknown runner {runner!r}; use 'onnxrt' or a polygraphy BaseRunner instance.")
    return built


def _rows(shape: FeedShape, results: Any, accuracy: Any, tols: Mapping[str, Tolerance]) -> list[OutputParity]:
    reference = dict(results.items())[REFERENCE_NAME][0]
    rows = []
    pairs = [item for result in accuracy for item in result.items()]
    for (name0, name1), iterations in pairs:
        other = name1 if name0 == REFERENCE_NAME else name0
        got = dict(results.items())[other][0]
        for output, verdict in iterations[0].items():
            tol = tols[output]
            ref, out = np.asarray(reference[output]), np.asarray(got[output])
            max_abs = float(np.abs(out.astype(np.float64) - ref).max()) if ref.size else 0.0
            rows.append(
                OutputParity(
                    shape=shape,
                    runner=other,
                    output=output,
                    max_abs=max_abs,
                    max_rel=_relative_error(out, ref),
                    atol=tol.atol,
                    rtol=tol.rtol,
                    passed=bool(verdict) and not outside_tolerance(out, ref, tol).any(),
                )
            )
    return rows
