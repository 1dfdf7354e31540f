"""Parity of deployed graphs against eager PyTorch (float64 reference), with polygraphy.

Public API::

    from posenc.validate import validate_onnx, position_sweep, tolerance_for

    report = validate_onnx("out/rope.onnx")            # shapes: S=1, odd S, S > sample, decode, batch > 1
    report.passed; print(report.to_markdown())
    report.save(markdown="parity.md", json_path="parity.json", run_results="parity.runs.json")

- :func:`validate_onnx` -> :class:`ParityReport` (rows of :class:`OutputParity`); runners: ``"onnxrt"``
  or polygraphy runner instances; :class:`EagerTorchRunner` is the float64 CPU reference.
- :func:`tolerance_for` / :data:`OUTPUT_RULES`: the one tolerance policy (:mod:`posenc.validate.tolerance`).
- :func:`position_sweep` -> :class:`SweepReport`: error against position up to 131072 per bucket
  (:mod:`posenc.validate.sweep`).
- bf16 graphs: structural check plus bf16 emulation on ONNX Runtime CPU (:mod:`posenc.validate.bf16`).
"""

from posenc.validate.parity import DEFAULT_SHAPES, OutputParity, ParityReport, default_shapes, validate_onnx
from posenc.validate.runners import REFERENCE_NAME, EagerTorchRunner
from posenc.validate.sweep import (
    DEFAULT_BUCKETS,
    BucketStats,
    SweepPoint,
    SweepReport,
    SweepSeries,
    position_sweep,
    sweep_model,
    sweep_schemes,
)
from posenc.validate.tolerance import OUTPUT_RULES, OutputRule, tolerance_for, tolerances_for

__all__ = [
    "DEFAULT_BUCKETS",
    "DEFAULT_SHAPES",
    "OUTPUT_RULES",
    "REFERENCE_NAME",
    "BucketStats",
    "EagerTorchRunner",
    "OutputParity",
    "OutputRule",
    "ParityReport",
    "SweepPoint",
    "SweepReport",
    "SweepSeries",
    "default_shapes",
    "position_sweep",
    "sweep_model",
    "sweep_schemes",
    "tolerance_for",
    "tolerances_for",
    "validate_onnx",
]
