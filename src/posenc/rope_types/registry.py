"""The registry of RoPE frequency rules: :class:`RopeType` entries keyed by ``rope_type``.

Pure bookkeeping (no torch math): :func:`register` checks an entry and tells the watchers (:func:`watch`), which
is how derived registries such as the scheme registry's ``rope_*`` schemes stay in step with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import torch

from posenc.citations import Citation
from posenc.errors import ConfigError
from posenc.params import Param

__all__ = [
    "COMMON_KEYS",
    "PARTIAL_ROTARY_MODES",
    "TABLE_MODES",
    "Citation",
    "InvFreq",
    "RopeType",
    "ScaleRate",
    "SlotAxes",
    "get",
    "names",
    "parameter_keys",
    "register",
    "registered",
    "rope_type_name",
    "transformers_schemes",
    "unregister",
    "watch",
]

COMMON_KEYS: frozenset[str] = frozenset(
    {
        "rope_type",
        "type",  # legacy Hugging Face spelling of rope_type
        "rope_theta",
        "max_position_embeddings",  # the model's context length (Hugging Face reads it from the config)
        "partial_rotary_factor",
    }
)
"""``rope_parameters`` keys every type accepts; a type's own keys are the names of its :attr:`RopeType.params`."""

TABLE_MODES: frozenset[str] = frozenset({"precomputed", "dynamic"})
"""The table modes of ``posenc.schemes.TableMode`` (by value: this registry sits below the schemes)."""

PARTIAL_ROTARY_MODES: tuple[str, ...] = ("slice", "proportional")
"""How a type treats ``partial_rotary_factor`` p < 1 (see :attr:`RopeType.partial_rotary`)."""


class InvFreq(Protocol):
    """``(rotary_dim, base, params, seq_len) -> (inv_freq float64 [rotary_dim // 2], attention_factor)``.

    ``base`` is the validated ``rope_theta``; ``params`` the whole ``rope_parameters`` mapping (read the type's own
    keys with :mod:`posenc.rope_types.common`'s readers, so bad values raise :class:`ConfigError`); ``seq_len`` is
    ``None``, an int, or a 0-d integer tensor (length-dependent types must accept all three).
    """

    def __call__(
        self, rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: int | torch.Tensor | None
    ) -> tuple[torch.Tensor, float]: ...


class ScaleRate(Protocol):
    """``(rotary_dim, params) -> λ`` float64 ``[rotary_dim // 2]``: per pair, the log of the factor by which q grows
    per position (k shrinks by the same factor), for types that scale as well as rotate (xPos). ``params`` as for
    :class:`InvFreq`; bad values raise :class:`ConfigError`."""

    def __call__(self, rotary_dim: int, params: Mapping[str, Any]) -> torch.Tensor: ...


class SlotAxes(Protocol):
    """``(rotary_dim, params) -> axes`` int64 ``[rotary_dim // 2]``: for a multi-axis type, which axis of the position
    ids ``[A, B, S]`` frequency slot i reads (M-RoPE's temporal/height/width sections, axial's rows and columns).
    ``params`` as for :class:`InvFreq`; bad values raise :class:`ConfigError`."""

    def __call__(self, rotary_dim: int, params: Mapping[str, Any]) -> torch.Tensor: ...


