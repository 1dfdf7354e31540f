"""The ``posenc demo`` report: parity matrix, error against position, latency and roofline, engine builds,
RoPE's long-range decay; rendered to ``report.md`` and a self-contained ``report.html``.

Reads the typed records of :mod:`posenc.demo.records` and the benchmark's :class:`~posenc.bench.BenchDocument`;
renders with :mod:`posenc.report` (which knows nothing of the demo).
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from pathlib import Path

from posenc.bench.plots import plot_latency, plot_roofline
from posenc.bench.results import BenchDocument
from posenc.bench.tables import backend_rows, decode_rows, latency_rows, skip_rows, target_rows
from posenc.demo.records import CheckpointParity, DemoResult, ParityStage, PipelineRecord, SweepStage
from posenc.report.decay import plot_rope_decay
from posenc.report.document import Report
from posenc.report.positions import plot_error_vs_position, series_label
from posenc.schemes.base import TableMode

GRAPHS = ("exported", "ort-cpu")
GRAPH_TITLES = {"exported": "exported", "ort-cpu": "optimized (ort-cpu)"}
MODES = tuple(mode.value for mode in TableMode)


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.1e}"


def parity_cell(stage: ParityStage | None) -> str:
    """``PASS 2.4e-07`` / ``FAIL 3.1e-02 > atol 2e-05`` / ``ERROR`` / ``not run`` for one graph's parity."""
    if stage is None:
        return "not run"
    if not stage.ok:
        return f"ERROR ({_short(stage.reason)})"
    if stage.passed:
        return f"PASS {_fmt(stage.max_abs)}"
    worst = stage.worst
    if worst is None:
        return "FAIL — > atol 0 (?)"
    return f"FAIL {_fmt(worst.max_abs)} > atol {worst.atol:g} ({worst.output})"


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _records(result: DemoResult) -> dict[tuple[str, str], PipelineRecord]:
    return {(r.scheme, r.table_mode): r for r in result.pipeline}


def parity_matrix(result: DemoResult) -> tuple[list[str], list[list[str]]]:
    """Rows: schemes; columns: table mode x graph; cells: :func:`parity_cell` or ``n/a`` (mode not supported)."""
    from posenc.schemes import get_spec

    records = _records(result)
    headers = ["scheme"] + [f"{mode}: {GRAPH_TITLES[g]}" for mode in MODES for g in GRAPHS]
    rows = []
    for scheme in result.schemes:
        supported = {m.value for m in get_spec(scheme).table_modes}
        row = [scheme]
        for mode in MODES:
            record = records.get((scheme, mode))
            for graph in GRAPHS:
                if mode not in supported:
                    row.append("n/a")
                elif record is None:
                    row.append("not run")
                elif not record.export.ok:
                    row.append(f"ERROR (export: {_short(record.export.reason)})")
                else:
                    row.append(parity_cell(record.parity.get(graph)))
        rows.append(row)
    return headers, rows


def parity_counts(result: DemoResult) -> tuple[int, int]:
    """(graphs that passed, graphs validated or attempted)."""
    stages = result.parity_stages()
    failed_exports = sum(1 for r in result.pipeline if not r.export.ok)
    return sum(1 for p in stages if p.ok and p.passed), len(stages) + failed_exports


def _pipeline_rows(result: DemoResult) -> tuple[list[str], list[list[str]]]:
    headers = ["scheme", "tables", "export", "ONNX size", "fusions for ort-cpu (matches)", "optimize"]
    rows = []
    for r in result.pipeline:
        export = r.export
        size = f"{export.bytes / 1e6:.1f} MB" if export.ok else "—"
        opt = r.optimize
        if opt is not None and opt.ok:
            fused = {k: v for k, v in opt.counts.items() if v and k != "cleanup"}
            fusions = ", ".join(f"{k} {v}" for k, v in fused.items()) or "none applied"
            opt_cell = f"{opt.seconds:.1f} s"
        else:
            fusions = "—"
            opt_cell = f"ERROR ({_short(opt.reason or 'not run')})" if opt is not None else "not run"
        export_cell = f"{export.seconds:.1f} s" if export.ok else f"ERROR ({_short(export.reason)})"
        rows.append([r.scheme, r.table_mode, export_cell, size, fusions, opt_cell])
    return headers, rows


