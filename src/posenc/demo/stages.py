"""How the demo runs one stage and builds one engine: shared by the scheme pipeline (:mod:`posenc.demo`) and the
real-checkpoint section (:mod:`posenc.demo.checkpoints`). Every outcome is recorded, none raised."""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from posenc.demo.records import EngineStage, OptimizeStage, StageOutcome
from posenc.errors import PosencError

S = TypeVar("S", bound=StageOutcome)


def run_stage(kind: type[S], work: Callable[[], S]) -> S:
    """Run one stage; its outcome (``kind`` with status ``error`` and the reason when it raised) and seconds."""
    started = time.perf_counter()
    try:
        outcome = work()
    except PosencError as exc:
        outcome = kind(status="error", reason=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a bug in one stage must not end the demo; the report shows it
        outcome = kind(status="error", reason=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    return dataclasses.replace(outcome, seconds=round(time.perf_counter() - started, 3))


def optimize_stage(source: Path, output: Path, target: str) -> OptimizeStage:
    """``posenc optimize SOURCE --target TARGET -o OUTPUT`` with the before/after parity check."""
    from posenc.graphs import optimize_file
    from posenc.validate import check_ort_parity

    result = optimize_file(source, output, target, check=check_ort_parity)
    return OptimizeStage(status="ok", path=str(result.path), optimized=result.record())


def engine_stage(
    exported: Path, folder: Path, stem: str, backend: str | None, reason: str, targets: Sequence[str]
) -> EngineStage:
    """Optimize ``exported`` for TensorRT and build ``FOLDER/STEM.engine`` ahead of time (or say why not)."""
    if backend is None:
        return EngineStage(status="skipped", reason=reason)
    trt_graph = run_stage(OptimizeStage, lambda: optimize_stage(exported, folder / f"{stem}.trt.onnx", "trt"))
    graph = Path(trt_graph.path) if trt_graph.ok else exported
    started = time.perf_counter()
    try:
        from posenc.engine import build_engine

        result = build_engine(graph, folder / f"{stem}.engine", targets=list(targets) or None, backend=backend)
        stage = EngineStage(
            status="built",
            backend=result.manifest.backend,
            targets=tuple(result.targets) or tuple(targets),
            bytes=result.path.stat().st_size,
        )
    except Exception as exc:  # BuildError, BackendUnavailable, or the builder's own: recorded, not raised
        stage = EngineStage(status="failed", reason=f"{type(exc).__name__}: {exc}")
    return dataclasses.replace(
        stage,
        graph="optimized for trt" if trt_graph.ok else "exported (trt optimization failed)",
        graph_reason="" if trt_graph.ok else trt_graph.reason,
        seconds=round(time.perf_counter() - started, 3),
    )