@dataclasses.dataclass(frozen=True)
class RopeType:
    """One ``rope_type``: its frequency function and what posenc derives from it.

    Attributes:
        name: the ``rope_type`` value (``"yarn"``).
        inv_freq: the frequency function (:class:`InvFreq`).
        scheme: the posenc scheme it becomes (``"rope_yarn"``).
        title: one line for ``posenc list``.
        summary: one sentence: what it does.
        citation: the paper (or post) that defines it.
        params: its own ``rope_parameters`` keys with the scheme's defaults, docs and bounds (the function still
            validates what a config dict gives it).
        aliases: other ``rope_type`` names config files use for it (transformers' legacy names).
        in_transformers: transformers defines it (in ``ROPE_INIT_FUNCTIONS``, or in a model's own rotary class, as
            HunYuan's NTK-α), so ``config.json`` import maps it.
        length_dependent: frequencies depend on the current length L = max position + 1.
        switch_points: for a length-dependent type whose frequencies are piecewise constant in L (LongRoPE): the
            lengths after which the next frequency set holds, from the parameters. Such a type gets one table per
            set. ``None`` with ``length_dependent``: continuous (dynamic NTK), computed in the graph only.
        table_modes: the ``TableMode`` values it supports.
        geometry_defaults: values for parameters a scheme left as ``None``, from the filled ``rope_parameters``
            (which carry ``max_position_embeddings``) and the rotary width r.
        cases: named scheme parameter sets the test and export matrices cover, besides the family's own.
        reference: what its tests compare it with (``SchemeSpec.verified_against``).
        partial_rotary: ``"slice"``: with ``partial_rotary_factor`` p the first r = int(D * p) features rotate,
            with frequencies over r (transformers' rule for most types). ``"proportional"``: frequencies span the
            whole head dim D; the function gets rotary_dim = D and p in ``params`` and gives the pairs from
            int(D * p) // 2 on frequency 0 (they pass through: in the ``half`` layout the features
            [int(D * p) // 2, D/2) and their partners [D/2 + int(D * p) // 2, D)).
        position_axes: axes of the position ids: 1 (``[B, S]``), or more for multi-axis types (M-RoPE's
            temporal/height/width ids ``[3, B, S]``; axial's rows and columns ``[2, B, S]``), whose frequency slots
            are split between the axes by :attr:`slot_axes`.
        slot_axes: for a multi-axis type, the :class:`SlotAxes` rule: slot i's angle is ``ids[axis_i] · inv_freq_i``.
        claims: ``{rope_type label: key}``: a config that names another type but carries a truthy ``key`` is this
            type (HunYuan's checkpoints label NTK-α ``"dynamic"`` with an ``alpha``; transformers' HunYuan module
            switches on the same rule). :func:`rope_type_name` applies it.
        scale_rate: for a type that also scales q and k per position (xPos), the :class:`ScaleRate` λ: pair i of
            q at position n is multiplied by exp(λ_i n) and of k by exp(−λ_i n), so the score of q_m and k_n gains
            exp(λ_i (m − n)), a function of m − n like the rotation. q and k then need different cos/sin.
            ``None``: a pure rotation (q and k share cos/sin).
        boundaries: the positions where this type's behaviour changes, from the filled ``rope_parameters`` (the
            pretraining context it extends, a switch length, band edges): validation feeds windows around each
            (:func:`posenc.validate.feeds.boundary_shapes`), so a default check crosses them.
    """

    name: str
    inv_freq: InvFreq
    scheme: str
    title: str
    summary: str
    citation: Citation
    params: tuple[Param, ...] = ()
    aliases: tuple[str, ...] = ()
    in_transformers: bool = True
    length_dependent: bool = False
    switch_points: Callable[[Mapping[str, Any]], tuple[int, ...]] | None = None
    table_modes: frozenset[str] = TABLE_MODES
    geometry_defaults: Callable[[Mapping[str, Any], int], Mapping[str, Any]] | None = None
    cases: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    reference: str = ""
    partial_rotary: str = "slice"
    position_axes: int = 1
    claims: Mapping[str, str] = dataclasses.field(default_factory=dict)
    scale_rate: ScaleRate | None = None
    boundaries: Callable[[Mapping[str, Any]], tuple[int, ...]] | None = None
    slot_axes: SlotAxes | None = None

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def continuous(self) -> bool:
        """Length-dependent without a finite set of frequency sets (no precomputed tables possible)."""
        return self.length_dependent and self.switch_points is None

    def check(self) -> None:
        """Raise :class:`ConfigError` when the entry contradicts itself."""
        where = f"rope_type {self.name!r}"
        if not self.name or not self.scheme:
            raise ConfigError("a rope_type needs a name and the name of the scheme it becomes.")
        if not self.table_modes or not self.table_modes <= TABLE_MODES:
            raise ConfigError(f"{where}: table_modes must be a non-empty subset of {sorted(TABLE_MODES)}.")
        if self.continuous and "precomputed" in self.table_modes:
            raise ConfigError(f"{where} depends continuously on the length: it cannot have precomputed tables.")
        if self.switch_points is not None and not self.length_dependent:
            raise ConfigError(f"{where} has switch_points, so it is length_dependent; set length_dependent=True.")
        clash = sorted(COMMON_KEYS & set(self.param_names))
        if clash:
            raise ConfigError(f"{where} declares {clash}, which every rope_type has; drop them from its params.")
        if self.partial_rotary not in PARTIAL_ROTARY_MODES:
            raise ConfigError(f"{where}: partial_rotary must be one of {list(PARTIAL_ROTARY_MODES)}.")
        if self.position_axes < 1:
            raise ConfigError(f"{where}: position_axes must be >= 1.")
        if (self.position_axes > 1) != (self.slot_axes is not None):
            raise ConfigError(f"{where}: a multi-axis type (position_axes > 1) needs slot_axes, and only it has them.")
        if self.position_axes > 1 and (self.length_dependent or self.scale_rate is not None):
            raise ConfigError(f"{where}: multi-axis positions need static frequencies and a pure rotation.")
        for label, key in self.claims.items():
            if label in (self.name, *self.aliases) or key not in self.param_names:
                raise ConfigError(
                    f"{where} claims configs labelled {label!r} that carry {key!r}: the label must be another "
                    f"type's name and the key one of its own params {list(self.param_names)}."
                )
        if self.scale_rate is not None and self.length_dependent:
            raise ConfigError(f"{where}: a per-position q/k scale (scale_rate) needs static frequencies.")


