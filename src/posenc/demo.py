"""``posenc demo``: the whole pipeline for every registered scheme, ending in a report people can read.

An embedded Llama-like attention block (head_dim 128, 8 query / 2 key-value heads, hidden 1024; ``--quick``:
a tiny one) goes through, per scheme and table mode::

    export (posenc.export) -> optimize for ONNX Runtime CPU (posenc.graphs) -> validate both graphs on
    ONNX Runtime against float64 eager PyTorch (posenc.validate) -> optimize for TensorRT and build an
    engine ahead of time when a TensorRT backend is installed (posenc.engine)

in worker processes, next to a position sweep (error against position). Then, with the CPU to itself,
every scheme's block is benchmarked (posenc.bench) together with the RoPE op of the bandwidth target, and
``report.md`` plus a self-contained ``report.html`` are written (see :mod:`posenc.report.demo_report`).
Stages whose backend is missing are reported as skipped with the reason.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import dataclasses
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posenc.bench.plan import LLAMA_LIKE, ROPE_TARGET_CONFIG, ROPE_TARGET_SHAPE, BenchCase, resolve_schemes
from posenc.bench.progress import Progress
from posenc.bench.shapes import Shape
from posenc.cli_args import add, split_names
from posenc.config import AttentionConfig
from posenc.errors import ConfigError, PosencError
from posenc.report.files import atomic_write_text

DEMO_CONFIG = LLAMA_LIKE
QUICK_CONFIG = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=256)
"""``--quick``: head_dim 16, grouped-query 4/2 heads, 256 positions."""
RESULT_NAME = "demo.json"


@dataclasses.dataclass(frozen=True)
class DemoOptions:
    """What ``posenc demo`` does.

    Attributes:
        output: the report folder.
        quick: tiny geometry, one table mode per scheme, short sweep and benchmark (for tests, ~1 minute).
        schemes: schemes to run (default: every registered scheme).
        jobs: worker processes for the per-scheme pipeline (export is the slow part).
        threads: intra-op threads of the benchmark.
        engine_targets: compute capabilities of the engines (default: sm89 with TensorRT-RTX, the local
            GPU with datacenter TensorRT).
        keep_models: keep ONNX graphs and engines under ``OUTPUT/models`` (they are large).
        progress: progress lines on stderr.
    """

    output: Path = Path("report")
    quick: bool = False
    schemes: tuple[str, ...] = ()
    jobs: int = min(2, os.cpu_count() or 1)
    threads: int = os.cpu_count() or 1
    engine_targets: tuple[str, ...] = ()
    keep_models: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("jobs", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive int, got {value!r}.")

    @property
    def config(self) -> AttentionConfig:
        return QUICK_CONFIG if self.quick else DEMO_CONFIG


# --------------------------------------------------------------------------------------------------
# Per-scheme pipeline (runs in a worker process; returns plain JSON-ready data)
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PipelineJob:
    """One scheme in one table mode: export -> optimize -> validate -> engine."""

    scheme: str
    table_mode: str
    config: dict[str, Any]
    folder: str
    parity_folder: str
    engine_backend: str | None
    engine_reason: str
    engine_targets: tuple[str, ...]

    @property
    def stem(self) -> str:
        return f"{self.scheme}-{self.table_mode}"


def _stage(record: dict[str, Any], name: str, work: Callable[[], dict[str, Any]]) -> bool:
    """Run one stage; store ``{"status": ..., "seconds": ...}`` plus what ``work`` returns. True when ok."""
    started = time.perf_counter()
    try:
        record[name] = {"status": "ok", **work()}
    except PosencError as exc:
        record[name] = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    except Exception as exc:  # a bug in one stage must not end the demo; the report shows it
        record[name] = {
            "status": "error",
            "reason": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
    record[name]["seconds"] = round(time.perf_counter() - started, 3)
    return record[name]["status"] == "ok"


def _parity_summary(report: Any, markdown_path: Path) -> dict[str, Any]:
    """What the report keeps of a :class:`posenc.validate.ParityReport`: verdict, worst error, shapes."""
    atomic_write_text(markdown_path, report.to_markdown())
    rows = report.rows
    worst = max(rows, key=lambda r: r.max_abs / max(r.atol, 1e-30), default=None)
    return {
        "passed": report.passed,
        "shapes": len({(r.shape.batch, r.shape.seq, r.shape.past) for r in rows}),
        "outputs": len({r.output for r in rows}),
        "max_abs": max((r.max_abs for r in rows), default=0.0),
        "worst": None
        if worst is None
        else {
            "output": worst.output,
            "shape": [worst.shape.batch, worst.shape.seq, worst.shape.past],
            "max_abs": worst.max_abs,
            "atol": worst.atol,
            "rtol": worst.rtol,
        },
        "failures": len(report.failures()),
        "details": markdown_path.name,
    }


def run_pipeline_job(job: PipelineJob) -> dict[str, Any]:
    """Export, optimize, validate and build one scheme/table mode; every outcome is recorded, none raised."""
    from posenc.export import export_onnx
    from posenc.validate import validate_onnx

    folder, parity = Path(job.folder), Path(job.parity_folder)
    config = AttentionConfig.from_dict(job.config)
    record: dict[str, Any] = {"scheme": job.scheme, "table_mode": job.table_mode}
    paths: dict[str, Path] = {}

    def export() -> dict[str, Any]:
        result = export_onnx(
            folder / f"{job.stem}.onnx", job.scheme, unit="block", config=config, table_mode=job.table_mode
        )
        paths["exported"] = result.path
        return {
            "path": str(result.path),
            "bytes": result.path.stat().st_size,
            "opset": result.manifest.opset,
            "notes": list(result.manifest.notes),
        }

    def optimize(target: str) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            from posenc.graphs import optimize_file
            from posenc.validate import check_ort_parity

            output = folder / f"{job.stem}.{target}.onnx"
            result = optimize_file(paths["exported"], output, target, check=check_ort_parity)
            paths[target] = result.path
            return {"path": str(result.path), "counts": result.counts, "passes": result.to_dict()["passes"]}

        return run

    def validate(graph: str) -> Callable[[], dict[str, Any]]:
        return lambda: _parity_summary(validate_onnx(paths[graph]), parity / f"{job.stem}.{graph}.md")

    if not _stage(record, "export", export):
        return record
    _stage(record, "optimize", optimize("ort-cpu"))
    record["parity"] = {}
    for graph in ("exported", "ort-cpu"):
        if graph in paths:
            _stage(record["parity"], graph, validate(graph))
    record["engine"] = _engine_stage(job, paths, optimize("trt"))
    return record


def _engine_stage(
    job: PipelineJob, paths: dict[str, Path], optimize_trt: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    if job.engine_backend is None:
        return {"status": "skipped", "reason": job.engine_reason}
    holder: dict[str, Any] = {}
    graph = "exported"
    if _stage(holder, "trt_graph", optimize_trt):
        graph = "trt"
    started = time.perf_counter()
    try:
        from posenc.engine import build_engine

        engine_path = Path(job.folder) / f"{job.stem}.engine"
        result = build_engine(
            paths[graph], engine_path, targets=list(job.engine_targets) or None, backend=job.engine_backend
        )
        record = {
            "status": "built",
            "backend": result.manifest.get("backend", job.engine_backend),
            "targets": result.targets or list(job.engine_targets),
            "bytes": result.path.stat().st_size,
        }
    except Exception as exc:  # BuildError, BackendUnavailable, or the builder's own: recorded, not raised
        record = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
    record["graph"] = "optimized for trt" if graph == "trt" else "exported (trt optimization failed)"
    if graph != "trt":
        record["graph_reason"] = holder["trt_graph"].get("reason", "")
    record["seconds"] = round(time.perf_counter() - started, 3)
    return record


def run_sweep_job(quick: bool, folder: str) -> dict[str, Any]:
    """The position sweep of the report: error against position of the exported RoPE op (fp32, fp16, fp16
    tables; both table modes) and ALiBi's (fp32), up to position 131072 (``quick``: RoPE fp32 to 8192)."""
    from posenc.validate import position_sweep

    started = time.perf_counter()
    try:
        if quick:
            report = position_sweep(
                ["rope"], dtypes=("fp32",), table_modes=("dynamic",), max_position=8192, per_bucket=4, workdir=folder
            )
            data = report.to_dict()
        else:
            rope = position_sweep(["rope"], dtypes=("fp32", "fp16"), per_bucket=6, workdir=folder)
            alibi = position_sweep(["alibi"], dtypes=("fp32",), per_bucket=6, workdir=folder)
            data = rope.to_dict()
            data["series"] += alibi.to_dict()["series"]
            data["passed"] = rope.passed and alibi.passed
        data = {"status": "ok", **data}
    except Exception as exc:  # reported as a failed stage, the rest of the demo goes on
        data = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    data["seconds"] = round(time.perf_counter() - started, 3)
    return data


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)  # the workers share the cores; one intra-op thread each


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
            jobs.append(
                PipelineJob(scheme, mode, options.config.to_dict(), str(folder), str(parity), backend, reason, targets)
            )
    return jobs


