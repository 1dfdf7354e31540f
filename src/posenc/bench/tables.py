"""Markdown tables of a benchmark document: backends, targets, latency per backend, roofline ratios."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posenc.bench.results import BenchDocument, BenchRecord


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table (pipes in cells are escaped)."""

    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def format_seconds(seconds: float | None) -> str:
    """``0.00123`` -> ``1.23 ms``; µs below a millisecond."""
    if seconds is None:
        return "—"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.2f} ms"


def backend_rows(doc: BenchDocument) -> tuple[list[str], list[list[str]]]:
    headers = ["backend", "what", "status"]
    rows = [
        [name, info.description, "available" if info.available else f"skipped: {info.reason}"]
        for name, info in doc.backends.items()
    ]
    return headers, rows


def target_rows(doc: BenchDocument) -> tuple[list[str], list[list[str]]]:
    headers = ["target", "measured", "needed", "verdict", "detail"]
    rows = []
    for t in doc.targets:
        measured = "—" if t.measured is None else f"{t.measured:.2f}"
        verdict = {True: "PASS", False: "MISS", None: "not measured"}[t.passed]
        rows.append([t.name, measured, f"≥ {t.threshold:.2f}", verdict, t.detail])
    return headers, rows


def subject(r: BenchRecord) -> str:
    """What a record timed: its scheme, or the artifact's file name and its scheme."""
    return r.scheme if r.artifact is None else f"{r.artifact} ({r.scheme})"


def _case_key(r: BenchRecord) -> tuple[Any, ...]:
    c = r.config
    return (subject(r), r.unit, r.table_mode, r.shape, c.num_heads, c.num_kv_heads, c.head_dim)


def latency_rows(doc: BenchDocument) -> tuple[list[str], list[list[str]]]:
    """One row per case; per backend the median (p90); then the best bytes/s and its share of copy bandwidth."""
    backends = list(doc.backends) or list(dict.fromkeys(r.backend for r in doc.records))
    cases: dict[tuple[Any, ...], dict[str, BenchRecord]] = {}
    for record in doc.records:
        cases.setdefault(_case_key(record), {})[record.backend] = record
    headers = ["scheme", "unit", "tables", "shape", "H/Hkv/D", *backends, "best GB/s", "% of copy BW", "% of GEMM"]
    rows = []
    for key, by_backend in cases.items():
        scheme, unit, mode, shape, h, hkv, d = key
        cells = []
        for name in backends:
            r = by_backend.get(name)
            if r is None:
                cells.append("")
            elif r.status == "ok":
                cells.append(f"{format_seconds(r.median)} ({format_seconds(r.timing.p90 if r.timing else None)})")
            else:
                cells.append(r.status)
        ok = [r for r in by_backend.values() if r.status == "ok" and r.bytes_per_s]
        best = max(ok, key=lambda r: r.bytes_per_s or 0.0, default=None)
        gbs = "—" if best is None else f"{(best.bytes_per_s or 0.0) / 1e9:.1f} ({best.backend})"
        share = "—" if best is None or best.roofline_ratio is None else f"{100 * best.roofline_ratio:.0f} %"
        compute = max((r.flops_ratio for r in by_backend.values() if r.flops_ratio is not None), default=None)
        gemm = "—" if compute is None else f"{100 * compute:.0f} %"
        rows.append([scheme, unit, mode, shape.label, f"{h}/{hkv}/{d}", *cells, gbs, share, gemm])
    return headers, rows


def is_decode(record: BenchRecord) -> bool:
    """A block step of at most 16 new tokens after a cache (bandwidth-bound: compared with its bytes floor)."""
    return record.unit.startswith("block") and record.shape.past > 0 and record.shape.seq <= 16


def decode_rows(doc: BenchDocument) -> tuple[list[str], list[list[str]]]:
    """Decode steps against their bytes floor: one row per (case, cache layout, backend) that ran."""
    headers = ["scheme", "cache", "shape", "backend", "median", "bytes floor", "floor GB/s", "copy GB/s", "% of floor"]
    rows = []
    for r in doc.ok():
        if not is_decode(r) or not r.bytes_per_s:
            continue
        copy = r.copy_bytes_per_s or (doc.copy_bandwidth.bytes_per_s if doc.copy_bandwidth else None)
        layout = "in-place" if r.unit == "block-inplace" else "concat"
        share = "—" if r.roofline_ratio is None else f"{100 * r.roofline_ratio:.0f} %"
        floor = f"{(r.bytes_moved or 0) / 1e6:.1f} MB"
        copy_text = "—" if copy is None else f"{copy / 1e9:.1f}"
        rows.append(
            [subject(r), layout, r.shape.label, r.backend, format_seconds(r.median), floor,
             f"{r.bytes_per_s / 1e9:.1f}", copy_text, share]
        )  # fmt: skip
    return headers, rows