_TYPES: dict[str, RopeType] = {}
_WATCHERS: list[tuple[Callable[[RopeType], None], Callable[[RopeType], None]]] = []


def _claimed_names() -> dict[str, str]:
    """Every name in use (types and aliases) -> the type that owns it."""
    claimed = {}
    for entry in _TYPES.values():
        for name in (entry.name, *entry.aliases):
            claimed[name] = entry.name
    return claimed


def register(entry: RopeType) -> RopeType:
    """Register ``entry`` and tell the watchers; names, aliases and scheme names must be unique.

    Raises:
        ConfigError: the entry contradicts itself, a name is taken, or a watcher refuses it (then nothing stays
            registered).
    """
    entry.check()
    claimed = _claimed_names()
    for name in (entry.name, *entry.aliases):
        if name in claimed:
            raise ConfigError(f"rope_type name {name!r} is already registered (by {claimed[name]!r}).")
    if any(other.scheme == entry.scheme for other in _TYPES.values()):
        raise ConfigError(f"scheme name {entry.scheme!r} already belongs to another rope_type.")
    _TYPES[entry.name] = entry
    done: list[Callable[[RopeType], None]] = []
    try:
        for added, removed in _WATCHERS:
            added(entry)
            done.append(removed)
    except Exception:
        for removed in reversed(done):
            removed(entry)
        del _TYPES[entry.name]
        raise
    return entry


def unregister(name: str) -> None:
    """Remove a registered type (and what the watchers derived from it)."""
    entry = get(name)
    for _, removed in reversed(_WATCHERS):
        removed(entry)
    del _TYPES[entry.name]


@contextlib.contextmanager
def registered(entry: RopeType) -> Iterator[RopeType]:
    """Register ``entry`` for the ``with`` block only (tests, experiments)."""
    register(entry)
    try:
        yield entry
    finally:
        unregister(entry.name)


def watch(added: Callable[[RopeType], None], removed: Callable[[RopeType], None]) -> None:
    """Call ``added`` for every registered type, now and on each later :func:`register`, and ``removed`` on
    each :func:`unregister` (how a derived registry follows this one)."""
    for entry in list(_TYPES.values()):
        added(entry)
    _WATCHERS.append((added, removed))


def names() -> list[str]:
    """Registered ``rope_type`` names in registration order (aliases not included)."""
    return list(_TYPES)


def get(name: str) -> RopeType:
    """The type registered under ``name`` or one of its aliases; unknown names raise with the valid ones."""
    owner = _claimed_names().get(name)
    if owner is None:
        raise ConfigError(f"unknown rope_type {name!r}; valid rope_type values are {names()}.")
    return _TYPES[owner]


def rope_type_name(params: Mapping[str, Any] | None) -> str:
    """The ``rope_type`` a ``rope_parameters`` mapping names (``rope_type``, legacy ``type``, else ``default``), or
    the type that claims it (:attr:`RopeType.claims`: HunYuan's ``"dynamic"`` with an ``alpha`` is ``ntk_alpha``)."""
    params = params or {}
    label = str(params.get("rope_type", params.get("type", "default")) or "default")
    for entry in _TYPES.values():
        key = entry.claims.get(label)
        if key is not None and params.get(key):
            return entry.name
    return label


def parameter_keys() -> frozenset[str]:
    """Every ``rope_parameters`` key some registered type accepts."""
    return COMMON_KEYS.union(*(entry.param_names for entry in _TYPES.values()))


def transformers_schemes() -> dict[str, str]:
    """``rope_type`` (and alias) -> scheme name, for the types transformers defines (``config.json`` import)."""
    return {
        name: entry.scheme
        for entry in _TYPES.values()
        if entry.in_transformers
        for name in (entry.name, *entry.aliases)
    }
