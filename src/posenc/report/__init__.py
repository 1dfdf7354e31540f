"""Report rendering shared by ``posenc demo`` and ``posenc bench``: Markdown plus self-contained HTML.

A toolkit below :mod:`posenc.bench` and the demo, which knows nothing of either (the demo's report is
:mod:`posenc.demo.report`):

- :class:`Report`: headings, paragraphs, tables and PNG images, rendered as ``report.md`` (images as sibling
  files) and ``report.html`` (inline CSS, images embedded as base64; no external ``src``/``href``).
- :func:`new_figure` / :func:`save_figure`: matplotlib figures without global state, saved atomically.
- :func:`rope_long_range_decay` / :func:`plot_rope_decay`: RoPE's long-range decay curve (Su et al., RoFormer,
  2021, arXiv:2104.09864; Su Jianlin, https://kexue.fm/archives/8265, section 远程衰减).
- :func:`plot_error_vs_position`: the error-against-position plot of a position sweep.

Files are written through :mod:`posenc.artifacts.files` (temporary file, then rename).
"""

from posenc.report.decay import plot_rope_decay, rope_long_range_decay
from posenc.report.document import Report
from posenc.report.figures import new_figure, save_figure
from posenc.report.positions import plot_error_vs_position

__all__ = [
    "Report",
    "new_figure",
    "plot_error_vs_position",
    "plot_rope_decay",
    "rope_long_range_decay",
    "save_figure",
]