def artifact_rows(doc: BenchDocument) -> tuple[list[str], list[list[str]]]:
    """A user's artifacts (``posenc bench MODEL.onnx``): each call against its floor from the same rounds — a
    prefill as a share of a GEMM of its FLOPs, a decode step as a share of the copy bandwidth over its bytes floor."""
    headers = ["artifact", "unit", "dtype", "shape", "backend", "median", "floor", "share of floor"]
    rows = []
    for r in doc.ok():
        if r.artifact is None:
            continue
        if r.flops_ratio is not None:
            floor, share = "GEMM of the same FLOPs", f"{100 * r.flops_ratio:.0f} %"
        elif r.roofline_ratio is not None:
            floor, share = f"copy of {(r.bytes_moved or 0) / 1e6:.1f} MB", f"{100 * r.roofline_ratio:.0f} %"
        else:
            floor, share = "—", "—"
        rows.append(
            [r.artifact, r.unit, r.dtype or "—", r.shape.label, r.backend, format_seconds(r.median), floor, share]
        )
    return headers, rows


def guard_rows(doc: BenchDocument) -> tuple[list[str], list[list[str]]]:
    """The position guard's cost: each graph timed with and without it in the same rounds (``--guard-cost``)."""
    headers = ["scheme", "unit", "shape", "backend", "guarded", "unguarded", "guard cost"]
    rows = [
        [subject(r), r.unit, r.shape.label, r.backend, format_seconds(r.median), format_seconds(r.unguarded.median),
         f"{100 * r.guard_cost:+.1f} %"]
        for r in doc.ok()
        if r.unguarded is not None and r.guard_cost is not None
    ]  # fmt: skip
    return headers, rows


def skip_rows(doc: BenchDocument) -> tuple[list[str], list[list[str]]]:
    """Distinct reasons of skipped and failed records, with how many records each covers."""
    counts: dict[tuple[str, str, str], int] = {}
    for r in doc.records:
        if r.status != "ok":
            counts[(r.status, r.backend, r.reason)] = counts.get((r.status, r.backend, r.reason), 0) + 1
    rows = [[status, backend, str(n), reason] for (status, backend, reason), n in counts.items()]
    return ["status", "backend", "records", "reason"], rows


def bench_markdown(doc: BenchDocument, plots: bool = True) -> str:
    """The whole benchmark report as Markdown (plots referenced as sibling PNG files)."""
    bw = doc.copy_bandwidth
    machine = doc.machine
    timing = doc.settings.timing
    lines = [
        "# posenc bench",
        "",
        f"Status: **{doc.status}**, started {doc.created}"
        + (f", finished {doc.finished}" if doc.finished else "")
        + ".",
        f"Machine: {machine.processor or '?'}, {machine.cpu_count or '?'} CPUs; "
        f"torch {machine.torch}, "
        f"onnxruntime {machine.onnxruntime}, posenc {machine.posenc}.",
        f"Threads: {doc.settings.threads}; warm-up {timing.warmup}, up to {timing.repeats} timed "
        f"calls (at most {timing.max_seconds} s each measurement); IOBinding with preallocated outputs, "
        "ONNX Runtime threads do not spin between runs.",
    ]
    if bw is not None:
        lines.append(
            f"Copy bandwidth (same run): **{bw.bytes_per_s / 1e9:.1f} GB/s** ({bw.mib} MiB numpy copy, read + write "
            f"counted, median of {bw.repeats})."
        )
    lines += [
        "Bytes per call: for an op, inputs read + outputs written; for a block, the step's bytes floor (projection "
        "weights + hidden in and out + every cached and new key and value read once + the new ones written once, "
        "whatever the cache layout). `% of copy BW` = those bytes per second ÷ the copy bandwidth (the roofline "
        "ratio; above 100 % the working set stayed in the CPU caches; ops moving ≥ 32 MiB per call and decode steps "
        "are divided by a copy timed in the same alternating rounds). `% of GEMM` (prefill blocks): the block's "
        "FLOPs (projections + dense QKᵀ and PV) per second ÷ those of an ONNX Runtime GEMM of the same FLOPs timed in "
        "the same rounds. Latency cells: median (p90); the backends of one row (and a block's two cache layouts) "
        "were timed in alternating rounds.",
        "",
        "## Backends",
        "",
        markdown_table(*backend_rows(doc)),
    ]
    headers, rows = artifact_rows(doc)
    if rows:
        lines += ["", "## Your artifacts against their floors (same rounds)", "", markdown_table(headers, rows)]
    if doc.targets:
        lines += ["", "## Targets", "", markdown_table(*target_rows(doc))]
    lines += ["", "## Latency", "", markdown_table(*latency_rows(doc))]
    headers, rows = decode_rows(doc)
    if rows:
        lines += ["", "## Decode against its bytes floor", "", markdown_table(headers, rows)]
    headers, rows = guard_rows(doc)
    if rows:
        lines += ["", "## Position guard cost (same rounds)", "", markdown_table(headers, rows)]
    headers, rows = skip_rows(doc)
    if rows:
        lines += ["", "## Skipped and failed", "", markdown_table(headers, rows)]
    if plots and doc.ok():
        lines += ["", "## Plots", "", "![latency](latency.png)", "", "![roofline](roofline.png)"]
    return "\n".join(lines) + "\n"
