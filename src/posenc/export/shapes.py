"""Call sizes: :class:`Shape` (batch, new tokens, cached tokens, first position, and a name for benchmark rows)
and the command line's one shape syntax, ``B,S[,P][@START]`` with an optional ``NAME:`` or a preset
(:func:`parse_named_shape`). Every stage takes this one type (validation's feeds, the bench's rows: named).

No torch here: the command line reads shapes before it loads a stage.
"""

from __future__ import annotations

import dataclasses
import re

from posenc.errors import ConfigError
from posenc.records import field, field_metadata

SHAPE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
"""What a shape's ``NAME:`` may be."""


@dataclasses.dataclass(frozen=True)
class Shape:
    """Sizes of one call: ``batch`` rows, ``seq`` new tokens, ``past`` cached tokens before them.

    The cached tokens sit at positions ``0 .. past - 1`` and the new ones at ``start .. start + seq - 1``;
    ``start`` defaults to ``past`` (a contiguous sequence). A larger ``start`` reaches far positions (near a
    model's context length) without a cache that long. ``name`` (keyword only) labels a benchmark row
    (``prefill``, ``long``); the sizes alone are :attr:`feed`. As a record (benchmark documents) ``name`` and
    ``start`` are left out while None.
    """

    name: str | None = dataclasses.field(default=None, kw_only=True, metadata=field_metadata(optional=True))
    batch: int
    seq: int
    past: int = 0
    start: int | None = field(optional=True, default=None)

    def __post_init__(self) -> None:
        for name, low in (("batch", 1), ("seq", 1), ("past", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{self._what}.{name} must be an int >= {low}, got {value!r}.")
        if self.start is not None and (
            isinstance(self.start, bool) or not isinstance(self.start, int) or self.start < self.past
        ):
            raise ConfigError(
                f"{self._what}.start must be an int >= past ({self.past}): new tokens follow the cache; "
                f"got {self.start!r}."
            )
        if self.name is not None and (not isinstance(self.name, str) or not SHAPE_NAME.match(self.name)):
            raise ConfigError(
                f"shape name {self.name!r} must start with a letter and use only letters, digits, _ or -."
            )

    @property
    def _what(self) -> str:
        return "FeedShape" if self.name is None else f"shape {self.name!r}: FeedShape"

    @classmethod
    def named(cls, name: str | None, feed: Shape) -> Shape:
        """``feed`` called ``name``; an unnamed shape is ``decode`` when it has cached tokens, else ``prefill``."""
        return dataclasses.replace(feed, name=name or ("decode" if feed.past > 0 else "prefill"))

    @property
    def feed(self) -> Shape:
        """The sizes alone (the shape without its name)."""
        return self if self.name is None else dataclasses.replace(self, name=None)

    @property
    def total(self) -> int:
        """Key length ``past + seq`` (:attr:`kv_seq`)."""
        return self.kv_seq

    @property
    def positions(self) -> int:
        """Rows a precomputed table needs: one more than the last position."""
        return self.last + 1

    @property
    def kv_seq(self) -> int:
        return self.past + self.seq

    @property
    def first(self) -> int:
        """Position of the first new token."""
        return self.past if self.start is None else self.start

    @property
    def last(self) -> int:
        """Largest position of the call."""
        return self.first + self.seq - 1

    @property
    def label(self) -> str:
        """``B=2 S=7 P=5 @START``; a named shape (a benchmark row) ``NAME B=2 S=7 P=5``, ``P`` shown when > 0."""
        at = "" if self.start is None else f" @{self.start}"
        if self.name is None:
            return f"B={self.batch} S={self.seq} P={self.past}{at}"
        past = f" P={self.past}" if self.past else ""
        return f"{self.name} B={self.batch} S={self.seq}{past}{at}"

    @classmethod
    def parse(cls, text: str) -> Shape:
        """``"2,7,5"`` or ``"2x7x5"`` (batch, seq, past; past optional), optionally ``@START`` (``"1,4,0@32764"``)."""
        body, _, start = text.partition("@")
        parts = body.replace("x", ",").split(",")
        try:
            numbers = [int(p) for p in parts if p.strip()]
            first = int(start) if start.strip() else None
        except ValueError:
            raise ConfigError(f"shape {text!r} must be BATCH,SEQ[,PAST][@START] integers, e.g. 2,7,5.") from None
        if len(numbers) not in (2, 3):
            raise ConfigError(f"shape {text!r} must be BATCH,SEQ[,PAST][@START], e.g. 2,7,5 or 1,4,0@32764.")
        return cls(*numbers, start=first)  # type: ignore[misc]  # 2 or 3 ints, checked above

    @property
    def text(self) -> str:
        """``B,S,P`` (``@START`` when set): what :meth:`parse` reads back."""
        return f"{self.batch},{self.seq},{self.past}" + ("" if self.start is None else f"@{self.start}")


FeedShape = Shape
"""The former name of :class:`Shape` (the same class)."""

SAMPLE_SHAPE = Shape(batch=2, seq=4, past=3)
"""Sizes traced at export. All >= 2 so that torch.export does not specialize them (it fixes sizes 0/1)."""

SHAPE_PRESETS: dict[str, Shape] = {"prefill": Shape(1, 512), "decode": Shape(1, 1, 511)}
"""Shapes named by one word: a 512-token prefill, and one decode step after 511 cached tokens."""


def parse_named_shape(text: str) -> tuple[str | None, Shape]:
    """The command line's one shape syntax: ``B,S[,P][@START]``, optionally ``NAME:`` before it, or a preset.

    ``2,7,5``, ``long:1,2048``, ``1,4,0@32764``, ``prefill`` (= ``1,512``), ``decode`` (= ``1,1,511``); the numbers
    are read by :meth:`Shape.parse`. The name labels benchmark rows; it does not change the sizes.

    Returns:
        ``(name or None, Shape)``; a preset comes back with its own name.

    Raises:
        ConfigError: an unknown preset, a bad name, or numbers :class:`Shape` refuses.
    """
    raw = text.strip()
    if raw in SHAPE_PRESETS:
        return raw, SHAPE_PRESETS[raw]
    name, sep, body = raw.partition(":")
    if not sep:
        name, body = "", raw
    name = name.strip()
    if sep and not SHAPE_NAME.match(name):
        raise ConfigError(f"shape name {name!r} must start with a letter and use only letters, digits, _ or -.")
    if not any(c.isdigit() for c in body):
        raise ConfigError(
            f"cannot read shape {text!r}; write B,S[,P][@START] (e.g. 2,7,5 or 1,4,0@32764), optionally NAME: "
            f"before it, or a preset: {', '.join(SHAPE_PRESETS)}."
        )
    return name or None, Shape.parse(body)


def named_shape_text(feed: Shape, name: str | None = None) -> str:
    """The text :func:`parse_named_shape` reads back into ``(name, feed)``."""
    return f"{name}:{feed.text}" if name else feed.text


__all__ = [
    "SAMPLE_SHAPE",
    "SHAPE_NAME",
    "SHAPE_PRESETS",
    "FeedShape",
    "Shape",
    "named_shape_text",
    "parse_named_shape",
]
