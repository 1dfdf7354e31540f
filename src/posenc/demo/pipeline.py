"""``posenc demo``: the whole pipeline for every registered scheme, ending in a report people can read.

An embedded Llama-like attention block (head_dim 128, 8 query / 2 key-value heads, hidden 1024; ``--quick``:
a tiny one) goes through, per scheme and table mode::

    export (posenc.export) -> optimize for ONNX Runtime CPU (posenc.graphs) -> validate both graphs on
    ONNX Runtime against float64 eager PyTorch (posenc.validate) -> optimize for TensorRT and build an
    engine ahead of time when a TensorRT backend is installed (posenc.engine)

in worker processes, next to a position sweep (error against position) and the real-checkpoint section (every
model family as a tiny seeded checkpoint, proven against its own transformers module: :mod:`posenc.demo.checkpoints`).
Then, with the CPU to itself,
every scheme's block is benchmarked (posenc.bench) together with the RoPE op of the bandwidth target, and
``report.md`` plus a self-contained ``report.html`` are written (see :mod:`posenc.demo.report`). The records
of every stage are in :mod:`posenc.demo.records`.
Stages whose backend is missing are reported as skipped with the reason.
"""

from __future__ import annotations

import concurrent.futures as futures
import dataclasses
import multiprocessing
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posenc.artifacts.files import new_scratch, write_text_atomic
from posenc.bench.plan import ROPE_TARGET_CONFIG, ROPE_TARGET_SHAPE, BenchCase, resolve_schemes
from posenc.bench.progress import Progress
from posenc.bench.shapes import Shape
from posenc.config import AttentionConfig
from posenc.demo.checkpoints import CheckpointJob, checkpoint_section, run_checkpoint_job
from posenc.demo.landing import RESULT_NAME, clear_previous_results, land_report, record_results
from posenc.demo.records import (
    DEMO_CONFIG,
    QUICK_CONFIG,
    CheckpointRecord,
    DemoOptions,
    DemoResult,
    EngineSetup,
    ExportStage,
    OptimizeStage,
    ParityStage,
    PipelineRecord,
    StageOutcome,
    SweepStage,
    WorstOutput,
)
from posenc.demo.stages import engine_stage, optimize_stage, run_stage

__all__ = ["DEMO_CONFIG", "QUICK_CONFIG", "RESULT_NAME", "DemoOptions", "run_demo"]


# --------------------------------------------------------------------------------------------------
# Per-scheme pipeline (runs in a worker process; returns posenc.demo.records records)
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PipelineJob:
    """One scheme in one table mode: export -> optimize -> validate -> engine."""

    scheme: str
    table_mode: str
    config: AttentionConfig
    folder: str
    parity_folder: str
    engine_backend: str | None
    engine_reason: str
    engine_targets: tuple[str, ...]

    @property
    def stem(self) -> str:
        return f"{self.scheme}-{self.table_mode}"


def _parity_summary(report: Any, markdown_path: Path) -> ParityStage:
    """What the report keeps of a :class:`posenc.validate.ParityReport`: verdict, worst error, shapes."""
    write_text_atomic(markdown_path, report.to_markdown())
    rows = report.rows
    worst = max(rows, key=lambda r: r.max_abs / max(r.atol, 1e-30), default=None)
    return ParityStage(
        status="ok",
        passed=report.passed,
        shapes=len({(r.shape.batch, r.shape.seq, r.shape.past) for r in rows}),
        outputs=len({r.output for r in rows}),
        max_abs=max((r.max_abs for r in rows), default=0.0),
        worst=None
        if worst is None
        else WorstOutput(
            output=worst.output,
            shape=(worst.shape.batch, worst.shape.seq, worst.shape.past),
            max_abs=worst.max_abs,
            atol=worst.atol,
            rtol=worst.rtol,
        ),
        failures=len(report.failures()),
        details=markdown_path.name,
    )