def bench_cases(options: DemoOptions, schemes: Sequence[str]) -> list[BenchCase]:
    """Every scheme's block at a prefill and a decode shape on every backend, plus the RoPE op target."""
    from posenc.bench.backends import BACKEND_NAMES
    from posenc.bench.plan import table_modes_for

    config = options.config
    if options.quick:
        shapes = [Shape("prefill", 1, 32)]
        rope_op = [
            BenchCase(
                "rope", "op-3d", "precomputed", Shape("prefill", 1, 128), config, ("torch", "ort-cpu", "ort-cpu-fused")
            )
        ]
    else:
        shapes = [Shape("prefill", 1, 512), Shape("decode", 1, 1, 511)]
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
    for scheme in schemes:
        ((mode, _),) = table_modes_for(scheme, "auto")
        cases += [BenchCase(scheme, "block", mode, shape, config, BACKEND_NAMES) for shape in shapes]
    return cases


def _bench_settings(options: DemoOptions) -> Any:
    from posenc.bench.harness import RunSettings
    from posenc.bench.timing import TimingSettings

    if options.quick:
        timing = TimingSettings(warmup=1, repeats=3, min_repeats=2, max_seconds=0.2, rounds=1)
        return RunSettings(timing=timing, threads=options.threads, copy_mib=64, copy_repeats=3)
    timing = TimingSettings(warmup=1, repeats=6, min_repeats=3, max_seconds=1.0, rounds=3)
    return RunSettings(timing=timing, threads=options.threads, copy_mib=1024, copy_repeats=5)


