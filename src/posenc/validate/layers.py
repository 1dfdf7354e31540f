"""Every layer of a ``posenc export --layers`` folder checked in one command, one table (``posenc validate OUT``).

Each layer artifact the folder's index lists goes through :func:`posenc.validate.checkpoint.validate_against_checkpoint`
(with a checkpoint: the checkpoint's own module of that layer, posenc's float64 rebuild) or
:func:`posenc.validate.parity.validate_onnx` (without: the float64 rebuild), one layer at a time, so memory follows
one layer. The table has a row per layer: its kind, the worst error and margin over the rows that count, and the
verdict; a layer whose files cannot be read or do not match the checkpoint is a failed row with the reason, and the
other layers are still checked.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc.errors import PosencError
from posenc.export.shapes import Shape
from posenc.records import to_json
from posenc.validate.compare import Verdict
from posenc.validate.tolerance import RULE, format_margin


@dataclasses.dataclass(frozen=True)
class LayerVerdict:
    """One layer's verdict.

    Attributes:
        layer, layer_type, onnx: the layer, its kind and its file (from the folder's index).
        passed: every row that counts passed (and the layer could be checked).
        max_abs: the largest absolute error of a counting row.
        margin: the largest margin of a counting row (<= 1 passes).
        worst: which row has that margin (``output vs reference, shape``).
        error: why the layer could not be checked (then ``passed`` is False), else empty.
    """

    layer: int
    layer_type: str | None
    onnx: str
    passed: bool
    max_abs: float | None = None
    margin: float | None = None
    worst: str = ""
    error: str = ""


@dataclasses.dataclass
class LayersReport(Verdict):
    """The verdict over every layer of a folder (``passed``: every layer passed)."""

    folder: str
    checkpoint: str | None
    layers: list[LayerVerdict]

    @property
    def passed(self) -> bool:  # per layer, not per comparison row
        return bool(self.layers) and all(layer.passed for layer in self.layers)

    def failures(self) -> list[Any]:  # failed layers
        return [layer for layer in self.layers if not layer.passed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "folder": self.folder,
            "checkpoint": self.checkpoint,
            "criterion": RULE,
            "passed": self.passed,
            "layers": [to_json(layer) for layer in self.layers],
        }

    def to_markdown(self) -> str:
        against = f" against {self.checkpoint}" if self.checkpoint else " against posenc's float64 rebuild"
        lines = [
            f"### Layers of {self.folder}{against} — {'PASS' if self.passed else 'FAIL'}",
            "",
            f"Criterion: {RULE}",
            "",
            "| layer | kind | file | worst error | margin | worst row | verdict |",
            "|---:|---|---|---:|---:|---|---|",
        ]
        for v in self.layers:
            error = "" if v.max_abs is None else f"{v.max_abs:.3e}"
            margin = "" if v.margin is None else format_margin(v.margin)
            verdict = "pass" if v.passed else ("ERROR: " + v.error if v.error else "FAIL")
            lines.append(
                f"| {v.layer} | {v.layer_type or '-'} | {v.onnx} | {error} | {margin} | {v.worst} | {verdict} |"
            )
        return "\n".join(lines) + "\n"


def _verdict(entry: Any, report: Any) -> LayerVerdict:
    counted = [row for row in report.rows if not row.informational]
    worst = max(counted, key=lambda row: (row.margin if row.margin is not None else -1.0, row.max_abs), default=None)
    where = ""
    if worst is not None:
        s = worst.shape
        shape = f"({s.batch}, {s.seq}, {s.past}{'' if s.start is None else f' @{s.start}'})" if s else ""
        where = f"{worst.output} vs {worst.reference} {shape}".strip()
    return LayerVerdict(
        entry.layer,
        entry.layer_type,
        entry.onnx,
        report.passed,
        max((row.max_abs for row in counted), default=None),
        None if worst is None else worst.margin,
        where,
    )


def validate_layers(
    folder: str | os.PathLike[str],
    checkpoint: Any = None,
    *,
    shapes: Sequence[Shape] | None = None,
    runners: Sequence[Any] = ("onnxrt",),
    providers: Sequence[str] | None = None,
    seed: int = 0,
    quiet: bool = True,
) -> LayersReport:
    """Check every layer a ``posenc export --layers`` folder holds (its ``layers.json``), one report row each.

    Args:
        folder: the folder ``posenc export --hf-model DIR --layers ... -o FOLDER`` wrote.
        checkpoint: the checkpoint to hold each layer to (its own transformers module); None: posenc's float64
            rebuild alone.
        shapes, runners, providers, seed, quiet: as in :func:`~posenc.validate.parity.validate_onnx`.

    Raises:
        ModelFileError: the folder has no readable index.
    """
    from posenc.export.layers import read_index
    from posenc.validate.checkpoint import validate_against_checkpoint
    from posenc.validate.parity import validate_onnx

    index = read_index(folder)
    common: dict[str, Any] = {"runners": runners, "providers": providers, "seed": seed, "quiet": quiet}
    verdicts = []
    for entry in index.layers:
        path = Path(folder) / entry.onnx
        try:
            if checkpoint is not None:
                report = validate_against_checkpoint(path, checkpoint, shapes=shapes, **common)
            else:
                report = validate_onnx(path, shapes=shapes, **common)
        except PosencError as exc:  # this layer cannot be checked; the others still are
            verdicts.append(LayerVerdict(entry.layer, entry.layer_type, entry.onnx, False, error=str(exc)))
            continue
        verdicts.append(_verdict(entry, report))
    return LayersReport(str(folder), None if checkpoint is None else str(checkpoint), verdicts)


__all__ = ["LayerVerdict", "LayersReport", "validate_layers"]
