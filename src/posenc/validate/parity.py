"""Parity of an exported model against its references (default: the float64 eager posenc reference).

A thin user of :mod:`posenc.validate.compare`: shapes and feeds from :mod:`posenc.validate.feeds`
(realistic position ids, random activations in the graph dtype), bf16 graphs through
:func:`posenc.validate.bf16.prepare_for_ort`, the runtimes under test (ONNX Runtime, or any polygraphy
runner such as a ``TrtRunner``) as candidates, and :func:`~posenc.validate.compare.compare` for the
rows and the verdict (:func:`posenc.validate.tolerance.outside_tolerance`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posenc.artifacts.files import reading, write_text_atomic
from posenc.errors import ConfigError
from posenc.export.eager import check_graph_tables, load_eager
from posenc.export.manifest import Manifest, load_manifest
from posenc.export.runtime import check_model_file, ort_providers
from posenc.export.shape_rules import check_shapes
from posenc.export.shapes import Shape
from posenc.export.units import BLOCK_INPLACE
from posenc.schemes.base import Tolerance
from posenc.validate.compare import (
    ComparisonRow,
    Reference,
    Verdict,
    compare,
    eager_reference,
    float32_floor,
)
from posenc.validate.feeds import DEFAULT_SHAPES, default_shapes, model_feeds
from posenc.validate.runners import ort_runner
from posenc.validate.tolerance import RULE, format_margin, tolerances_for

__all__ = [
    "DEFAULT_SHAPES",
    "EAGER",
    "OutputParity",
    "ParityReport",
    "default_shapes",
    "validate_onnx",
]

OutputParity = ComparisonRow
"""One output at one shape against one reference (the name parity reports used before the rows named
their reference)."""

EAGER = "eager"
"""``validate_onnx(references=...)`` name of the float64 eager posenc reference (rebuilt from the manifest
and weights beside the model; runner name :data:`~posenc.validate.runners.REFERENCE_NAME`)."""


@dataclasses.dataclass
class ParityReport(Verdict):
    """Result of :func:`validate_onnx` (``passed`` / ``failures()``: see :class:`~posenc.validate.compare.Verdict`).

    Attributes:
        model: path of the ONNX file.
        manifest: its manifest.
        rows: one :class:`OutputParity` per (shape, reference, runner, output).
        mode: ``"numeric"``, or ``"bf16-emulated"`` (see :mod:`posenc.validate.bf16`).
        notes: remarks of the exporter, the bf16 emulation and structural checks.
        run_results: polygraphy ``RunResults`` of all shapes (references first, one iteration per shape).
        references: the references the rows name (description, overrides, informational or not).
    """

    model: str
    manifest: Manifest
    rows: list[OutputParity]
    mode: str = "numeric"
    notes: list[str] = dataclasses.field(default_factory=list)
    run_results: Any = None
    references: list[Reference] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "model": self.model,
            "scheme": m.scheme,
            "unit": m.unit,
            "dtype": m.dtype,
            "table_mode": m.table_mode,
            "opset": m.opset,
            "references": [ref.to_dict() for ref in self.references],
            "mode": self.mode,
            "criterion": RULE,
            "passed": self.passed,
            "rows": [row.to_dict() for row in self.rows],
            "notes": list(self.notes),
        }

    def to_markdown(self) -> str:
        """A Markdown table: per shape, reference, runner and output, max abs/rel error, tolerance and verdict."""
        m = self.manifest
        verdict = "PASS" if self.passed else "FAIL"
        lines = [
            f"### Parity: {m.scheme} ({m.unit}, {m.dtype}, {m.table_mode}, opset {m.opset}) — {verdict}",
            "",
            f"Model `{self.model}`, mode: {self.mode}. References:",
            "",
            *[
                f"- `{ref.name}`: {ref.description}{' (informational: not part of the verdict)' * ref.informational}"
                for ref in self.references
            ],
            "",
            f"Criterion: {RULE}",
            "",
            "| shape (B, S, P) | reference | runner | output | max abs error | max rel error | atol | rtol | margin "
            "| result |",
            "|---|---|---|---|---:|---:|---:|---:|---:|---|",
        ]
        notes: dict[str, int] = {}
        for row in self.rows:
            s = row.shape
            shape = f"{s.batch}, {s.seq}, {s.past}" if s is not None else f"feed {row.feed}"
            if s is not None and s.start is not None:
                shape += f" @{s.start}"
            result = "pass" if row.passed else "**FAIL**"
            if row.informational:
                result = "info: " + ("within" if row.passed else "beyond") + " tolerance"
            if row.note:  # why it is informational, or why its atol is wider than the policy's
                result += f" [{notes.setdefault(row.note, len(notes) + 1)}]"
            lines.append(
                f"| {shape} | {row.reference} | {row.runner} | {row.output} | {row.max_abs:.3e} | "
                f"{row.max_rel:.3e} | {row.atol:.1e} | {row.rtol:.1e} | {format_margin(row.margin)} | {result} |"
            )
        footnotes = [f"[{number}] {note}" for note, number in notes.items()]
        if self.notes or footnotes:
            lines += ["", *[f"- {note}" for note in [*footnotes, *self.notes]]]
        return "\n".join(lines) + "\n"

    def save(
        self,
        markdown: str | os.PathLike[str] | None = None,
        json_path: str | os.PathLike[str] | None = None,
        run_results: str | os.PathLike[str] | None = None,
    ) -> list[Path]:
        """Write the Markdown table, the JSON report and polygraphy's RunResults JSON (atomically)."""
        written = super().save(markdown, json_path)
        if run_results is not None and self.run_results is not None:
            from polygraphy.json import to_json

            written.append(write_text_atomic(run_results, to_json(self.run_results)))
        return written


