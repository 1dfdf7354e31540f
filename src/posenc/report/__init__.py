"""Report rendering shared by ``posenc demo`` and ``posenc bench``: Markdown plus self-contained HTML.

- :class:`Report`: headings, paragraphs, tables and PNG images, rendered as ``report.md`` (images as sibling
  files) and ``report.html`` (inline CSS, images embedded as base64; no external ``src``/``href``).
- :func:`rope_long_range_decay` / :func:`plot_rope_decay`: RoPE's long-range decay curve (Su et al., RoFormer,
  2021, arXiv:2104.09864; Su Jianlin, https://kexue.fm/archives/8265, section 远程衰减).
- :func:`atomic_write_text` / :func:`atomic_write_bytes`: write-to-temporary-then-rename.
"""

from posenc.report.decay import plot_rope_decay, rope_long_range_decay
from posenc.report.document import Report
from posenc.report.files import atomic_write_bytes, atomic_write_text

__all__ = ["Report", "atomic_write_bytes", "atomic_write_text", "plot_rope_decay", "rope_long_range_decay"]
