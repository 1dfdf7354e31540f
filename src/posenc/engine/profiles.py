"""Optimization profiles from the manifest's dynamic dimension ranges (overridable per dimension).

A manifest names each dynamic axis (``batch``, ``seq``, ``past``, ``kv_seq``) with ``min``/``max``
(``max`` may be open). A profile gives every dim ``min:opt:max``; the default is the manifest's range,
capped where it is open, with ``opt`` at a typical size. Overrides (``seq=1:128:512``) must lie within the
manifest's range: a precomputed table of 64 rows cannot serve a profile of 128 positions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from posenc.errors import ConfigError
from posenc.export.manifest import DimRange

DEFAULT_CAPS: Mapping[str, int] = {"batch": 8, "seq": 2048, "past": 2048, "kv_seq": 4096}
"""Upper bounds used where the manifest leaves a dimension open."""
DEFAULT_OPT: Mapping[str, int] = {"batch": 1, "seq": 128, "past": 0, "kv_seq": 128}
"""Sizes the builder tunes for, clamped into each range."""


@dataclasses.dataclass(frozen=True)
class DimProfile:
    """``min <= opt <= max`` of one named dimension."""

    min: int
    opt: int
    max: int


def parse_override(text: str) -> tuple[str, DimProfile]:
    """``"seq=1:128:512"`` (or ``seq=128`` for a fixed size) -> ``("seq", DimProfile(1, 128, 512))``.

    Raises:
        ConfigError: not ``NAME=MIN:OPT:MAX`` with integers ``0 <= min <= opt <= max``.
    """
    name, sep, values = text.partition("=")
    try:
        numbers = [int(v) for v in values.split(":")] if sep else []
    except ValueError:
        numbers = []
    if not name.strip() or len(numbers) not in (1, 3):
        raise ConfigError(f"profile {text!r} must be NAME=MIN:OPT:MAX (or NAME=SIZE), e.g. seq=1:128:512.")
    low, opt, high = numbers * 3 if len(numbers) == 1 else numbers
    if not 0 <= low <= opt <= high:
        raise ConfigError(f"profile {text!r} needs 0 <= min <= opt <= max.")
    return name.strip(), DimProfile(low, opt, high)


def default_profile(dynamic_dims: Mapping[str, DimRange]) -> dict[str, DimProfile]:
    """One profile covering each dim's manifest range (open ranges capped by :data:`DEFAULT_CAPS`)."""
    profile = {}
    for name, limits in dynamic_dims.items():
        low = limits.min
        high = limits.max if limits.max is not None else max(low, DEFAULT_CAPS.get(name, 2048))
        opt = min(max(DEFAULT_OPT.get(name, low), low), high)
        profile[name] = DimProfile(low, opt, high)
    return profile


def resolve_profile(
    dynamic_dims: Mapping[str, DimRange] | None,
    overrides: Sequence[str] | Mapping[str, DimProfile] | None = None,
) -> dict[str, DimProfile]:
    """The manifest's default profile with ``overrides`` applied and checked against the manifest's ranges.

    Args:
        dynamic_dims: the manifest's ``dynamic_dims`` (``None`` for an ONNX without manifest: then every
            dynamic dimension must come from ``overrides``).
        overrides: ``["seq=1:128:512", ...]`` or ``{name: DimProfile}``.

    Raises:
        ConfigError: an override names an unknown dimension or leaves the manifest's range.
    """
    dims = dict(dynamic_dims or {})
    profile = default_profile(dims)
    items = overrides.items() if isinstance(overrides, Mapping) else (parse_override(t) for t in overrides or ())
    for name, wanted in items:
        if dims and name not in dims:
            raise ConfigError(f"profile names dimension {name!r}; the model's dynamic dimensions are {sorted(dims)}.")
        if name in dims:
            low, high = dims[name].min, dims[name].max
            if wanted.min < low or (high is not None and wanted.max > int(high)):
                shown = f"[{low}, {high if high is not None else 'unbounded'}]"
                raise ConfigError(
                    f"profile {name}={wanted.min}:{wanted.opt}:{wanted.max} is outside the manifest's range "
                    f"{name} in {shown}; choose sizes within it, or re-export with a longer table "
                    f"(max_positions) or table mode 'dynamic'."
                )
        profile[name] = wanted
    return profile


def input_shapes(
    inputs: Sequence[tuple[str, Sequence[int | str]]], profile: Mapping[str, DimProfile]
) -> dict[str, tuple[list[int], list[int], list[int]]]:
    """``{input: (min shape, opt shape, max shape)}`` from symbolic input shapes and a dim profile.

    Raises:
        ConfigError: an input has a dynamic dimension the profile does not cover.
    """
    shapes = {}
    for name, dims in inputs:
        low, opt, high = [], [], []
        for dim in dims:
            if isinstance(dim, int) and dim >= 0:
                low.append(dim)
                opt.append(dim)
                high.append(dim)
                continue
            key = str(dim)
            if key not in profile:
                raise ConfigError(
                    f"input {name!r} has dynamic dimension {key!r} with no range; give one with "
                    f"--profile {key}=MIN:OPT:MAX."
                )
            low.append(profile[key].min)
            opt.append(profile[key].opt)
            high.append(profile[key].max)
        shapes[name] = (low, opt, high)
    return shapes
