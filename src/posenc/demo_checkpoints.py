"""The demo's "real checkpoints" section: every family, from a checkpoint folder to an engine, proven against
the checkpoint's own transformers module.

Per sample of :mod:`posenc.checkpoints.samples` (a tiny seeded checkpoint written with ``save_pretrained``):
build the checkpoint -> export its layer with its weights (each table mode its scheme has) -> validate the exported
graph on ONNX Runtime against the transformers module (fp32 with its own angles, fp64 with fp64 angles) and
posenc's float64 rebuild, including a feed ending at the context length -> optimize for ONNX Runtime CPU and
validate that graph the same way -> optimize for TensorRT and build an engine ahead of time. Every outcome is
recorded, none raised: a failing family shows up in the report with its reason.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posenc.errors import PosencError


@dataclasses.dataclass(frozen=True)
class CheckpointJob:
    """One sample checkpoint through the pipeline (runs in a worker process)."""

    sample: str
    folder: str
    parity_folder: str
    engine_backend: str | None
    engine_reason: str
    engine_targets: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A stage's status (``ok``, ``error``, ``skipped``), its time and, when not ok, the reason."""

    status: str
    seconds: float = 0.0
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclasses.dataclass(frozen=True)
class HfParity:
    """One graph of one table mode against the checkpoint's module: verdict and worst error per reference."""

    graph: str
    table_mode: str
    outcome: Outcome
    passed: bool = False
    worst: dict[str, float] = dataclasses.field(default_factory=dict)
    """Reference name -> largest absolute error over the rows that count (``... far``: the informational ones)."""
    details: str = ""
    """The per-shape parity table's file name (under the report's ``parity/``)."""


@dataclasses.dataclass(frozen=True)
class CheckpointRecord:
    """Everything the report shows of one sample checkpoint."""

    sample: str
    title: str
    model_type: str
    layer: int | None
    layer_type: str | None
    checkpoint: Outcome
    parity: tuple[HfParity, ...]
    engine: Outcome
    engine_targets: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return bool(self.parity) and all(p.outcome.ok and p.passed for p in self.parity)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "passed": self.passed}


def _timed(work: Callable[[], Any]) -> tuple[Outcome, Any]:
    started = time.perf_counter()
    try:
        value = work()
        return Outcome("ok", round(time.perf_counter() - started, 3)), value
    except PosencError as exc:
        return Outcome("error", round(time.perf_counter() - started, 3), f"{type(exc).__name__}: {exc}"), None
    except Exception as exc:  # a bug in one stage must not end the demo; the report shows it
        reason = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
        return Outcome("error", round(time.perf_counter() - started, 3), reason), None


def _hf_parity(report: Any, graph: str, mode: str, markdown: Path) -> HfParity:
    markdown.write_text(report.to_markdown())
    worst: dict[str, float] = {}
    for row in report.rows:
        worst[row.reference] = max(worst.get(row.reference, 0.0), row.max_abs)
    return HfParity(graph, mode, Outcome("ok"), report.passed, worst, markdown.name)


def run_checkpoint_job(job: CheckpointJob) -> CheckpointRecord:
    """Build, export, validate, optimize and build an engine for one sample; every outcome is recorded."""
    from posenc.checkpoints import load_layer
    from posenc.checkpoints.samples import get_sample
    from posenc.export import export_onnx
    from posenc.graphs import optimize_file
    from posenc.validate import check_ort_parity
    from posenc.validate.checkpoint import validate_against_checkpoint

    sample = get_sample(job.sample)
    folder, parity_folder = Path(job.folder) / sample.name, Path(job.parity_folder)
    folder.mkdir(parents=True, exist_ok=True)
    parity_folder.mkdir(parents=True, exist_ok=True)
    built, loaded = _timed(lambda: load_layer(sample.build(folder / "checkpoint"), sample.layer, sample.layer_type))
    model_type = loaded.model_type if loaded is not None else ""
    record = {"sample": sample.name, "title": sample.title, "model_type": model_type, "layer": sample.layer,
              "layer_type": sample.layer_type, "checkpoint": built}  # fmt: skip
    if loaded is None:
        return CheckpointRecord(**record, parity=(), engine=Outcome("skipped", reason="no checkpoint"))
    checkpoint = folder / "checkpoint"
    results: list[HfParity] = []
    trt_source: Path | None = None
    for mode in sample.table_modes:
        stem = folder / f"{sample.name}-{mode}"
        exported, result = _timed(
            lambda mode=mode, stem=stem: export_onnx(
                stem.with_suffix(".onnx"), module=loaded.block(mode), provenance=loaded.provenance()
            )
        )
        if result is None:
            results.append(HfParity("exported", mode, exported))
            continue
        graphs = {"exported": result.path}
        optimized, optimize_result = _timed(
            lambda stem=stem, path=result.path: optimize_file(
                path, stem.with_name(stem.name + ".ort-cpu.onnx"), "ort-cpu", check=check_ort_parity
            )
        )
        if optimize_result is not None:
            graphs["ort-cpu"] = optimize_result.path
        else:
            results.append(HfParity("ort-cpu", mode, optimized))
        for graph, path in graphs.items():
            markdown = parity_folder / f"ckpt-{sample.name}-{mode}.{graph}.md"
            outcome, report = _timed(lambda path=path: validate_against_checkpoint(path, checkpoint))
            results.append(
                _hf_parity(report, graph, mode, markdown) if report is not None else HfParity(graph, mode, outcome)
            )
        trt_source = trt_source or result.path
    engine, targets = _engine(job, trt_source, folder, sample.name)
    return CheckpointRecord(**record, parity=tuple(results), engine=engine, engine_targets=targets)


