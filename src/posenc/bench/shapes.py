"""Benchmark shapes: batch, new tokens and past length of one call (prefill or a decode step).

Text form (``posenc bench --shape``): ``prefill``, ``decode``, or ``[NAME:]b=1,s=2048[,past=0]``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from posenc.errors import ConfigError

_KEYS = {"b": "batch", "batch": "batch", "s": "seq", "seq": "seq", "p": "past", "past": "past"}
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
MAX_TOKENS = 1 << 20
"""Upper bound of ``batch * (past + seq)``: larger shapes would need tens of GiB on the host."""


@dataclasses.dataclass(frozen=True)
class Shape:
    """One call of a unit: ``batch`` sequences of ``seq`` new tokens after ``past`` cached ones.

    Positions of the new tokens are ``past .. past + seq - 1``; keys sit at ``0 .. past + seq - 1``.
    """

    name: str
    batch: int
    seq: int
    past: int = 0

    def __post_init__(self) -> None:
        for field, low in (("batch", 1), ("seq", 1), ("past", 0)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"shape {self.name!r}: {field} must be an int >= {low}, got {value!r}.")
        if not _NAME.match(self.name):
            raise ConfigError(
                f"shape name {self.name!r} must start with a letter and use only letters, digits, _ or -."
            )
        if self.batch * self.total > MAX_TOKENS:
            raise ConfigError(
                f"shape {self.label}: batch * (past + seq) = {self.batch * self.total} exceeds {MAX_TOKENS}; "
                f"benchmark a smaller shape."
            )

    @property
    def total(self) -> int:
        """Key length ``past + seq`` (and one more than the last position)."""
        return self.past + self.seq

    @property
    def label(self) -> str:
        """Short human-readable form, e.g. ``decode B=1 S=1 P=511``."""
        past = f" P={self.past}" if self.past else ""
        return f"{self.name} B={self.batch} S={self.seq}{past}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Shape:
        return cls(str(data["name"]), int(data["batch"]), int(data["seq"]), int(data.get("past", 0)))


PRESETS: dict[str, Shape] = {
    "prefill": Shape("prefill", batch=1, seq=512),
    "decode": Shape("decode", batch=1, seq=1, past=511),
}
"""Shapes named by a single word on the command line."""


def parse_shape(text: str) -> Shape:
    """Parse ``prefill``, ``decode`` or ``[NAME:]b=B,s=S[,past=P]`` into a :class:`Shape`.

    Raises:
        ConfigError: unknown preset or key, missing ``b``/``s``, values that are not positive ints.
    """
    raw = text.strip()
    if raw in PRESETS:
        return PRESETS[raw]
    name, sep, body = raw.partition(":")
    if not sep:
        name, body = "", raw
    if "=" not in body:
        raise ConfigError(
            f"cannot read shape {text!r}; use a preset {sorted(PRESETS)} or 'NAME:b=1,s=512,past=0' (keys b, s, past)."
        )
    values: dict[str, int] = {}
    for item in body.split(","):
        key, eq, value = item.strip().partition("=")
        field = _KEYS.get(key.strip().lower())
        if not eq or field is None:
            raise ConfigError(f"shape {text!r}: unknown item {item.strip()!r}; use keys b, s and past, e.g. b=1,s=512.")
        if field in values:
            raise ConfigError(f"shape {text!r}: {field} is given twice.")
        try:
            values[field] = int(value.strip())
        except ValueError:
            raise ConfigError(f"shape {text!r}: {field} must be an integer, got {value.strip()!r}.") from None
    missing = [key for key, field in (("b", "batch"), ("s", "seq")) if field not in values]
    if missing:
        raise ConfigError(f"shape {text!r} lacks {', '.join(missing)}; e.g. b=1,s=512 (past is optional).")
    if not name:
        name = "decode" if values.get("past", 0) > 0 else "prefill"
    return Shape(name=name.strip(), **values)