def _engine_rows(result: DemoResult) -> tuple[list[str], list[list[str]]]:
    headers = ["scheme", "tables", "result", "graph", "backend / targets", "build time", "engine size", "reason"]
    rows = []
    for r in result.pipeline:
        e = r.engine
        if e is None:
            rows.append([r.scheme, r.table_mode, "not run", "", "", "", "", "export failed"])
            continue
        status = {"built": "PASS built", "failed": "FAIL", "skipped": "SKIPPED"}.get(e.status, e.status)
        where = f"{e.backend} {', '.join(e.targets)}".strip()
        size = f"{e.bytes / 1e6:.1f} MB" if e.bytes is not None else ""
        seconds = f"{e.seconds:.1f} s" if e.seconds is not None else ""
        reason = e.reason or e.graph_reason
        rows.append([r.scheme, r.table_mode, status, e.graph, where, seconds, size, _short(reason, 200)])
    return headers, rows


def _sweep_rows(sweep: SweepStage) -> tuple[list[str], list[list[str]]]:
    report = sweep.report
    if report is None:
        return ["series", "verdict"], []
    buckets = [f"[{lo}, {hi})" for lo, hi in report.buckets]
    headers = ["series", *buckets, "verdict"]
    rows = []
    for s in report.series:
        cells = [f"{b.max_abs:.1e}" for b in s.buckets]
        verdict = "PASS" if s.passed else "FAIL"
        if not s.rounding_required and s.dtype == "float16" and s.table_dtype != "float32":
            verdict += " (fp16 tables: shown for their cost)"
        rows.append([series_label(s), *cells, verdict])
    return headers, rows


_HF_REFERENCES = ("hf-fp32", "hf-fp64, fp64 angles", "hf-fp32 (informational)")


def _checkpoint_cell(parity: list[CheckpointParity], mode: str, graph: str) -> str:
    match = [p for p in parity if p.table_mode == mode and p.graph == graph]
    if not match:
        return "n/a"
    stage = match[0]
    if not stage.ok:
        return f"ERROR: {_short(stage.reason)}"
    errors = " / ".join(_fmt(stage.worst.get(name)) for name in _HF_REFERENCES)
    return f"{'PASS' if stage.passed else 'FAIL'} {errors} ([table](parity/{stage.details}))"


def checkpoint_rows(result: DemoResult) -> tuple[list[str], list[list[str]]]:
    """One row per sample checkpoint and table mode: exported and optimized graphs against the transformers module."""
    headers = ["checkpoint", "model type", "layer", "table mode", "exported graph", "optimized (ort-cpu)", "engine"]
    rows = []
    for record in result.checkpoints:
        layer = f"{'first' if record.layer is None else record.layer}"
        layer += f" ({record.layer_type})" if record.layer_type else ""
        engine = record.engine
        built = engine is not None and engine.status == "built"
        engine_cell = (
            f"built ({', '.join(engine.targets)})" if built and engine is not None
            else (f"{engine.status.upper()}: {_short(engine.reason)}" if engine is not None else "-")
        )  # fmt: skip
        head = [record.sample, record.model_type, layer]
        if not record.checkpoint.ok:
            rows.append([*head, "-", f"ERROR: {_short(record.checkpoint.reason)}", "", engine_cell])
            continue
        for mode in dict.fromkeys(p.table_mode for p in record.parity):
            cells = [_checkpoint_cell(record.parity, mode, graph) for graph in ("exported", "ort-cpu")]
            rows.append([*head, mode, *cells, engine_cell])
    return headers, rows


