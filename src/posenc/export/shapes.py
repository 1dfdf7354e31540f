"""Call sizes: :class:`FeedShape` (batch, new tokens, cached tokens, first position) and the command line's one
shape syntax, ``B,S[,P][@START]`` with an optional ``NAME:`` or a preset (:func:`parse_named_shape`).

No torch here: the command line reads shapes before it loads a stage.
"""

from __future__ import annotations

import dataclasses
import re

from posenc.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class FeedShape:
    """Sizes of one call: ``batch`` rows, ``seq`` new tokens, ``past`` cached tokens before them.

    The cached tokens sit at positions ``0 .. past - 1`` and the new ones at ``start .. start + seq - 1``;
    ``start`` defaults to ``past`` (a contiguous sequence). A larger ``start`` reaches far positions (near a
    model's context length) without a cache that long.
    """

    batch: int
    seq: int
    past: int = 0
    start: int | None = None

    def __post_init__(self) -> None:
        for name, low in (("batch", 1), ("seq", 1), ("past", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"FeedShape.{name} must be an int >= {low}, got {value!r}.")
        if self.start is not None and (
            isinstance(self.start, bool) or not isinstance(self.start, int) or self.start < self.past
        ):
            raise ConfigError(
                f"FeedShape.start must be an int >= past ({self.past}): new tokens follow the cache; "
                f"got {self.start!r}."
            )

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
        at = "" if self.start is None else f" @{self.start}"
        return f"B={self.batch} S={self.seq} P={self.past}{at}"

    @classmethod
    def parse(cls, text: str) -> FeedShape:
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


SAMPLE_SHAPE = FeedShape(batch=2, seq=4, past=3)
"""Sizes traced at export. All >= 2 so that torch.export does not specialize them (it fixes sizes 0/1)."""

SHAPE_PRESETS: dict[str, FeedShape] = {"prefill": FeedShape(1, 512), "decode": FeedShape(1, 1, 511)}
"""Shapes named by one word: a 512-token prefill, and one decode step after 511 cached tokens."""
SHAPE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
"""What a shape's ``NAME:`` may be."""


def parse_named_shape(text: str) -> tuple[str | None, FeedShape]:
    """The command line's one shape syntax: ``B,S[,P][@START]``, optionally ``NAME:`` before it, or a preset.

    ``2,7,5``, ``long:1,2048``, ``1,4,0@32764``, ``prefill`` (= ``1,512``), ``decode`` (= ``1,1,511``); the numbers
    are read by :meth:`FeedShape.parse`. The name labels benchmark rows; it does not change the sizes.

    Returns:
        ``(name or None, FeedShape)``; a preset comes back with its own name.

    Raises:
        ConfigError: an unknown preset, a bad name, or numbers :class:`FeedShape` refuses.
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
    return name or None, FeedShape.parse(body)


def named_shape_text(feed: FeedShape, name: str | None = None) -> str:
    """The text :func:`parse_named_shape` reads back into ``(name, feed)``."""
    return f"{name}:{feed.text}" if name else feed.text


__all__ = [
    "SAMPLE_SHAPE",
    "SHAPE_NAME",
    "SHAPE_PRESETS",
    "FeedShape",
    "named_shape_text",
    "parse_named_shape",
]
