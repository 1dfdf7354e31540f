"""Benchmark shapes: a named :class:`posenc.export.FeedShape` (batch, new tokens, past length, first position).

Text form (``posenc bench --shape``), the one shape syntax of the command line
(:func:`posenc.export.shapes.parse_named_shape`): ``B,S[,P][@START]``, optionally ``NAME:`` before it
(``long:1,2048``), or the presets ``prefill`` (``1,512``) and ``decode`` (``1,1,511``).
"""

from __future__ import annotations

import dataclasses

from posenc.errors import ConfigError
from posenc.export.shapes import SHAPE_NAME, SHAPE_PRESETS, FeedShape, parse_named_shape
from posenc.records import field

MAX_TOKENS = 1 << 20
"""Upper bound of ``batch * (past + seq)``: larger shapes would need tens of GiB on the host."""


@dataclasses.dataclass(frozen=True)
class Shape:
    """One call of a unit: a :class:`FeedShape` with a name for tables and plots.

    ``batch`` sequences of ``seq`` new tokens after ``past`` cached ones; the new tokens sit at positions
    ``start .. start + seq - 1`` (``start`` defaults to ``past``), the keys at ``0 .. past - 1`` and those.
    """

    name: str
    batch: int
    seq: int
    past: int = 0
    start: int | None = field(optional=True, default=None)
    """Absent from documents without far positions (they keep their old form)."""

    def __post_init__(self) -> None:
        try:
            self.feed  # noqa: B018 (FeedShape checks the sizes)
        except ConfigError as exc:
            raise ConfigError(f"shape {self.name!r}: {exc}") from None
        if not isinstance(self.name, str) or not SHAPE_NAME.match(self.name):
            raise ConfigError(
                f"shape name {self.name!r} must start with a letter and use only letters, digits, _ or -."
            )
        if self.batch * self.total > MAX_TOKENS:
            raise ConfigError(
                f"shape {self.label}: batch * (past + seq) = {self.batch * self.total} exceeds {MAX_TOKENS}; "
                f"benchmark a smaller shape."
            )

    @classmethod
    def named(cls, name: str | None, feed: FeedShape) -> Shape:
        """``feed`` called ``name``; an unnamed shape is ``decode`` when it has cached tokens, else ``prefill``."""
        name = name or ("decode" if feed.past > 0 else "prefill")
        return cls(name, feed.batch, feed.seq, feed.past, feed.start)

    @property
    def feed(self) -> FeedShape:
        """The sizes alone, as every other stage takes them."""
        return FeedShape(self.batch, self.seq, self.past, self.start)

    @property
    def total(self) -> int:
        """Key length ``past + seq``."""
        return self.past + self.seq

    @property
    def positions(self) -> int:
        """Rows a precomputed table needs: one more than the last position."""
        return self.feed.last + 1

    @property
    def label(self) -> str:
        """Short human-readable form, e.g. ``decode B=1 S=1 P=511``."""
        past = f" P={self.past}" if self.past else ""
        start = "" if self.start is None else f" @{self.start}"
        return f"{self.name} B={self.batch} S={self.seq}{past}{start}"


PRESETS: dict[str, Shape] = {name: Shape.named(name, feed) for name, feed in SHAPE_PRESETS.items()}
"""Shapes named by a single word on the command line."""


def parse_shape(text: str) -> Shape:
    """Parse ``[NAME:]B,S[,P][@START]`` or a preset into a :class:`Shape` (unnamed: see :meth:`Shape.named`).

    Raises:
        ConfigError: unknown preset, bad name, or sizes :class:`FeedShape` refuses.
    """
    return Shape.named(*parse_named_shape(text))
