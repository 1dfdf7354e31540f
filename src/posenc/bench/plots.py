"""PNG plots of a benchmark document: latency per backend and the bandwidth roofline."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc.bench.results import BenchDocument, BenchRecord
from posenc.report.figures import new_figure, save_figure

COLORS = {
    "torch": "#4c72b0",
    "ort-cpu": "#dd8452",
    "ort-cpu-fused": "#55a868",
    "ort-cuda": "#c44e52",
    "tensorrt": "#8172b3",
}


def _groups(records: Sequence[BenchRecord]) -> dict[str, list[BenchRecord]]:
    groups: dict[str, list[BenchRecord]] = {}
    for r in records:
        c = r.config
        title = f"{r.unit} · {r.shape.label} · H={c.num_heads} Hkv={c.num_kv_heads} D={c.head_dim}"
        groups.setdefault(title, []).append(r)
    return groups


def _bars(axis: Any, records: Sequence[BenchRecord], value: Any, backends: Sequence[str]) -> list[str]:
    """Grouped horizontal bars: one group per scheme/table mode, one bar per backend. Returns the labels."""
    labels = list(dict.fromkeys(f"{r.scheme} ({r.table_mode})" for r in records))
    height = 0.8 / max(len(backends), 1)
    for j, backend in enumerate(backends):
        ys, xs = [], []
        for r in records:
            if r.backend == backend:
                ys.append(labels.index(f"{r.scheme} ({r.table_mode})") + (j - (len(backends) - 1) / 2) * height)
                xs.append(value(r))
        if xs:
            axis.barh(ys, xs, height=height, color=COLORS.get(backend), label=backend)
    axis.set_yticks(range(len(labels)), labels, fontsize=8)
    axis.invert_yaxis()
    return labels


def plot_latency(doc: BenchDocument, path: str | Path) -> Path | None:
    """Median latency per scheme and backend, one panel per unit/shape/geometry (log scale)."""
    groups = _groups(doc.ok())
    if not groups:
        return None
    backends = [b for b in doc.backends if any(r.backend == b for r in doc.ok())]
    heights = [
        0.6 + 0.28 * len({(r.scheme, r.table_mode) for r in g}) * max(1, len(backends)) / 2 for g in groups.values()
    ]
    figure = new_figure(9, sum(heights) + 0.5)
    axes = figure.subplots(len(groups), 1, squeeze=False, height_ratios=heights)[:, 0]
    for axis, (title, records) in zip(axes, groups.items(), strict=True):
        _bars(axis, records, lambda r: r.median * 1e3, backends)
        axis.set_xscale("log")
        axis.set_xlabel("median latency (ms, log scale)")
        axis.set_title(title, fontsize=10)
        axis.grid(axis="x", which="both", alpha=0.3)
        axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(figure, path)


def plot_roofline(doc: BenchDocument, path: str | Path) -> Path | None:
    """Achieved bytes/s as a share of the copy bandwidth (the roofline) for every timed positional op.

    Falls back to every record when no op was timed. Lines mark the copy bandwidth (100 %) and the 85 %
    target of the RoPE op.
    """
    records = [r for r in doc.ok() if r.roofline_ratio is not None]
    ops = [r for r in records if r.unit.startswith("op")]
    records = ops or records
    if not records:
        return None
    groups = _groups(records)
    backends = [b for b in doc.backends if any(r.backend == b for r in records)]
    heights = [
        0.6 + 0.28 * len({(r.scheme, r.table_mode) for r in g}) * max(1, len(backends)) / 2 for g in groups.values()
    ]
    figure = new_figure(9, sum(heights) + 0.8)
    axes = figure.subplots(len(groups), 1, squeeze=False, height_ratios=heights)[:, 0]
    bandwidth = doc.copy_bandwidth.bytes_per_s / 1e9 if doc.copy_bandwidth else float("nan")
    for axis, (title, group) in zip(axes, groups.items(), strict=True):
        _bars(axis, group, lambda r: 100 * r.roofline_ratio, backends)
        axis.axvline(100, color="black", linewidth=1, label=f"copy bandwidth {bandwidth:.1f} GB/s")
        axis.axvline(85, color="black", linewidth=1, linestyle="--", label="85 % target")
        axis.set_xlabel("achieved bytes/s as % of copy bandwidth")
        axis.set_title(title, fontsize=10)
        axis.grid(axis="x", alpha=0.3)
        axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.suptitle("Bandwidth roofline: (inputs read + outputs written) / median latency", fontsize=11)
    return save_figure(figure, path)


def write_plots(doc: BenchDocument, folder: str | Path) -> list[Path]:
    """``latency.png`` and ``roofline.png`` in ``folder`` (those that have data)."""
    folder = Path(folder)
    written = [plot_latency(doc, folder / "latency.png"), plot_roofline(doc, folder / "roofline.png")]
    return [p for p in written if p is not None]