def validate_onnx(
    path: str | os.PathLike[str],
    *,
    shapes: Sequence[Shape] | None = None,
    runners: Sequence[Any] = ("onnxrt",),
    providers: Sequence[str] | None = None,
    tolerances: Mapping[str, Tolerance] | None = None,
    seed: int = 0,
    manifest: Manifest | None = None,
    quiet: bool = True,
    references: Sequence[Reference | str] = (EAGER,),
) -> ParityReport:
    """Compare an exported model with its references at several shapes.

    Args:
        path: the ONNX file; its manifest and weights must lie beside it.
        shapes: feed sizes (default :func:`default_shapes`: S = 1, odd S, S longer than the export
            sample, decode with past > 0, batch > 1).
        runners: the candidates: ``"onnxrt"`` and/or polygraphy runner instances (e.g. a ``TrtRunner``
            from :func:`posenc.engine.engine_runner`).
        providers: ONNX Runtime providers (default: CUDA when present, then CPU).
        tolerances: per-output overrides of the tolerance policy (a reference's own overrides win for its rows; held as
            given, no float32 floor widens them).
        seed: seed of the random activations.
        manifest: an already loaded manifest (default: read and hash-verified from beside ``path``).
        quiet: silence polygraphy's logging.
        references: :data:`EAGER` (the float64 eager posenc reference, built from the manifest and weights)
            and/or :class:`~posenc.validate.compare.Reference` instances, e.g. a
            :class:`~posenc.validate.runners.TorchModuleRunner` around another implementation.

    Returns:
        :class:`ParityReport` (``.passed``, ``.to_markdown()``, ``.save(...)``).

    Raises:
        ModelFileError: missing/corrupt ONNX file, manifest or weights, hash mismatch, or a manifest whose table
            sizes the graph does not have (:func:`posenc.export.eager.check_graph_tables`).
        PositionError: a shape reaches past the precomputed table.
        BackendUnavailable: ONNX Runtime lacks a kernel the graph needs.
        ConfigError: no shapes, no references, or an unknown runner / reference name.
    """
    path = Path(path)
    with reading(path):  # writers wait until the comparison has read everything: no export lands halfway through
        return _validate_onnx(path, shapes, runners, providers, tolerances, seed, manifest, quiet, references)