def _scheme_rows(schemes: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    from posenc.schemes import get_spec

    rows = []
    for name in schemes:
        spec = get_spec(name)
        modes = ", ".join(sorted(m.value for m in spec.table_modes))
        rows.append([name, spec.title, spec.family, spec.placement.value, modes])
    return ["scheme", "what", "family", "acts at", "table modes"], rows


def _machine_line(bench_doc: BenchDocument | None) -> str:
    machine = bench_doc.machine if bench_doc is not None else None
    cpu = (machine.processor if machine else "") or platform.processor() or platform.machine()
    cores = machine.cpu_count if machine and machine.cpu_count else "?"
    return f"{cpu}, {cores} CPUs, {platform.system()}"


def write_demo_report(result: DemoResult, bench_doc: BenchDocument | None, folder: str | Path) -> tuple[Path, Path]:
    """Render the demo results (``demo.json`` content) and the benchmark document into ``folder``.

    Writes the plots (``rope_decay.png``, ``error_vs_position.png``, ``latency.png``, ``roofline.png``) next
    to ``report.md`` and ``report.html``.

    Returns:
        ``(report.md, report.html)``.
    """
    folder = Path(folder)
    config = result.config
    schemes = list(result.schemes)
    passed, total = parity_counts(result)
    engine = result.engine
    report = Report("posenc demo report")
    mode = "quick" if result.options.quick else "full"
    report.text(
        f"Status: **{result.status}** ({mode} run, {result.seconds:.0f} s on {_machine_line(bench_doc)}). "
        f"Block: hidden {config.hidden_size}, {config.num_heads} query heads, "
        f"{config.num_kv_heads} key/value heads, head_dim {config.head_dim}, causal, "
        f"{config.max_position_embeddings} positions; float32. Each scheme runs export → optimize → "
        f"validate on ONNX Runtime → TensorRT engine → benchmark."
    )
    built = sum(1 for r in result.pipeline if r.engine is not None and r.engine.status == "built")
    engine_line = (
        f"TensorRT engines: {built} of {len(result.pipeline)} built ahead of time with "
        f"`{engine.backend}` for {', '.join(engine.targets or ['its default targets'])}."
        if engine.backend
        else f"TensorRT engines: SKIPPED ({engine.reason or 'no backend'})."
    )
    checkpoints = result.checkpoints
    checkpoint_line = (
        f"Real checkpoints: **{sum(r.passed for r in checkpoints)} of {len(checkpoints)}** model families' layers "
        f"(tiny seeded checkpoints) PASS against their own transformers attention module, exported and optimized."
        if checkpoints
        else f"Real checkpoints: SKIPPED ({result.checkpoint_reason or 'none requested'})."
    )
    bullets = [
        checkpoint_line,
        f"Schemes: {len(schemes)} ({', '.join(f'`{s}`' for s in schemes)}).",
        f"Parity on ONNX Runtime CPU against float64 eager PyTorch: **{passed} of {total}** graphs PASS "
        f"(exported and optimized graphs, every table mode run).",
        engine_line,
    ]
    if bench_doc is not None and bench_doc.copy_bandwidth is not None:
        met = [t for t in bench_doc.targets if t.passed]
        targets = (
            f"{len(met)} of {len(bench_doc.targets)} targets met"
            if bench_doc.targets
            else "no targets at these shapes (the full demo and `posenc bench --suite targets` check them)"
        )
        bullets.append(
            f"Benchmark: copy bandwidth {bench_doc.copy_bandwidth.bytes_per_s / 1e9:.1f} GB/s measured in the same "
            f"run; {targets} (see Latency)."
        )
    report.bullets(bullets)

    report.heading("Real checkpoints")
    if checkpoints:
        report.text(
            "Each model family as a tiny seeded checkpoint (transformers `save_pretrained`, sharded), one layer "
            "exported with its own weights (`posenc export --hf-model`), validated on ONNX Runtime against the "
            "checkpoint's own transformers attention module (`posenc validate --against-hf`): fp32 with the "
            "model's own angles (`hf-fp32`, held to 1e-5) and fp64 with fp64 angles (`hf-fp64`), including a feed "
            "that ends at the context length; where transformers' own fp32 angles put `hf-fp32` itself beyond the "
            "tolerance of `hf-fp64`, its rows are informational; then optimized for ONNX Runtime CPU (validated the "
            "same way) and built into a TensorRT engine ahead of time. Cells: verdict, then the largest error "
            "against hf-fp32 (rows that count) / hf-fp64 / hf-fp32 where informational."
        )
        report.table(*checkpoint_rows(result))
    else:
        report.text(f"SKIPPED: {result.checkpoint_reason or 'no checkpoint requested'}.")

    report.heading("Schemes")
    report.table(*_scheme_rows(schemes))

    report.heading("Parity matrix")
    report.text(
        "Each exported block (and its graph optimized for ONNX Runtime CPU) against the float64 eager PyTorch "
        "reference, compared by polygraphy at several shapes other than the export sample (S = 1, odd S, longer "
        "than the sample, decode with a past, batch > 1). Cells: verdict and the largest absolute error over all "
        "shapes and outputs. Per-shape tables: `parity/SCHEME-MODE.GRAPH.md`."
    )
    report.table(*parity_matrix(result))

    report.heading("Graph optimization for ONNX Runtime CPU")
    report.table(*_pipeline_rows(result))

    report.heading("Error against position")
    sweep = result.sweep
    if sweep is not None and sweep.ok and sweep.report is not None:
        swept = sweep.report
        image = plot_error_vs_position(swept.series, folder / "error_vs_position.png", swept.max_position)
        report.text(
            f"The exported positional op run by ONNX Runtime against float64 eager PyTorch at sampled positions up to "
            f"{swept.max_position}; max absolute error per position bucket. fp16 graphs keep float32 tables; the "
            f"series with fp16 tables show what storing them in fp16 would cost."
        )
        if image is not None:
            report.image(image, "error against position")
        report.table(*_sweep_rows(sweep))
    else:
        reason = sweep.reason if sweep is not None else "not run"
        report.text(f"SKIPPED: the position sweep did not run ({_short(reason or 'not run')}).")

    report.heading("Latency")
    if bench_doc is None:
        report.text("SKIPPED: the benchmark did not run.")
    else:
        bw = bench_doc.copy_bandwidth
        timing = bench_doc.settings.timing
        report.text(
            f"Median (p90) latency per backend, {bench_doc.settings.threads} threads, warm-up "
            f"{timing.warmup}, up to {timing.repeats} timed calls, ONNX Runtime with IOBinding and "
            f"preallocated outputs. Bytes/s = the bytes a call must move / median (an op: inputs read + outputs "
            f"written; a block step: its bytes floor, projection weights + hidden in and out + every cached and new "
            f"key and value read once + the new ones written once); `% of copy BW` divides it by the copy bandwidth "
            f"measured in the same run"
            + (f" (**{bw.bytes_per_s / 1e9:.1f} GB/s**, {bw.mib} MiB numpy copy)." if bw else ".")
            + " Large memory-bound ops are divided by a copy timed in the same alternating rounds instead, so "
            "the machine's drift hits both. Shares above 100 % mean the working set stayed in the CPU caches."
        )
        if bench_doc.targets:
            report.table(*target_rows(bench_doc), caption="Targets (ratios from this one run):")
        report.table(*latency_rows(bench_doc))
        headers, rows = decode_rows(bench_doc)
        if rows:
            report.table(
                headers,
                rows,
                caption="Decode against its bytes floor: the concatenated cache (every step copies it) and the "
                "in-place cache (a step writes only its new slots), timed in the same rounds as a copy:",
            )
        latency = plot_latency(bench_doc, folder / "latency.png")
        roofline = plot_roofline(bench_doc, folder / "roofline.png")
        if latency is not None:
            report.image(latency, "median latency per scheme and backend")
        if roofline is not None:
            report.image(roofline, "bandwidth roofline: achieved bytes/s as a share of the copy bandwidth")
        report.table(*backend_rows(bench_doc), caption="Backends:")
        headers, rows = skip_rows(bench_doc)
        if rows:
            report.table(headers, rows, caption="Skipped and failed measurements:")

    report.heading("TensorRT engine builds")
    report.text(
        "Each block optimized for TensorRT (native RotaryEmbedding on [B, H, S, D], Attention with the bias as "
        "an additive mask) and built ahead of time; without a GPU an engine is built but not run."
    )
    report.table(*_engine_rows(result))

    report.heading("RoPE long-range decay (Su et al., RoFormer, 2021)")
    decay = plot_rope_decay(folder / "rope_decay.png")
    report.text(
        "f(m) = (1/(d/2)) Σ_j |Σ_{i≤j} exp(i·m·θ_i)| with d = 128 and θ_i = 10000^(−2i/d), for m = 0..256, "
        "as in the Mathematica code of Su Jianlin's post https://kexue.fm/archives/8265 (section 远程衰减; the "
        "argument is also in Su et al., RoFormer: Enhanced Transformer with Rotary Position Embedding, 2021, "
        "arXiv:2104.09864): the bound on RoPE's attention score shrinks with relative distance."
    )
    report.image(decay, "RoPE long-range decay, d = 128")

    report.heading("Files")
    report.bullets(
        [
            "`report.md`, `report.html` (self-contained: inline CSS, images embedded).",
            "`demo.json`: every stage's outcome, timings and reasons.",
            "`parity/`: per-model parity tables; `bench/`: benchmark JSON and Markdown.",
            "`models/`: ONNX graphs and engines (with `--keep-models`).",
        ]
    )
    return report.write(folder)