def run_pipeline_job(job: PipelineJob) -> PipelineRecord:
    """Export, optimize, validate and build one scheme/table mode; every outcome is recorded, none raised."""
    from posenc.export import export_scheme
    from posenc.validate import validate_onnx

    folder, parity_folder = Path(job.folder), Path(job.parity_folder)
    paths: dict[str, Path] = {}

    def export() -> ExportStage:
        result = export_scheme(
            job.scheme, folder / f"{job.stem}.onnx", unit="block", config=job.config, table_mode=job.table_mode
        )
        paths["exported"] = result.path
        return ExportStage(
            status="ok",
            path=str(result.path),
            bytes=result.path.stat().st_size,
            opset=result.manifest.opset,
            notes=tuple(result.manifest.notes),
        )

    def validate(graph: str) -> Callable[[], ParityStage]:
        return lambda: _parity_summary(validate_onnx(paths[graph]), parity_folder / f"{job.stem}.{graph}.md")

    exported = run_stage(ExportStage, export)
    if not exported.ok:
        return PipelineRecord(job.scheme, job.table_mode, exported)
    source = paths["exported"]
    optimized = run_stage(OptimizeStage, lambda: optimize_stage(source, folder / f"{job.stem}.ort-cpu.onnx", "ort-cpu"))
    if optimized.ok:
        paths["ort-cpu"] = Path(optimized.path)
    graphs: tuple[str, ...] = ("exported", "ort-cpu")
    parity = {graph: run_stage(ParityStage, validate(graph)) for graph in graphs if graph in paths}
    engine = engine_stage(source, folder, job.stem, job.engine_backend, job.engine_reason, job.engine_targets)
    return PipelineRecord(job.scheme, job.table_mode, exported, optimized, parity, engine)


def run_sweep_job(quick: bool, folder: str) -> SweepStage:
    """The position sweep of the report: error against position of the exported RoPE op (fp32, fp16, fp16
    tables; both table modes) and ALiBi's (fp32), up to position 131072 (``quick``: RoPE fp32 to 8192)."""

    def sweep() -> SweepStage:
        from posenc.validate import position_sweep
        from posenc.validate.sweep import SweepReport

        if quick:
            report = position_sweep(
                ["rope"], dtypes=("fp32",), table_modes=("dynamic",), max_position=8192, per_bucket=4, workdir=folder
            )
        else:
            rope = position_sweep(["rope"], dtypes=("fp32", "fp16"), per_bucket=6, workdir=folder)
            alibi = position_sweep(["alibi"], dtypes=("fp32",), per_bucket=6, workdir=folder)
            report = SweepReport(rope.max_position, rope.buckets, [*rope.series, *alibi.series])
        return SweepStage(status="ok", report=report)

    return run_stage(SweepStage, sweep)


def _worker_init() -> None:
    import torch

    from posenc.process import use_batch_gc

    torch.set_num_threads(1)  # the workers share the cores; one intra-op thread each
    use_batch_gc()  # a pool process that only runs batch jobs


# --------------------------------------------------------------------------------------------------
# The demo
# --------------------------------------------------------------------------------------------------


def _engine_backend() -> tuple[str | None, str]:
    """The TensorRT backend to build with, or ``None`` and why not."""
    try:
        from posenc.engine import INSTALL_HINT, available_backends
    except ImportError as exc:
        return None, f"posenc.engine cannot be imported ({exc})"
    names = available_backends()
    if not names:
        return None, f"no TensorRT backend is installed; {INSTALL_HINT}"
    return names[0], ""


def check_engine_targets(requested: Sequence[str]) -> None:
    """Refuse compute capabilities the installed TensorRT backend cannot build for (or that are not capabilities).

    Raises:
        ConfigError: names the target and the supported ones.
    """
    if not requested:
        return
    from posenc.engine.targets import normalize_target, resolve_targets

    for target in requested:
        normalize_target(target)
    backend, _ = _engine_backend()
    if backend is not None:
        from posenc.engine.backend import load_backend

        resolve_targets(load_backend(backend), requested)


def _default_targets(backend: str | None, requested: Sequence[str]) -> tuple[str, ...]:
    if requested or backend is None:
        return tuple(requested)
    return ("sm89",) if backend == "tensorrt_rtx" else ()


def plan_jobs(options: DemoOptions, folder: Path, parity: Path) -> list[PipelineJob]:
    """One job per scheme and table mode (``--quick``: the first mode of each scheme)."""
    from posenc.bench.plan import table_modes_for

    backend, reason = _engine_backend()
    targets = _default_targets(backend, options.engine_targets)
    jobs = []
    for scheme in resolve_schemes(options.schemes or None):
        modes = table_modes_for(scheme, "auto" if options.quick else "all")
        for mode, _ in modes:
            jobs.append(PipelineJob(scheme, mode, options.config, str(folder), str(parity), backend, reason, targets))
    return jobs


