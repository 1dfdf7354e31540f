"""A declared parameter (:class:`Param`): name, kind, default, meaning and validation.

Schemes (``posenc.schemes``) and RoPE types (``posenc.rope_types``) declare their parameters with it; it lives
below both so that the RoPE type registry, which ``posenc.functional`` dispatches to, needs nothing above it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from posenc.errors import ConfigError

__all__ = ["Param"]

_KINDS = ("int", "float", "bool", "str", "floats", "ints", "dict")


def _integral(value: Any) -> int:
    """An int from an int, an integral float (JSON) or a digit string; anything else raises."""
    number = float(value) if not isinstance(value, int) else value
    if isinstance(number, float) and not number.is_integer():
        raise ValueError
    return int(number)


@dataclasses.dataclass(frozen=True)
class Param:
    """One scheme parameter: name, kind, default, meaning and validation."""

    name: str
    kind: str
    default: Any
    doc: str
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    exclusive_minimum: bool = False
    maximum: float | None = None
    optional: bool = False
    """``None`` is an allowed value (meaning: derived from other parameters)."""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"Param {self.name}: kind must be one of {_KINDS}")

    def coerce(self, value: Any, scheme: str) -> Any:
        """Convert ``value`` (possibly a CLI string) to this parameter's kind and validate it."""
        where = f"{scheme}: parameter {self.name!r}"
        if value is None:
            if self.optional:
                return None
            raise ConfigError(f"{where} may not be None; give a {self.kind} ({self.doc}).")
        try:
            value = self._convert(value)
        except (TypeError, ValueError, json.JSONDecodeError):
            raise ConfigError(f"{where} must be a {self.kind}, got {value!r} ({self.doc}).") from None
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"{where} must be one of {list(self.choices)}, got {value!r}.")
        numbers = value if self.kind in ("floats", "ints") else [value] if self.kind in ("int", "float") else []
        for number in numbers:
            if isinstance(number, float) and not math.isfinite(number):
                raise ConfigError(f"{where} must be finite, got {number!r}.")
            if self.minimum is not None:
                too_small = number <= self.minimum if self.exclusive_minimum else number < self.minimum
                if too_small:
                    op = ">" if self.exclusive_minimum else ">="
                    raise ConfigError(f"{where} must be {op} {self.minimum}, got {number!r}.")
            if self.maximum is not None and number > self.maximum:
                raise ConfigError(f"{where} must be <= {self.maximum}, got {number!r}.")
        return value

    def _convert(self, value: Any) -> Any:
        if self.kind == "int":
            if isinstance(value, bool):
                raise TypeError
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if self.kind == "float":
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if self.kind == "bool":
            if isinstance(value, str):
                lowered = value.strip().lower()
                if lowered in ("1", "true", "yes", "on"):
                    return True
                if lowered in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            if not isinstance(value, (bool, int)):
                raise TypeError
            return bool(value)
        if self.kind == "str":
            if not isinstance(value, str):
                raise TypeError
            return value
        if self.kind == "floats":
            if isinstance(value, str):
                value = json.loads(value) if value.strip().startswith("[") else value.split(",")
            if not isinstance(value, Sequence):
                raise TypeError
            return tuple(float(v) for v in value)
        if self.kind == "ints":
            if isinstance(value, str):
                value = json.loads(value) if value.strip().startswith("[") else value.split(",")
            if not isinstance(value, Sequence) or any(isinstance(v, bool) for v in value):
                raise TypeError
            return tuple(_integral(v) for v in value)
        if isinstance(value, str):
            value = json.loads(value)
        if not isinstance(value, Mapping):
            raise TypeError
        return dict(value)
