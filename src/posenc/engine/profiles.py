"""Optimization profiles sized to the model: from the manifest's dynamic dimension ranges and its context length.

A manifest names each dynamic axis (``batch``, ``seq``, ``past``, ``kv_seq``) with ``min``/``max`` (``max`` may be
open: a dynamic table serves any position). A profile gives every dim ``min:opt:max``. By default an engine gets
two (:func:`model_profiles`), both reaching the model's own limits — where the manifest leaves a dimension open, the
model's context length (``max_position_embeddings``; an in-place cache's capacity is in the graph's shapes):

- ``prefill`` (profile 0, the one a runner uses unless told otherwise): new tokens up to the context, tuned for a
  prompt of ``min(512, context)`` with no cache; any cached length too, so every call the model serves runs on it;
- ``decode`` (a block with a cache): steps of 1 to 16 tokens after up to ``context - 1`` cached ones, tuned for one
  token after ``min(4095, context - 1)``.

Batch, which no model bounds, is capped at :data:`DEFAULT_BATCH`. Overrides (``seq=1:128:512``) replace a dimension
in every profile and must lie within the manifest's range: a precomputed table of 64 rows cannot serve a profile of
128 positions. Without a manifest every dynamic dimension must be given.
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


DEFAULT_BATCH = 8
"""Largest batch of a default profile (no model bounds its batch; ``--profile batch=1:1:64`` raises it)."""
PREFILL_OPT = 512
DECODE_OPT_PAST = 4095
DECODE_MAX_SEQ = 16
"""New tokens of a decode step at most (speculative decoding verifies a few at once)."""


def default_profile(dynamic_dims: Mapping[str, DimRange]) -> dict[str, DimProfile]:
    """One profile covering each dim's manifest range (open ranges capped by :data:`DEFAULT_CAPS`): for a graph
    whose manifest says nothing of the model's context."""
    profile = {}
    for name, limits in dynamic_dims.items():
        low = limits.min
        high = limits.max if limits.max is not None else max(low, DEFAULT_CAPS.get(name, 2048))
        opt = min(max(DEFAULT_OPT.get(name, low), low), high)
        profile[name] = DimProfile(low, opt, high)
    return profile


def model_profiles(
    dynamic_dims: Mapping[str, DimRange], context: int, decoder: bool
) -> dict[str, dict[str, DimProfile]]:
    """``{"prefill": profile, "decode": profile}`` reaching the model's limits (see the module docstring); only
    ``prefill`` for a graph without a cache (``decoder`` False).

    Args:
        dynamic_dims: the manifest's ranges; a bound there (a precomputed table) wins over ``context``.
        context: the model's context length (``max_position_embeddings``).
        decoder: the graph carries a cache (a ``past`` input or an in-place cache).
    """
    caps = {"batch": DEFAULT_BATCH, "seq": context, "past": max(context - 1, 0), "kv_seq": context}

    def top(name: str, limits: DimRange) -> int:
        cap = caps.get(name, DEFAULT_CAPS.get(name, 2048))
        return max(limits.min, cap if limits.max is None else min(int(limits.max), cap))

    def dim(name: str, limits: DimRange, opt: int, high: int | None = None) -> DimProfile:
        most = top(name, limits) if high is None else max(limits.min, min(high, top(name, limits)))
        return DimProfile(limits.min, min(max(opt, limits.min), most), most)

    prefill_opt = {"batch": 1, "seq": PREFILL_OPT, "past": 0, "kv_seq": PREFILL_OPT}
    profiles = {"prefill": {name: dim(name, r, prefill_opt.get(name, r.min)) for name, r in dynamic_dims.items()}}
    if decoder:
        decode_opt = {"batch": 1, "seq": 1, "past": DECODE_OPT_PAST, "kv_seq": DECODE_OPT_PAST + 1}
        profiles["decode"] = {
            name: dim(name, r, decode_opt.get(name, r.min), DECODE_MAX_SEQ if name == "seq" else None)
            for name, r in dynamic_dims.items()
        }
    return profiles


def resolve_profiles(
    dynamic_dims: Mapping[str, DimRange] | None,
    overrides: Sequence[str] | Mapping[str, DimProfile] | None = None,
    *,
    context: int | None = None,
    decoder: bool = False,
) -> dict[str, dict[str, DimProfile]]:
    """The named profiles of a build: :func:`model_profiles` when the model's ``context`` is known, else one
    ``default`` profile (:func:`default_profile`); ``overrides`` replace their dimension in every profile, checked
    against the manifest's ranges (:func:`resolve_profile`)."""
    dims = dict(dynamic_dims or {})
    bases = model_profiles(dims, context, decoder) if context and dims else {"default": default_profile(dims)}
    return {name: resolve_profile(dims, overrides, base=base) for name, base in bases.items()}


def resolve_profile(
    dynamic_dims: Mapping[str, DimRange] | None,
    overrides: Sequence[str] | Mapping[str, DimProfile] | None = None,
    base: Mapping[str, DimProfile] | None = None,
) -> dict[str, DimProfile]:
    """A profile (default: the manifest's :func:`default_profile`) with ``overrides`` applied and checked against the
    manifest's ranges.

    Args:
        dynamic_dims: the manifest's ``dynamic_dims`` (``None`` for an ONNX without manifest: then every
            dynamic dimension must come from ``overrides``).
        overrides: ``["seq=1:128:512", ...]`` or ``{name: DimProfile}``.
        base: the profile the overrides apply to.

    Raises:
        ConfigError: an override names an unknown dimension or leaves the manifest's range.
    """
    dims = dict(dynamic_dims or {})
    profile = dict(base) if base is not None else default_profile(dims)
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


def format_profiles(profiles: Mapping[str, Mapping[str, DimProfile]]) -> str:
    """``prefill: batch 1:1:8, seq 1:512:4096, past 0:0:4095; decode: ...`` for the build's and inspect's output."""
    return "; ".join(
        f"{name}: "
        + (
            ", ".join(f"{dim} {p.min}:{p.opt}:{p.max}" for dim, p in profile.items())
            or "every dynamic dimension from --profile NAME=MIN:OPT:MAX (no manifest)"
        )
        for name, profile in profiles.items()
    )