def bench_cases(options: DemoOptions, schemes: Sequence[str]) -> list[BenchCase]:
    """Every scheme's block at a prefill and a decode shape on every backend (the decode step with both cache
    layouts in the same rounds), plus the RoPE op target; ``--quick``: prefill, and RoPE's decode step."""
    from posenc.bench.backends import BACKEND_NAMES
    from posenc.bench.plan import table_modes_for

    config = options.config
    if options.quick:
        shapes = [Shape(1, 32, name="prefill")]
        rope_op = [
            BenchCase(
                "rope",
                "op-3d",
                "precomputed",
                Shape(1, 128, name="prefill"),
                config,
                ("torch", "ort-cpu", "ort-cpu-fused"),
            )
        ]
    else:
        shapes = [Shape(1, 512, name="prefill"), Shape(1, 1, 511, name="decode")]
        rope_op = [
            BenchCase(
                "rope",
                unit,
                "precomputed",
                ROPE_TARGET_SHAPE,
                ROPE_TARGET_CONFIG,
                ("torch", "ort-cpu", "ort-cpu-fused"),
            )
            for unit in ("op-3d", "op")
        ]
    cases = list(rope_op) if "rope" in schemes else []
    inplace = ("block-inplace",)
    for scheme in schemes:
        ((mode, _),) = table_modes_for(scheme, "auto")
        for shape in shapes:
            paired = inplace if shape.past else ()
            cases.append(BenchCase(scheme, "block", mode, shape, config, BACKEND_NAMES, with_units=paired))
        if options.quick and scheme == "rope":
            step = Shape(1, 1, config.max_position_embeddings - 1, name="decode")
            cases.append(BenchCase(scheme, "block", mode, step, config, QUICK_DECODE_BACKENDS, with_units=inplace))
    return cases


QUICK_DECODE_BACKENDS = ("torch", "ort-cpu", "ort-cpu-fused")
"""Backends of ``--quick``'s decode step (one per kind of graph, so the quick demo stays quick)."""


def _bench_settings(options: DemoOptions) -> Any:
    from posenc.bench.timing import RunSettings, TimingSettings

    if options.quick:
        timing = TimingSettings(warmup=1, repeats=3, min_repeats=2, max_seconds=0.2, rounds=1)
        return RunSettings(timing=timing, threads=options.threads, copy_mib=64, copy_repeats=3)
    timing = TimingSettings(warmup=1, repeats=6, min_repeats=3, max_seconds=1.0, rounds=3)
    return RunSettings(timing=timing, threads=options.threads, copy_mib=1024, copy_repeats=5)


def _submit_all(
    options: DemoOptions,
    jobs: list[PipelineJob],
    checkpoint_jobs: list[CheckpointJob],
    sweep_folder: Path,
    bar: Progress,
    result: DemoResult,
) -> None:
    """Run the pipeline jobs, the checkpoint jobs and the sweep (worker processes when ``options.jobs > 1``),
    filling ``result.pipeline``, ``result.checkpoints`` and ``result.sweep`` as they finish, so an interrupt keeps
    what is done."""

    def finished(record: PipelineRecord) -> None:
        result.pipeline.append(record)
        verdicts = [("PASS" if p.passed else "FAIL") if p.ok else "ERROR" for p in record.parity.values()]
        engine = record.engine.status if record.engine is not None else "-"
        parity = "/".join(verdicts) or "-"
        export = record.export.status
        bar.step(f"{record.scheme} ({record.table_mode}): export {export}, parity {parity}, engine {engine}")

    def swept(stage: SweepStage) -> None:
        result.sweep = stage
        bar.step(f"position sweep: {stage.status}")

    def checked(record: CheckpointRecord) -> None:
        result.checkpoints.append(record)
        verdict = "PASS" if record.passed else ("ERROR" if not record.checkpoint.ok else "FAIL")
        bar.step(f"checkpoint {record.sample}: {verdict} against its transformers module")

    if options.jobs == 1:
        swept(run_sweep_job(options.quick, str(sweep_folder)))
        for job in jobs:
            finished(run_pipeline_job(job))
        for checkpoint_job in checkpoint_jobs:
            checked(run_checkpoint_job(checkpoint_job))
        return
    context = multiprocessing.get_context("spawn")
    with futures.ProcessPoolExecutor(options.jobs, mp_context=context, initializer=_worker_init) as pool:
        try:
            sweep_future = pool.submit(run_sweep_job, options.quick, str(sweep_folder))
            checking = {pool.submit(run_checkpoint_job, job): job for job in checkpoint_jobs}
            pending = {pool.submit(run_pipeline_job, job): job for job in jobs}
            submitted: list[futures.Future[Any]] = [sweep_future, *checking, *pending]
            for future in futures.as_completed(submitted):
                if future is sweep_future:
                    swept(future.result())
                    continue
                if future in checking:
                    checked(_checkpoint_outcome(future, checking[future]))
                    continue
                try:
                    finished(future.result())
                except Exception as exc:  # a worker died (e.g. out of memory): record, go on
                    job = pending[future]
                    reason = f"worker failed: {type(exc).__name__}: {exc}"
                    finished(PipelineRecord(job.scheme, job.table_mode, ExportStage(status="error", reason=reason)))
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def _checkpoint_outcome(future: futures.Future[CheckpointRecord], job: CheckpointJob) -> CheckpointRecord:
    """The job's record, or a record of the worker's death (e.g. out of memory)."""
    try:
        return future.result()
    except Exception as exc:
        failed = StageOutcome(status="error", reason=f"worker failed: {type(exc).__name__}: {exc}")
        return CheckpointRecord(job.sample, job.sample, "", None, None, failed)