def _engine(job: CheckpointJob, source: Path | None, folder: Path, stem: str) -> tuple[Outcome, tuple[str, ...]]:
    """Optimize ``source`` for TensorRT and build an engine ahead of time (or say why not)."""
    if job.engine_backend is None:
        return Outcome("skipped", reason=job.engine_reason), ()
    if source is None:
        return Outcome("skipped", reason="no exported graph"), ()
    from posenc.engine import build_engine
    from posenc.graphs import optimize_file
    from posenc.validate import check_ort_parity

    def build() -> Any:
        graph = optimize_file(source, folder / f"{stem}.trt.onnx", "trt", check=check_ort_parity).path
        return build_engine(graph, folder / f"{stem}.engine", targets=list(job.engine_targets) or None,
                            backend=job.engine_backend)  # fmt: skip

    outcome, result = _timed(build)
    return outcome, tuple(result.targets) if result is not None else ()


def plan_checkpoint_jobs(
    names: Sequence[str], folder: Path, parity: Path, backend: str | None, reason: str, targets: tuple[str, ...]
) -> list[CheckpointJob]:
    return [CheckpointJob(name, str(folder), str(parity), backend, reason, targets) for name in names]


def checkpoint_markdown(records: Sequence[CheckpointRecord]) -> str:
    """The report section: one row per sample and table mode, exported and optimized graphs against the module."""
    lines = [
        "## Real checkpoints",
        "",
        "Each family as a tiny seeded checkpoint (transformers `save_pretrained`, sharded), one layer exported with "
        "its own weights (`posenc export --hf-model`), validated on ONNX Runtime against the checkpoint's own "
        "transformers attention module — fp32 with its own angles (`hf-fp32`, within 1e-5) and fp64 with fp64 "
        "angles (`hf-fp64`), including a feed ending at the context length, where transformers' fp32 angles "
        "drift and their rows are informational (`far`) — then optimized for ONNX Runtime CPU (validated the same "
        "way) and built into a TensorRT engine ahead of time. Cells: verdict, then the largest error against "
        "hf-fp32 / hf-fp64 / hf-fp32 far.",
        "",
        "| checkpoint | model type | layer | table mode | exported graph | optimized (ort-cpu) | engine |",
        "|---|---|---|---|---|---|---|",
    ]
    for record in records:
        layer = f"{record.layer if record.layer is not None else 'first'}"
        layer += f" ({record.layer_type})" if record.layer_type else ""
        head, engine = f"| {record.sample} | {record.model_type} | {layer} |", _engine_cell(record)
        if not record.checkpoint.ok:
            lines.append(f"{head} - | ERROR: {_short(record.checkpoint.reason)} | | {engine} |")
            continue
        modes = dict.fromkeys(p.table_mode for p in record.parity)
        for mode in modes:
            cells = [_parity_cell(record, mode, graph) for graph in ("exported", "ort-cpu")]
            lines.append(f"{head} {mode} | {cells[0]} | {cells[1]} | {engine} |")
    passed = sum(r.passed for r in records)
    lines += ["", f"{passed} of {len(records)} checkpoints pass against their own transformers module."]
    return "\n".join(lines) + "\n"


def _parity_cell(record: CheckpointRecord, mode: str, graph: str) -> str:
    match = [p for p in record.parity if p.table_mode == mode and p.graph == graph]
    if not match:
        return "n/a"
    parity = match[0]
    if not parity.outcome.ok:
        return f"ERROR: {_short(parity.outcome.reason)}"
    errors = [parity.worst.get(name) for name in _HF_NAMES]
    numbers = " / ".join(f"{e:.1e}" if e is not None else "-" for e in errors)
    return f"{'PASS' if parity.passed else 'FAIL'} {numbers} ([table](parity/{parity.details}))"


_HF_NAMES = ("hf-fp32", "hf-fp64, fp64 angles", "hf-fp32 far")


def _engine_cell(record: CheckpointRecord) -> str:
    if record.engine.ok:
        return f"built ({', '.join(record.engine_targets)}, {record.engine.seconds:.1f} s)"
    return f"{record.engine.status.upper()}: {_short(record.engine.reason)}"


def _short(text: str) -> str:
    return text.splitlines()[0][:160].replace("|", "/") if text else ""


__all__ = ["CheckpointJob", "CheckpointRecord", "checkpoint_markdown", "plan_checkpoint_jobs", "run_checkpoint_job"]
