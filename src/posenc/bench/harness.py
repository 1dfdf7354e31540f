"""Runs a benchmark plan: copy bandwidth first, then every case on every backend, saving as it goes.

Within a case every backend (and every unit the case times together, e.g. a block's two cache layouts) runs in
alternating rounds, with a copy timed alongside large ops and decode steps (their bytes' roofline) and a GEMM of the
same FLOPs alongside prefill blocks (their compute roofline).

Results are written after each measurement (``bench.json``, ``bench.md``); plots when the run ends.
Ctrl-C keeps everything measured so far: the document is marked ``interrupted``, written out, and the
interrupt propagates (``posenc bench`` exits with status 130).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from posenc.artifacts.files import write_text_atomic
from posenc.bench.artifact import artifact_workload
from posenc.bench.backends import Backend, Runner, get_backends
from posenc.bench.bandwidth import CopyBandwidth, CopyRunner, measure_copy_bandwidth
from posenc.bench.gemm import GemmRunner
from posenc.bench.models import ModelStore, SkipCase
from posenc.bench.plan import BenchCase
from posenc.bench.progress import Progress
from posenc.bench.results import BackendInfo, BenchDocument, BenchRecord
from posenc.bench.tables import format_seconds
from posenc.bench.timing import RunSettings, Timing, measure, measure_interleaved
from posenc.bench.workloads import BLOCK_UNITS, Workload, build_workload
from posenc.errors import PosencError

JSON_NAME = "bench.json"
COPY_RUNNER = "copy"
"""Name of the copy timed alongside large ops and decode steps (never a backend name)."""
GEMM_RUNNER = "gemm"
"""Name of the GEMM timed alongside prefill blocks (never a backend name)."""
MARKDOWN_NAME = "bench.md"


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Set PyTorch's intra-op thread count for the block, restoring it afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def run_bench(
    cases: Sequence[BenchCase],
    settings: RunSettings | None = None,
    output: str | Path | None = None,
    *,
    progress: bool = True,
    bandwidth: CopyBandwidth | None = None,
    on_record: Callable[[BenchRecord], None] | None = None,
    store: ModelStore | None = None,
) -> BenchDocument:
    """Measure every case on each of its backends and return (and, with ``output``, write) the results.

    Args:
        cases: from :func:`posenc.bench.plan.make_plan` or :func:`~posenc.bench.plan.targets_plan`.
        settings: timing, threads, bandwidth measurement (default :class:`RunSettings()`).
        output: folder for ``bench.json``, ``bench.md`` and the plots; ``None`` writes nothing.
        progress: show a progress bar on stderr.
        bandwidth: a copy bandwidth measured already in this run (else measured here first).
        on_record: called after each record (tests use it to interrupt a run).
        store: graphs already exported / optimized (``posenc demo`` passes its own); the caller closes it.

    Raises:
        KeyboardInterrupt: after the partial results are written.
    """
    settings = settings or RunSettings()
    out = None if output is None else Path(output)
    doc = BenchDocument(settings=settings)
    backend_map = _backends_of(cases)
    doc.backends = {
        name: BackendInfo(b.description, b.unavailable() is None, b.unavailable() or "")
        for name, b in backend_map.items()
    }
    total = sum(len(c.backends) for c in cases)
    bar = Progress(total, enabled=progress)
    store_folder = out / "models" if (out is not None and settings.keep_models) else None
    try:
        bar.show("measuring copy bandwidth")
        doc.copy_bandwidth = bandwidth or measure_copy_bandwidth(settings.copy_mib, settings.copy_repeats)
        _save(doc, out, plots=False)
        with torch_threads(settings.threads), contextlib.ExitStack() as stack:
            if store is None:
                store = stack.enter_context(ModelStore(store_folder, position_guard=settings.position_guard))
            unguarded = None
            if settings.guard_cost:
                folder = None if store_folder is None else store_folder / "unguarded"
                unguarded = stack.enter_context(ModelStore(folder, position_guard=False))
            for case in cases:
                for record in _run_case(case, backend_map, store, settings, bar, unguarded):
                    doc.add(record)
                    _save(doc, out, plots=False)
                    if on_record is not None:
                        on_record(record)
        doc.finish("complete")
    except KeyboardInterrupt:
        doc.finish("interrupted")
        bar.close()
        _save(doc, out, plots=settings.plots)
        raise
    bar.close()
    from posenc.bench.targets import evaluate_targets

    doc.targets = evaluate_targets(doc)
    _save(doc, out, plots=settings.plots)
    return doc


def _backends_of(cases: Sequence[BenchCase]) -> dict[str, Backend]:
    names: list[str] = []
    for case in cases:
        names.extend(n for n in case.backends if n not in names)
    return {b.name: b for b in get_backends(names)} if names else {}


def _record(
    case: BenchCase, backend: str, status: str, reason: str = "", unit: str | None = None, **extra: Any
) -> BenchRecord:
    return BenchRecord(
        scheme=case.scheme,
        unit=case.unit if unit is None else unit,
        table_mode=case.table_mode,
        backend=backend,
        shape=case.shape,
        config=case.config,
        status=status,
        reason=reason,
        artifact=None if case.artifact is None else Path(case.artifact).name,
        dtype=case.dtype,
        **extra,
    )


def _run_case(
    case: BenchCase,
    backends: dict[str, Backend],
    store: ModelStore,
    settings: RunSettings,
    bar: Progress,
    unguarded: ModelStore | None = None,
) -> Iterator[BenchRecord]:
    """Yield one record per backend of ``case`` (and per backend of each of its :attr:`~BenchCase.with_units`);
    with an ``unguarded`` store, each graph also runs exported without the position guard, in the same rounds."""
    units = (case.unit, *case.with_units)
    if case.skip_reason:
        for unit in units:
            for name in case.backends:
                bar.step(f"{case.label} {name}: skipped")
                yield _record(case, name, "skipped", case.skip_reason, unit=unit)
        return
    bar.show(f"{case.label}: building")
    workloads: dict[str, Workload] = {}
    records: dict[tuple[str, str], BenchRecord] = {}
    for unit in units:
        try:
            if case.artifact is not None:
                workloads[unit] = artifact_workload(case.artifact, case.shape)
            else:
                workloads[unit] = build_workload(case.scheme, unit, case.table_mode, case.config, case.shape)
        except PosencError as exc:
            for name in case.backends:
                records[(unit, name)] = _record(case, name, "skipped", str(exc), unit=unit)
    if any(backends[name].unavailable() is None for name in case.backends):
        # Exporting tells which inputs the op reads, so every backend's byte count (and roofline ratio) is the
        # same whichever backends run; an export failure is recorded per backend below.
        for workload in workloads.values():
            with contextlib.suppress(SkipCase):
                bar.show(f"{case.label}: exporting {workload.unit}")
                store.exported(workload)
    runners: dict[str, Runner] = {}
    for unit, workload in workloads.items():
        for name in case.backends:
            backend = backends[name]
            reason = backend.unavailable()
            if reason:
                records[(unit, name)] = _record(case, name, "skipped", reason, unit=unit)
                continue
            bar.show(f"{case.label} {name} {unit}: preparing")
            try:
                runners[_runner_name(name, unit, case)] = backend.prepare(workload, store, settings.threads)
            except SkipCase as exc:
                records[(unit, name)] = _record(case, name, "skipped", str(exc), unit=unit)
            except Exception as exc:  # one broken case must not end a long run; the message goes into the report
                records[(unit, name)] = _record(case, name, "error", f"{type(exc).__name__}: {exc}", unit=unit)
                continue
            if unguarded is not None and backend.runs_graph:
                with contextlib.suppress(Exception):  # without its unguarded twin a record just has no guard cost
                    runner = backend.prepare(workload, unguarded, settings.threads)
                    runners[_runner_name(name, unit, case) + UNGUARDED] = runner
    if runners:
        main = workloads.get(case.unit) or next(iter(workloads.values()))
        copy = _copy_alongside(case, main, settings, store)
        gemm = _gemm_alongside(main, settings, store)
        for label, alongside in ((COPY_RUNNER, copy), (GEMM_RUNNER, gemm)):
            if alongside is not None:
                runners[label] = alongside
        bar.show(f"{case.label}: timing {', '.join(runners)}")
        outcomes = _time_runners(runners, settings)
        copy_timing, gemm_timing = outcomes.pop(COPY_RUNNER, None), outcomes.pop(GEMM_RUNNER, None)
        copy_bps = copy.bytes_per_call / copy_timing.median if copy and isinstance(copy_timing, Timing) else None
        gemm_fps = gemm.flops_per_call / gemm_timing.median if gemm and isinstance(gemm_timing, Timing) else None
        for unit, workload in workloads.items():
            for name in case.backends:
                outcome = outcomes.get(_runner_name(name, unit, case))
                if outcome is None:
                    continue
                if isinstance(outcome, Exception):
                    records[(unit, name)] = _record(
                        case, name, "error", f"{type(outcome).__name__}: {outcome}", unit=unit
                    )
                else:
                    record = _ok_record(case, name, workload, outcome, store)
                    record.copy_bytes_per_s, record.gemm_flops_per_s = copy_bps, gemm_fps
                    twin = outcomes.get(_runner_name(name, unit, case) + UNGUARDED)
                    record.unguarded = twin if isinstance(twin, Timing) else None
                    records[(unit, name)] = record
    runners.clear()  # release sessions before the next case allocates
    for unit in units:
        for name in case.backends:
            record = records[(unit, name)]
            done = format_seconds(record.median) if record.status == "ok" else record.status
            bar.step(f"{case.label} {name} {unit}: {done}")
            yield record


UNGUARDED = " (unguarded)"
"""Suffix of the runner of a graph exported without the position guard (:attr:`RunSettings.guard_cost`)."""


def _runner_name(backend: str, unit: str, case: BenchCase) -> str:
    return backend if unit == case.unit else f"{backend}[{unit}]"


DECODE_MAX_SEQ = 16
"""Calls of at most this many new tokens after a cache are decode steps (bandwidth-bound); longer ones prefill."""
PREFILL_MIN_SEQ = 64
"""Block calls of at least this many tokens are compared with a GEMM of their FLOPs."""


def _copy_alongside(case: BenchCase, workload: Workload, settings: RunSettings, store: ModelStore) -> Any:
    """A copy to time with a large memory-bound op or a decode step (see :attr:`RunSettings.copy_alongside_mib`),
    else None."""
    limit = settings.copy_alongside_mib
    if not limit:
        return None
    decode = workload.unit in BLOCK_UNITS and case.shape.past > 0 and case.shape.seq <= DECODE_MAX_SEQ
    large_op = case.unit.startswith("op") and workload.bytes_moved >= limit * (1 << 20)
    if not (decode or large_op):
        return None
    return store.cached(("copy", settings.copy_mib), lambda: CopyRunner(settings.copy_mib))


def _gemm_alongside(workload: Workload, settings: RunSettings, store: ModelStore) -> GemmRunner | None:
    """A GEMM of a prefill block call's FLOPs, to time in the same rounds (else None)."""
    if not settings.copy_alongside_mib or workload.flops is None or workload.shape.seq < PREFILL_MIN_SEQ:
        return None
    rows, width = workload.shape.batch * workload.shape.seq, workload.config.hidden_size
    key = ("gemm", workload.flops, rows, width, settings.threads)
    return store.cached(key, lambda: GemmRunner.matching(workload.flops or 0, rows, width, settings.threads))