def _submit_all(
    options: DemoOptions,
    jobs: list[PipelineJob],
    sweep_folder: Path,
    bar: Progress,
    results: list[dict[str, Any]],
    sweep: dict[str, Any],
) -> None:
    """Run the pipeline jobs and the sweep (worker processes when ``options.jobs > 1``), filling
    ``results`` and ``sweep`` as they finish, so an interrupt keeps what is done."""

    def finished(record: dict[str, Any]) -> None:
        results.append(record)
        verdicts = [
            ("PASS" if p.get("passed") else "FAIL") if p["status"] == "ok" else "ERROR"
            for p in record.get("parity", {}).values()
        ]
        engine = record.get("engine", {}).get("status", "-")
        parity = "/".join(verdicts) or "-"
        export = record["export"]["status"]
        bar.step(f"{record['scheme']} ({record['table_mode']}): export {export}, parity {parity}, engine {engine}")

    if options.jobs == 1:
        sweep.update(run_sweep_job(options.quick, str(sweep_folder)))
        bar.step(f"position sweep: {sweep['status']}")
        for job in jobs:
            finished(run_pipeline_job(job))
        return
    context = multiprocessing.get_context("spawn")
    with futures.ProcessPoolExecutor(options.jobs, mp_context=context, initializer=_worker_init) as pool:
        try:
            sweep_future = pool.submit(run_sweep_job, options.quick, str(sweep_folder))
            pending = {pool.submit(run_pipeline_job, job): job for job in jobs}
            for future in futures.as_completed([sweep_future, *pending]):
                if future is sweep_future:
                    sweep.update(future.result())
                    bar.step(f"position sweep: {sweep['status']}")
                else:
                    try:
                        finished(future.result())
                    except Exception as exc:  # a worker died (e.g. out of memory): record, go on
                        job = pending[future]
                        finished(
                            {
                                "scheme": job.scheme,
                                "table_mode": job.table_mode,
                                "export": {"status": "error", "reason": f"worker failed: {type(exc).__name__}: {exc}"},
                            }
                        )
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def run_demo(options: DemoOptions) -> dict[str, Any]:
    """Run the demo and write the report folder; returns everything the report shows (also ``demo.json``).

    Raises:
        ConfigError: unknown scheme names, bad options.
        KeyboardInterrupt: after writing a report of what had finished.
    """
    from posenc.bench.harness import run_bench
    from posenc.bench.models import ModelStore
    from posenc.bench.workloads import workload_key
    from posenc.report.demo_report import write_demo_report

    started = time.perf_counter()
    out = Path(options.output)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("bench", "parity"):  # a previous run's results must not appear in this run's report
        shutil.rmtree(out / stale, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix="posenc-demo-"))
    models = out / "models" if options.keep_models else scratch / "models"
    for folder in (models, out / "parity", scratch / "sweep"):
        folder.mkdir(parents=True, exist_ok=True)
    jobs = plan_jobs(options, models, out / "parity")
    schemes = list(dict.fromkeys(j.scheme for j in jobs))
    result: dict[str, Any] = {
        "options": {**dataclasses.asdict(options), "output": str(options.output)},
        "config": options.config.to_dict(),
        "schemes": schemes,
        "engine": {
            "backend": jobs[0].engine_backend if jobs else None,
            "reason": jobs[0].engine_reason if jobs else "",
            "targets": list(jobs[0].engine_targets) if jobs else [],
        },
        "pipeline": [],
        "sweep": {},
        "status": "running",
    }
    bar = Progress(len(jobs) + 1, enabled=options.progress)
    bench_doc = None
    try:
        bar.show(f"pipeline: {len(jobs)} scheme/table-mode pairs in {options.jobs} worker(s)")
        _submit_all(options, jobs, scratch / "sweep", bar, result["pipeline"], result["sweep"])
        bar.close()
        result["stage_seconds"] = {"pipeline": round(time.perf_counter() - started, 1)}
        store = ModelStore(scratch / "bench-models")
        for record in result["pipeline"]:
            if record["export"]["status"] != "ok":
                continue
            key = workload_key(
                record["scheme"], "block", record["table_mode"], options.config, options.config.max_position_embeddings
            )
            optimized = (
                {"ort-cpu": Path(record["optimize"]["path"])}
                if record.get("optimize", {}).get("status") == "ok"
                else {}
            )
            notes = {"ort-cpu": {"passes": record["optimize"]["passes"]}} if optimized else {}
            store.adopt(key, Path(record["export"]["path"]), optimized, notes)
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
        result["stage_seconds"]["bench"] = round(time.perf_counter() - bench_started, 1)
        result["status"] = "complete"
    except KeyboardInterrupt:
        result["status"] = "interrupted"
        raise
    finally:
        bar.close()
        result["pipeline"].sort(key=lambda r: (r["scheme"], r["table_mode"]))
        result["seconds"] = round(time.perf_counter() - started, 1)
        if bench_doc is None and (out / "bench" / "bench.json").exists():
            from posenc.bench.results import BenchDocument

            bench_doc = BenchDocument.load(out / "bench" / "bench.json")
        atomic_write_text(out / RESULT_NAME, json.dumps(result, indent=1, default=str) + "\n")
        write_demo_report(result, bench_doc, out)
        shutil.rmtree(scratch, ignore_errors=True)
    return result


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------

