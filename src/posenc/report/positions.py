"""The error-against-position plot of a position sweep (:func:`posenc.validate.position_sweep`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from posenc.dtypes import short_name
from posenc.report.figures import new_figure, save_figure

if TYPE_CHECKING:
    from posenc.validate.sweep import SweepSeries

_STYLES = {"float32": "-", "float16": "--", "bfloat16": ":"}


def series_label(series: SweepSeries) -> str:
    """``rope fp16 dynamic (fp16 tables)``-style label of one sweep series."""
    tables = "" if series.table_dtype == "float32" else f" ({series.table_dtype} tables)"
    return f"{series.scheme} {short_name(series.dtype)} {series.table_mode}{tables}"


def plot_error_vs_position(series: Sequence[SweepSeries], path: str | Path, max_position: int) -> Path | None:
    """Max absolute error against position, one line per series, log-log; grey lines mark each atol.

    One color per scheme and table mode; solid fp32, dashed fp16, dotted fp16 graphs with fp16 tables.

    Positions where the op is exact (error 0, e.g. position 0 of RoPE) have no place on a log axis and
    are left out of the lines.

    Args:
        series: the sweep's series (their ``points``: position and max abs error).
        path: PNG file to write (atomically).
        max_position: right end of the x axis.

    Returns:
        The path, or ``None`` when there is nothing to plot.
    """
    drawable = [s for s in series if s.points]
    if not drawable:
        return None
    figure = new_figure(8.5, 4.5)
    axis = figure.subplots()
    tolerances = set()
    groups = list(dict.fromkeys((s.scheme, s.table_mode) for s in drawable))
    colors = [f"C{i % 10}" for i in range(len(groups))]
    for s in drawable:
        points = sorted((p for p in s.points if p.max_abs > 0), key=lambda p: p.position)
        xs = [max(p.position, 1) for p in points]
        ys = [p.max_abs for p in points]
        style = ":" if s.table_dtype != "float32" else _STYLES.get(s.dtype, "-")
        color = colors[groups.index((s.scheme, s.table_mode))]
        label = series_label(s) + ("" if points else ": exact at every position (not drawn)")
        axis.plot(xs, ys, style, color=color, marker=".", linewidth=1, label=label)
        tolerances.add((s.dtype, s.atol))
    for dtype, atol in sorted(tolerances):
        axis.axhline(atol, color="grey", linestyle="-.", linewidth=0.7)
        axis.annotate(f"atol {dtype}", (1, atol), fontsize=7, color="grey", va="bottom")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlim(1, max(max_position, 2))
    axis.set_xlabel("position (log scale; position 0 drawn at 1)")
    axis.set_ylabel("max |ONNX Runtime − float64 eager|")
    axis.set_title("Error against position of the exported positional op", fontsize=10)
    axis.grid(which="both", alpha=0.25)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(figure, path)
