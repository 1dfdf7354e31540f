"""The scheme registry: every positional-encoding scheme registers itself here exactly once.

Family modules (:mod:`posenc.schemes.rope`, ...) import :func:`register` from here; :mod:`posenc.schemes`
re-exports the registry and imports the family modules, so the registry never imports them back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from posenc.artifacts.memory import check_bytes
from posenc.config import AttentionConfig
from posenc.errors import ConfigError, parameter_domain
from posenc.schemes.base import Placement, PositionalScheme, SchemeSpec, TableMode

SchemeFactory = Callable[..., PositionalScheme]
"""A scheme module class, or a callable with its constructor's signature (e.g. ``functools.partial`` of one class
that serves several schemes, like ``Rotary(rope_type=...)``)."""

_REGISTRY: dict[str, tuple[SchemeSpec, SchemeFactory]] = {}


def register(spec: SchemeSpec, cls: SchemeFactory) -> None:
    """Register ``cls`` under ``spec.name``; a second registration of the same name raises."""
    if spec.name in _REGISTRY:
        raise ConfigError(f"scheme {spec.name!r} is already registered; scheme names must be unique.")
    if not spec.table_modes:
        raise ConfigError(f"scheme {spec.name!r} must support at least one table mode.")
    if "default" not in spec.cases:
        raise ConfigError(f"scheme {spec.name!r} must list a 'default' case.")
    _REGISTRY[spec.name] = (spec, cls)


def unregister(name: str) -> None:
    """Remove a registered scheme (a derived registration that goes away, e.g. a rope_type registered for a test)."""
    _lookup(name)
    del _REGISTRY[name]


def scheme_names() -> list[str]:
    """Registered scheme names, sorted."""
    return sorted(_REGISTRY)


def specs() -> list[SchemeSpec]:
    """All registered specs, sorted by name."""
    return [_REGISTRY[name][0] for name in scheme_names()]


def _lookup(name: str) -> tuple[SchemeSpec, SchemeFactory]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown scheme {name!r}; valid schemes are {scheme_names()}.") from None


def get_spec(name: str) -> SchemeSpec:
    """The spec registered under ``name``; unknown names raise with the list of valid ones."""
    return _lookup(name)[0]


def scheme_class(name: str) -> SchemeFactory:
    """The module class (or constructor) registered under ``name``."""
    return _lookup(name)[1]


def build_scheme(
    name: str,
    config: AttentionConfig,
    params: Mapping[str, Any] | None = None,
    table_mode: TableMode | str | None = None,
    max_positions: int | None = None,
    table_dtype: torch.dtype = torch.float32,
) -> PositionalScheme:
    """Build the module of scheme ``name`` for ``config``.

    Args:
        name: registered scheme name (see ``posenc list``).
        config: attention geometry.
        params: parameter overrides; defaults come from the spec.
        table_mode: ``precomputed`` or ``dynamic`` (must be one the spec supports); ``None``: ``precomputed``
            where the scheme has it, else ``dynamic``.
        max_positions: rows of precomputed tables; defaults to ``config.max_position_embeddings``.
        table_dtype: dtype of position tables (float32 unless you are measuring what fp16 tables cost).

    Raises:
        ConfigError: unknown scheme or parameter, invalid value, unsupported table mode.
    """
    spec, cls = _lookup(name)
    if table_mode is None:
        table_mode = TableMode.PRECOMPUTED if TableMode.PRECOMPUTED in spec.table_modes else TableMode.DYNAMIC
    mode = TableMode.parse(table_mode)
    if mode not in spec.table_modes:
        raise ConfigError(
            f"scheme {name!r} does not support table mode {mode.value!r}; "
            f"it supports {sorted(m.value for m in spec.table_modes)}."
        )
    if max_positions is None:
        max_positions = config.max_position_embeddings
    if isinstance(max_positions, bool) or not isinstance(max_positions, int) or max_positions < 1:
        raise ConfigError(f"max_positions must be a positive int, got {max_positions!r}.")
    if table_dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise ConfigError(f"table_dtype must be a floating dtype, got {table_dtype}.")
    if mode is TableMode.PRECOMPUTED:
        # the widest row a table of this placement has: rotations store head_dim-wide cos/sin, the others
        # (embeddings, biases, TUPE's position embeddings) at most hidden size, heads or head_dim wide
        widths = (config.head_dim,) if spec.placement is Placement.QK else (config.hidden_size, config.num_heads)
        width = max(*widths, config.head_dim)
        check_bytes(
            2 * max_positions * width * 16,  # relative tables cover 2N - 1 distances; float64 while computed
            f"{name}'s precomputed tables of {max_positions:,} positions",
            "give fewer --max-positions, or --table-mode dynamic (tables computed in the graph, no length limit)"
            if TableMode.DYNAMIC in spec.table_modes
            else "give fewer --max-positions.",
        )
    resolved = spec.resolve(params, config)
    with parameter_domain(
        f"{name} cannot be built with parameters {resolved}",
        f"these values leave the scheme's domain: see `posenc show {name}` for what each parameter means.",
    ):
        module = cls(config, resolved, mode, max_positions, table_dtype=table_dtype)
    check_finite_tables(module)
    return module


def check_finite_tables(module: torch.nn.Module) -> None:
    """Refuse a scheme whose tables or parameters hold inf or NaN: its outputs could not be finite.

    Raises:
        ConfigError: names the scheme, the tensor and its parameters.
    """
    for key, tensor in (*module.named_buffers(), *module.named_parameters()):
        if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
            spec = getattr(module, "spec", None)
            name = spec.name if spec is not None else type(module).__name__
            raise ConfigError(
                f"{name} with parameters {getattr(module, 'params', {})} computes non-finite values in {key!r} "
                f"({tensor.dtype}); no output could be finite. Choose parameters in the scheme's range "
                f"(`posenc show {name}`), or a wider table dtype."
            )
