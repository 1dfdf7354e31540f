"""The demo's real-checkpoint section: every family, from a checkpoint folder to an engine, proven against the
checkpoint's own transformers module.

Per sample of :mod:`posenc.checkpoints.samples` (a tiny seeded checkpoint written with ``save_pretrained``,
sharded): build it -> export its layer with its own weights (each table mode its scheme has; ``--quick``: the
first) -> validate the exported graph on ONNX Runtime against the transformers module (fp32 with its own angles,
fp64 with fp64 angles) and posenc's float64 rebuild, with a feed ending at the context length -> optimize for
ONNX Runtime CPU and validate that graph the same way -> optimize for TensorRT and build an engine ahead of time.
Jobs run in the demo's worker processes; their records are :class:`posenc.demo.records.CheckpointRecord`.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

from posenc.artifacts.files import write_text_atomic
from posenc.demo.records import CheckpointParity, CheckpointRecord, DemoOptions, OptimizeStage, StageOutcome
from posenc.demo.stages import engine_stage, optimize_stage, run_stage

QUICK_SAMPLES = ("llama", "t5-decoder", "bert")
"""``--quick``: one rotary decoder, one relative-bias stack, one absolute-table encoder."""


@dataclasses.dataclass(frozen=True)
class CheckpointJob:
    """One sample checkpoint through the pipeline (runs in a worker process)."""

    sample: str
    folder: str
    parity_folder: str
    quick: bool
    engine_backend: str | None
    engine_reason: str
    engine_targets: tuple[str, ...]


def checkpoint_section(options: DemoOptions) -> tuple[tuple[str, ...], str]:
    """``(sample names, reason)``: the samples the section runs, or none and why (transformers missing, ``()``)."""
    if options.checkpoints == ():
        return (), "not requested (--no-checkpoints)"
    try:
        from posenc.checkpoints.reference import import_transformers
        from posenc.checkpoints.samples import SAMPLES, get_sample

        import_transformers()
    except Exception as exc:  # BackendUnavailable: transformers is an optional dependency
        return (), f"{type(exc).__name__}: {exc}"
    if options.checkpoints is not None:
        return tuple(get_sample(name).name for name in options.checkpoints), ""
    return (QUICK_SAMPLES if options.quick else tuple(SAMPLES)), ""


def _parity(report: Any, markdown: Path) -> CheckpointParity:
    """The verdict and the worst error per reference of a checkpoint parity report (its table goes to ``markdown``)."""
    write_text_atomic(markdown, report.to_markdown())
    worst: dict[str, float] = {}
    for row in report.rows:
        key = f"{row.reference} (informational)" if row.informational else row.reference
        worst[key] = max(worst.get(key, 0.0), row.max_abs)
    return CheckpointParity(status="ok", passed=report.passed, worst=worst, details=markdown.name)


def _check(graph: Path, checkpoint: Path, markdown: Path) -> CheckpointParity:
    """``posenc validate GRAPH --against-hf CHECKPOINT``, summarised; its table goes to ``markdown``."""
    from posenc.validate.checkpoint import validate_against_checkpoint

    return _parity(validate_against_checkpoint(graph, checkpoint), markdown)


def run_checkpoint_job(job: CheckpointJob) -> CheckpointRecord:
    """Build, export, validate, optimize and build an engine for one sample; every outcome is recorded."""
    from posenc.checkpoints import load_layer
    from posenc.checkpoints.samples import get_sample
    from posenc.export import export_onnx

    sample = get_sample(job.sample)
    folder, parity_folder = Path(job.folder) / f"ckpt-{sample.name}", Path(job.parity_folder)
    checkpoint = folder / "checkpoint"
    loaded: list[Any] = []

    def build() -> StageOutcome:
        sample.build(checkpoint)
        loaded.append(load_layer(checkpoint, sample.layer, sample.layer_type))
        return StageOutcome(status="ok")

    built = run_stage(StageOutcome, build)

    def record(model_type: str, **stages: Any) -> CheckpointRecord:
        return CheckpointRecord(sample.name, sample.title, model_type, sample.layer, sample.layer_type, **stages)

    if not built.ok:
        return record("", checkpoint=built)
    layer = loaded[0]
    parity: list[CheckpointParity] = []
    first_export: Path | None = None
    for mode in sample.table_modes[:1] if job.quick else sample.table_modes:
        stem = f"{sample.name}-{mode}"
        exported = folder / f"{stem}.onnx"

        def export(mode: str = mode, exported: Path = exported) -> StageOutcome:
            export_onnx(layer.block(mode), exported, provenance=layer.provenance(), copy=False)
            return StageOutcome(status="ok")

        stage = run_stage(StageOutcome, export)
        if not stage.ok:
            parity.append(CheckpointParity(status="error", reason=stage.reason, graph="exported", table_mode=mode))
            continue
        first_export = first_export or exported
        graphs = {"exported": exported}
        optimized = run_stage(
            OptimizeStage, functools.partial(optimize_stage, exported, folder / f"{stem}.ort-cpu.onnx", "ort-cpu")
        )
        if optimized.ok:
            graphs["ort-cpu"] = Path(optimized.path)
        else:
            parity.append(CheckpointParity(status="error", reason=optimized.reason, graph="ort-cpu", table_mode=mode))
        for graph, path in graphs.items():
            markdown = parity_folder / f"ckpt-{stem}.{graph}.md"
            checked = run_stage(CheckpointParity, functools.partial(_check, path, checkpoint, markdown))
            parity.append(dataclasses.replace(checked, graph=graph, table_mode=mode))
    engine = (
        engine_stage(first_export, folder, sample.name, job.engine_backend, job.engine_reason, job.engine_targets)
        if first_export is not None
        else None
    )
    return record(layer.model_type, checkpoint=built, parity=parity, engine=engine)


__all__ = ["QUICK_SAMPLES", "CheckpointJob", "checkpoint_section", "run_checkpoint_job"]
