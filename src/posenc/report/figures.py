"""matplotlib figures without touching global state: the object API on an Agg canvas, saved atomically."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from posenc.artifacts.files import write_bytes_atomic


def new_figure(width: float, height: float) -> Any:
    """A matplotlib ``Figure`` (inches) attached to an Agg canvas; ``pyplot`` is never imported."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def save_figure(figure: Any, path: str | Path) -> Path:
    """Render ``figure`` to PNG and write it atomically."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return write_bytes_atomic(path, buffer.getvalue())