def _adopt_graphs(store: Any, result: DemoResult, config: AttentionConfig) -> None:
    """Hand the benchmark the graphs the pipeline exported and optimized (no second export)."""
    from posenc.bench.workloads import workload_key

    for record in result.pipeline:
        if not record.export.ok:
            continue
        key = workload_key(record.scheme, "block", record.table_mode, config, config.max_position_embeddings)
        optimize = record.optimize if record.optimize is not None and record.optimize.ok else None
        optimized = {"ort-cpu": Path(optimize.path)} if optimize is not None else {}
        notes = {"ort-cpu": optimize.optimized} if optimize is not None and optimize.optimized is not None else {}
        store.adopt(key, Path(record.export.path), optimized, notes)


def run_demo(options: DemoOptions) -> DemoResult:
    """Run the demo and write the report folder; returns everything the report shows (also ``demo.json``).

    Raises:
        ConfigError: unknown scheme names, bad options.
        KeyboardInterrupt: after writing a report of what had finished.
    """
    from posenc.bench.harness import run_bench
    from posenc.bench.models import ModelStore

    started = time.perf_counter()
    out = Path(options.output)
    out.mkdir(parents=True, exist_ok=True)
    clear_previous_results(out)  # a previous run's results must not appear in this run's report
    scratch = new_scratch("demo")  # removed below, or by the next run if this one is killed
    models = out / "models" if options.keep_models else scratch / "models"
    for folder in (models, out / "parity", scratch / "sweep"):
        folder.mkdir(parents=True, exist_ok=True)
    jobs = plan_jobs(options, models, out / "parity")
    setup = (
        EngineSetup(jobs[0].engine_backend, jobs[0].engine_reason, jobs[0].engine_targets)
        if jobs
        else EngineSetup(None, "", ())
    )
    schemes = tuple(dict.fromkeys(j.scheme for j in jobs))
    samples, checkpoint_reason = checkpoint_section(options)
    checkpoint_jobs = [
        CheckpointJob(name, str(models), str(out / "parity"), options.quick, setup.backend, setup.reason, setup.targets)
        for name in samples
    ]
    result = DemoResult(
        options=options, config=options.config, schemes=schemes, engine=setup, checkpoint_reason=checkpoint_reason
    )
    bar = Progress(len(jobs) + len(checkpoint_jobs) + 1, enabled=options.progress)
    bench_doc = None
    try:
        bar.show(
            f"pipeline: {len(jobs)} scheme/table-mode pairs and {len(checkpoint_jobs)} checkpoints in "
            f"{options.jobs} worker(s)"
        )
        _submit_all(options, jobs, checkpoint_jobs, scratch / "sweep", bar, result)
        bar.close()
        result.stage_seconds["pipeline"] = round(time.perf_counter() - started, 1)
        store = ModelStore(scratch / "bench-models")
        _adopt_graphs(store, result, options.config)
        bench_started = time.perf_counter()
        try:
            bench_doc = run_bench(
                bench_cases(options, schemes),
                _bench_settings(options),
                out / "bench",
                progress=options.progress,
                store=store,
            )
        finally:
            store.close()
        result.stage_seconds["bench"] = round(time.perf_counter() - bench_started, 1)
        result.status = "complete"
    except KeyboardInterrupt:
        result.status = "interrupted"
        raise
    finally:
        bar.close()
        result.pipeline.sort(key=lambda r: (r.scheme, r.table_mode))
        order = {name: index for index, name in enumerate(samples)}
        result.checkpoints.sort(key=lambda r: order.get(r.sample, len(order)))
        result.seconds = round(time.perf_counter() - started, 1)
        if bench_doc is None and (out / "bench" / "bench.json").exists():
            from posenc.bench.results import BenchDocument

            bench_doc = BenchDocument.load(out / "bench" / "bench.json")
        try:
            land_report(result, bench_doc, out)
            record_results(out)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return result