EPILOG = """\
Examples:
  posenc demo                          # every scheme, both table modes, Llama-like block -> ./report
  posenc demo --quick -o /tmp/report   # tiny block, one table mode per scheme (about a minute)
  posenc demo -s rope -s alibi -o report-rope-alibi --keep-models

Writes OUT/report.md, OUT/report.html (self-contained), OUT/demo.json, the PNG plots, OUT/parity/*.md
(per-model parity tables) and OUT/bench/ (benchmark JSON and Markdown).
"""


def _run(args: argparse.Namespace) -> int:
    schemes = tuple(split_names(args.scheme))
    options = DemoOptions(
        output=Path(args.output),
        quick=args.quick,
        schemes=schemes,
        jobs=args.jobs,
        threads=args.threads,
        engine_targets=tuple(args.engine_target or ()),
        keep_models=args.keep_models,
        progress=not args.quiet,
    )
    resolve_schemes(options.schemes or None)  # unknown names fail before any work
    result = run_demo(options)
    if args.json:
        print((options.output / RESULT_NAME).read_text(), end="")
        return 0
    parity = [p for r in result["pipeline"] for p in r.get("parity", {}).values()]
    passed = sum(1 for p in parity if p.get("passed"))
    print(
        f"{len(result['schemes'])} schemes, {passed}/{len(parity)} graphs match eager PyTorch on ONNX Runtime; "
        f"{result['seconds']:.0f} s."
    )
    print(f"report: {Path(args.output) / 'report.html'} and report.md")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``posenc demo`` to the CLI."""
    p = subparsers.add_parser(
        "demo",
        help="run the whole pipeline for every scheme and write a report (no arguments needed)",
        description="Export -> optimize -> validate on ONNX Runtime -> TensorRT engine (when a backend is "
        "installed) -> benchmark, for every registered scheme on an embedded Llama-like attention block; "
        "writes report.md and a self-contained report.html.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add(p, "output", default="report", note="the report folder (default: report)")
    p.add_argument("--quick", action="store_true", help="tiny block, one table mode per scheme, short benchmark")
    add(p, "scheme", repeat=True, note="or comma-separated; default: every registered scheme")
    p.add_argument("--jobs", type=int, default=DemoOptions.jobs, help=f"worker processes (default {DemoOptions.jobs})")
    add(p, "threads", default=DemoOptions.threads, note="of the benchmark; default: all CPUs")
    add(p, "engine_target", repeat=True, note="default: sm89 with TensorRT-RTX, the local GPU with tensorrt")
    add(p, "keep_models")
    add(p, "quiet")
    add(p, "json", note="what the report shows (OUT/demo.json)")
    p.set_defaults(func=_run)


if __name__ == "__main__":  # pragma: no cover
    from posenc.cli import main

    sys.exit(main(["demo", *sys.argv[1:]]))