def _time_runners(runners: dict[str, Runner], settings: RunSettings) -> dict[str, Timing | Exception]:
    """Interleaved timing of every runner; when one fails, the others are timed alone so they still count."""
    try:
        return dict(measure_interleaved(runners, settings.timing))
    except KeyboardInterrupt:
        raise
    except Exception:
        outcomes: dict[str, Timing | Exception] = {}
        for name, run in runners.items():
            try:
                outcomes[name] = measure(run, settings.timing)
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                outcomes[name] = exc
        return outcomes


GRAPH_TARGETS = {"ort-cpu-fused": "ort-cpu", "ort-cpu-gqa": "ort-cuda", "ort-cuda-fused": "ort-cuda"}
"""Backend -> the ``posenc optimize`` target of the graph it runs (its optimization record goes into the record)."""


def _ok_record(case: BenchCase, name: str, workload: Workload, timing: Timing, store: ModelStore) -> BenchRecord:
    target = GRAPH_TARGETS.get(name)
    graph = store.graph_notes.get((workload.key, target)) if target else None
    return _record(
        case,
        name,
        "ok",
        unit=workload.unit,
        timing=timing,
        bytes_moved=workload.bytes_moved,
        bytes_per_s=workload.bytes_moved / timing.median,
        graph=graph,
        flops=workload.flops,
    )


def _save(doc: BenchDocument, out: Path | None, plots: bool) -> None:
    _fill_ratios(doc)
    if out is None:
        return
    from posenc.bench.tables import bench_markdown

    out.mkdir(parents=True, exist_ok=True)
    doc.save(out / JSON_NAME)
    write_text_atomic(out / MARKDOWN_NAME, bench_markdown(doc, plots=plots))
    if plots and doc.ok():
        from posenc.bench.plots import write_plots

        write_plots(doc, out)


def _fill_ratios(doc: BenchDocument) -> None:
    for record in doc.records:
        if record.flops and record.gemm_flops_per_s and record.median:
            record.flops_ratio = record.flops / record.median / record.gemm_flops_per_s
        if record.bytes_per_s is None:
            continue
        if record.copy_bytes_per_s:
            record.roofline_ratio = record.bytes_per_s / record.copy_bytes_per_s
        elif doc.copy_bandwidth is not None:
            record.roofline_ratio = record.bytes_per_s / doc.copy_bandwidth.bytes_per_s