def _validate_onnx(
    path: Path,
    shapes: Sequence[Shape] | None,
    runners: Sequence[Any],
    providers: Sequence[str] | None,
    tolerances: Mapping[str, Tolerance] | None,
    seed: int,
    manifest: Manifest | None,
    quiet: bool,
    references: Sequence[Reference | str],
) -> ParityReport:
    from posenc.validate.bf16 import prepare_for_ort

    check_model_file(path)
    manifest = manifest or load_manifest(path)
    check_graph_tables(manifest, path)  # table sizes from the graph, not from the manifest alone
    shapes = list(shapes) if shapes is not None else default_shapes(manifest)
    check_shapes(manifest, shapes, str(path))  # what the graph's fused kernels refuse, said before running
    if not shapes:
        raise ConfigError("validate_onnx needs at least one Shape.")
    if not references:
        raise ConfigError(f"validate_onnx needs at least one reference; {EAGER!r} is the float64 eager one.")
    prepared = prepare_for_ort(path, model_feeds(shapes, manifest=manifest, seed=seed), check_structure=True)
    refs = _references(references, path, manifest, prepared.feeds[0], tuple(tolerances or ()))
    in_place = manifest.unit == BLOCK_INPLACE
    candidates = _candidates(runners, prepared.model, list(providers or ort_providers()), in_place)
    tols = tolerances_for(manifest.scheme, {o.name: o.dtype for o in manifest.outputs}, tolerances)
    comparison = compare(refs, candidates, prepared.feeds, tols, shapes=shapes, quiet=quiet)
    return ParityReport(
        str(path),
        manifest,
        comparison.rows,
        mode=prepared.mode,
        notes=[*manifest.notes, *prepared.notes],
        run_results=comparison.run_results,
        references=refs,
    )


def _references(
    references: Sequence[Reference | str],
    path: Path,
    manifest: Manifest,
    feed: Mapping[str, Any],
    exempt: tuple[str, ...],
) -> list[Reference]:
    """The references the comparison runs, each with the float32 floor it holds float32 candidates to.

    A floor a given :class:`Reference` brings (measured on the checkpoint's own module) holds for posenc's float64
    rendering too; without one, :data:`EAGER` of a float32 graph brings its own, measured on posenc's module run
    in float32 (:func:`~posenc.validate.compare.float32_floor`: a measuring reference joins the list). Outputs in
    ``exempt`` (tolerances the caller set) are held to them as given, below float32's own error too.
    """
    floor = next((r.floor for r in references if isinstance(r, Reference) and r.floor is not None), None)
    built: list[Reference] = []
    for ref in references:
        if isinstance(ref, Reference):
            built.append(ref)
        elif ref == EAGER:
            module, _ = load_eager(path, manifest=manifest)
            exact = eager_reference(module, manifest, feed)
            if floor is not None:
                built.append(dataclasses.replace(exact, floor=floor))
            elif manifest.dtype == "float32":
                built.extend(float32_floor(module, manifest, feed, exact))
            else:
                built.append(exact)
        else:
            raise ConfigError(f"unknown reference {ref!r}; use {EAGER!r} or a posenc.validate.compare.Reference.")
    if not exempt:
        return built
    return [dataclasses.replace(r, floor=dataclasses.replace(r.floor, exempt=exempt)) if r.floor else r for r in built]


def _candidates(runners: Sequence[Any], model: str | bytes, providers: Sequence[str], in_place: bool) -> list[Any]:
    from polygraphy.backend.base import BaseRunner

    built = []
    for runner in runners:
        if isinstance(runner, BaseRunner):
            built.append(runner)
        elif runner == "onnxrt":
            built.append(ort_runner(model, providers, in_place=in_place))
        else:
            raise ConfigError(f"unknown runner {runner!r}; use 'onnxrt' or a polygraphy BaseRunner instance.")
    return built
