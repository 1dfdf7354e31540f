"""Benchmark shapes: :class:`posenc.export.shapes.Shape` with a name (batch, new tokens, past length, first position).

Text form (``posenc bench --shape``), the one shape syntax of the command line
(:func:`posenc.export.shapes.parse_named_shape`): ``B,S[,P][@START]``, optionally ``NAME:`` before it
(``long:1,2048``), or the presets ``prefill`` (``1,512``) and ``decode`` (``1,1,511``).
"""

from __future__ import annotations

from collections.abc import Sequence

from posenc.errors import ConfigError
from posenc.export.shapes import SHAPE_PRESETS, Shape, parse_named_shape

MAX_TOKENS = 1 << 20
"""Upper bound of ``batch * (past + seq)``: larger shapes would need tens of GiB on the host."""


def check_bench_shapes(shapes: Sequence[Shape]) -> list[Shape]:
    """``shapes``, each within :data:`MAX_TOKENS`.

    Raises:
        ConfigError: a shape whose ``batch * (past + seq)`` exceeds :data:`MAX_TOKENS`.
    """
    for shape in shapes:
        if shape.batch * shape.kv_seq > MAX_TOKENS:
            raise ConfigError(
                f"shape {shape.label}: batch * (past + seq) = {shape.batch * shape.kv_seq} exceeds {MAX_TOKENS}; "
                f"benchmark a smaller shape."
            )
    return list(shapes)


PRESETS: dict[str, Shape] = {name: Shape.named(name, feed) for name, feed in SHAPE_PRESETS.items()}
"""Shapes named by a single word on the command line."""


def parse_shape(text: str) -> Shape:
    """Parse ``[NAME:]B,S[,P][@START]`` or a preset into a named :class:`Shape` (unnamed: see :meth:`Shape.named`).

    Raises:
        ConfigError: unknown preset, bad name, sizes :class:`Shape` refuses, or more than :data:`MAX_TOKENS`.
    """
    (shape,) = check_bench_shapes([Shape.named(*parse_named_shape(text))])
    return shape


__all__ = ["MAX_TOKENS", "PRESETS", "Shape", "check_bench_shapes", "parse_shape"]
