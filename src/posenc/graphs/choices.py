"""Names the graph stage accepts (kept import-light for ``posenc --help``)."""

from __future__ import annotations

TARGETS: tuple[str, ...] = ("ort-cpu", "ort-cuda", "trt")
"""Runtimes ``posenc optimize`` rewrites for."""
ROPE_MODES: tuple[str, ...] = ("fused", "plugin", "keep")
"""What happens to RoPE: standard RotaryEmbedding, posenc's TensorRT plugin node, or left decomposed."""
DEFAULT_FOLD_LIMIT = 1 << 16
"""Elements: constant folding leaves nodes reading or producing a larger constant alone."""
