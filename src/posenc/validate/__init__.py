"""Parity of deployed graphs against references (default: float64 eager PyTorch), with polygraphy.

Public API::

    from posenc.validate import validate_onnx, position_sweep, tolerance_for

    report = validate_onnx("out/rope.onnx")            # shapes: S=1, odd S, S > sample, decode, batch > 1
    report.passed; print(report.to_markdown())
    report.save(markdown="parity.md", json_path="parity.json", run_results="parity.runs.json")

- :func:`compare` -> :class:`Comparison`: the one comparison path (:mod:`posenc.validate.compare`): every
  candidate runner against every :class:`Reference`, per feed and output, rows of :class:`ComparisonRow`.
- :func:`validate_onnx` -> :class:`ParityReport` (rows of :class:`OutputParity` = :class:`ComparisonRow`);
  candidates: ``"onnxrt"`` or polygraphy runner instances; references: :data:`EAGER` (the float64 CPU
  reference, :class:`EagerTorchRunner`) and/or :class:`Reference` objects, e.g. around a
  :class:`TorchModuleRunner`.
- :func:`tolerance_for` / :data:`OUTPUT_RULES`: the one tolerance policy (:mod:`posenc.validate.tolerance`).
- :func:`position_sweep` -> :class:`SweepReport`: error against position up to 131072 per bucket
  (:mod:`posenc.validate.sweep`).
- :func:`validate_against_checkpoint` / :func:`decode_against_checkpoint`: ``posenc validate --against-hf`` (and
  with ``--decode``), an exported checkpoint layer against the checkpoint's own transformers module
  (:mod:`posenc.validate.checkpoint`).
- :func:`check_ort_parity`: the before/after check of ``posenc optimize`` (pass it to
  :func:`posenc.graphs.optimize_file` as ``check=``).
- bf16 graphs: structural check plus bf16 emulation on ONNX Runtime CPU (:mod:`posenc.validate.bf16`).
"""

from posenc.validate.checkpoint import decode_against_checkpoint, validate_against_checkpoint
from posenc.validate.compare import (
    Comparison,
    ComparisonRow,
    Reference,
    Verdict,
    compare,
    eager_reference,
)
from posenc.validate.feeds import DEFAULT_SHAPES, default_shapes, fit_shapes, model_feeds, random_feed
from posenc.validate.optimize_check import check_ort_parity
from posenc.validate.parity import EAGER, OutputParity, ParityReport, validate_onnx
from posenc.validate.runners import (
    REFERENCE_DESCRIPTION,
    REFERENCE_NAME,
    EagerTorchRunner,
    TorchModuleRunner,
    feed_metadata,
    ort_runner,
)
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
from posenc.validate.tolerance import OUTPUT_RULES, OutputRule, tolerance_for, tolerances_for, tolerances_of

__all__ = [
    "DEFAULT_BUCKETS",
    "DEFAULT_SHAPES",
    "EAGER",
    "OUTPUT_RULES",
    "REFERENCE_DESCRIPTION",
    "REFERENCE_NAME",
    "BucketStats",
    "Comparison",
    "ComparisonRow",
    "EagerTorchRunner",
    "OutputParity",
    "OutputRule",
    "ParityReport",
    "Reference",
    "SweepPoint",
    "SweepReport",
    "SweepSeries",
    "TorchModuleRunner",
    "Verdict",
    "check_ort_parity",
    "compare",
    "decode_against_checkpoint",
    "default_shapes",
    "eager_reference",
    "feed_metadata",
    "fit_shapes",
    "model_feeds",
    "ort_runner",
    "position_sweep",
    "random_feed",
    "sweep_model",
    "sweep_schemes",
    "tolerance_for",
    "tolerances_for",
    "tolerances_of",
    "validate_against_checkpoint",
    "validate_onnx",
]
