"""What a scheme is: its spec (parameters, placement, table modes, tolerances) and its module base class.

A scheme acts at exactly one place of the attention block (:class:`Placement`):

- ``embedding``: adds to / multiplies the hidden states before the projections,
  ``embed(hidden [B, S, E], position_ids [B, S]) -> [B, S, E]``;
- ``qk``: rotates queries and keys, ``rotate(q [B, H, S, D], k [B, Hkv, S, D], position_ids [B, S])``;
- ``score``: adds a bias to the attention scores,
  ``bias(q [B, H, Sq, D], k [B, H, Sk, D], q_pos [B, Sq], k_pos [B, Sk]) -> [B|1, H, Sq, Sk]``;
- ``attention``: replaces the attention computation,
  ``attend(q, k, v, q_pos, k_pos, causal) -> [B, H, Sq, D]``;
- ``none``: NoPE.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from posenc.dtypes import compute_dtype, dtype_name
from posenc.errors import ConfigError, PositionError
from posenc.functional import is_tracing, position_guard
from posenc.params import Param

if TYPE_CHECKING:
    from posenc.config import AttentionConfig


class TableMode(str, enum.Enum):
    """How position-dependent tables reach the graph."""

    PRECOMPUTED = "precomputed"
    """Tables of ``max_positions`` rows are stored (initializers) and gathered by position ids."""
    DYNAMIC = "dynamic"
    """Only small parameters are stored; tables are computed from position ids (no table length limit)."""

    @classmethod
    def parse(cls, value: str | TableMode) -> TableMode:
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(f"unknown table mode {value!r}; use one of {[m.value for m in cls]}.") from None


BOTH_TABLE_MODES: frozenset[TableMode] = frozenset(TableMode)
"""Both table modes: what a scheme whose tables can be stored or computed in the graph declares."""


class Placement(str, enum.Enum):
    """Where in the attention block a scheme acts."""

    EMBEDDING = "embedding"
    QK = "qk"
    SCORE = "score"
    ATTENTION = "attention"
    NONE = "none"


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Absolute and relative tolerance of a comparison against the float64 reference."""

    atol: float
    rtol: float


DEFAULT_TOLERANCES: Mapping[str, Tolerance] = {
    "float32": Tolerance(atol=2e-5, rtol=1e-4),
    "float16": Tolerance(atol=4e-3, rtol=4e-3),
    "bfloat16": Tolerance(atol=3e-2, rtol=3e-2),
}


@dataclasses.dataclass(frozen=True)
class SchemeSpec:
    """Everything the registry, the CLI, the exporters and the test matrices know about a scheme."""

    name: str
    title: str
    family: str
    placement: Placement
    params: tuple[Param, ...]
    table_modes: frozenset[TableMode]
    citation: str
    summary: str
    exports: frozenset[str] = frozenset({"op", "block"})
    tolerances: Mapping[str, Tolerance] = dataclasses.field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    cases: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=lambda: {"default": {}})
    """Named parameter sets that the parity and export matrices cover (``default`` = the defaults)."""
    validate: Callable[[dict[str, Any], AttentionConfig], None] | None = None
    """Cross-parameter check, given the resolved parameters and the attention geometry."""
    verified_against: str = ""
    """The upstream implementation the tests compare with."""
    length_dependent: bool = False
    """Frequencies depend on the current length (dynamic NTK, LongRoPE): keys cached at an earlier step
    were encoded with other frequencies than a full recompute would use."""
    position_axes: int = 1
    """Axes of the position ids: 1 (``[B, S]``), or A > 1 for multi-axis schemes (``[A, B, S]``: M-RoPE's temporal,
    height and width ids; axial RoPE's rows and columns). Blocks of multi-axis schemes mask in token order."""

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise ConfigError(f"{self.name} has no parameter {name!r}; its parameters are {self.param_names()}.")

    def param_names(self) -> list[str]:
        return [p.name for p in self.params]

    def resolve(self, overrides: Mapping[str, Any] | None, config: AttentionConfig | None = None) -> dict[str, Any]:
        """Defaults updated by ``overrides``, each converted and validated; unknown names raise."""
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - set(self.param_names()))
        if unknown:
            raise ConfigError(
                f"{self.name} has no parameter(s) {unknown}; valid parameters are {self.param_names() or 'none'}."
            )
        resolved = {}
        for p in self.params:
            value = overrides.get(p.name, p.default)
            resolved[p.name] = p.coerce(value, self.name)
        if self.validate is not None and config is not None:
            self.validate(resolved, config)
        return resolved

    def tolerance(self, dtype: torch.dtype | str) -> Tolerance:
        key = dtype_name(dtype)
        if key not in self.tolerances:
            raise ConfigError(f"{self.name} has no tolerance for dtype {key!r}; known: {sorted(self.tolerances)}.")
        return self.tolerances[key]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (``posenc show --json``)."""
        return {
            "name": self.name,
            "title": self.title,
            "family": self.family,
            "placement": self.placement.value,
            "table_modes": sorted(m.value for m in self.table_modes),
            "exports": sorted(self.exports),
            "summary": self.summary,
            "citation": self.citation,
            "verified_against": self.verified_against,
            "params": [
                {
                    "name": p.name,
                    "kind": p.kind,
                    "default": list(p.default) if isinstance(p.default, tuple) else p.default,
                    "doc": p.doc,
                    **({"choices": list(p.choices)} if p.choices else {}),
                }
                for p in self.params
            ],
            "tolerances": {k: dataclasses.asdict(v) for k, v in self.tolerances.items()},
            "cases": {k: dict(v) for k, v in self.cases.items()},
            "length_dependent": self.length_dependent,
            "position_axes": self.position_axes,
        }


class TableHolder(nn.Module):
    """A module whose position tables keep their dtype when the module is cast (``.half()``, ``.to``)."""

    def register_table(self, name: str, tensor: torch.Tensor, persistent: bool = True) -> None:
        """Register a position table (or frequency) buffer that keeps its dtype under ``.half()`` etc.

        Casting the module for fp16/bf16 export must not round the tables: they stay in the dtype they
        were registered with and only follow device moves.
        """
        self.register_buffer(name, tensor, persistent=persistent)
        kept = self.__dict__.setdefault("_kept_dtype_buffers", set())
        kept.add(name)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> TableHolder:
        kept = self.__dict__.get("_kept_dtype_buffers", set())
        originals = {name: buffer for name in kept if (buffer := self._buffers.get(name)) is not None}
        result = super()._apply(fn, recurse)
        for name, original in originals.items():
            moved = self._buffers[name]
            if moved is not None and moved.dtype != original.dtype:
                self._buffers[name] = original.to(device=moved.device)
        return result


class PositionalScheme(TableHolder):
    """Base class of every scheme module; subclasses implement the method of their placement.

    Attributes:
        spec: the scheme's :class:`SchemeSpec` (set by the registry).
        config: the attention geometry.
        params: resolved parameters.
        table_mode: :class:`TableMode`.
        max_positions: rows of precomputed tables; positions must be ``< max_positions`` in that mode.
    """

    spec: SchemeSpec
    guard_exported: bool = True
    """Whether an exported graph guards this scheme's positions (:meth:`guard`); ``export_onnx(position_guard=...)``
    sets it on the module it exports."""

    def __init__(
        self,
        config: AttentionConfig,
        params: Mapping[str, Any],
        table_mode: TableMode,
        max_positions: int,
        table_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.config = config
        self.params = dict(params)
        self.table_mode = table_mode
        self.max_positions = max_positions
        self.table_dtype = table_dtype
        self.build()

    def build(self) -> None:
        """Create the scheme's tables and parameters from ``config``, ``params``, ``table_mode``,
        ``max_positions`` and ``table_dtype`` (set by ``__init__`` just before); schemes override it."""

    @property
    def placement(self) -> Placement:
        return self.spec.placement

    def extra_repr(self) -> str:
        return f"{self.spec.name}, table_mode={self.table_mode.value}, max_positions={self.max_positions}"

    # -- position checks -------------------------------------------------------------------------

    @property
    def position_limit(self) -> int | None:
        """Exclusive upper bound on position ids, or ``None`` when any position works."""
        return self.max_positions if self.table_mode is TableMode.PRECOMPUTED else None

    def check_positions(self, position_ids: torch.Tensor) -> None:
        """Raise :class:`PositionError` for position ids a precomputed table cannot serve.

        Skipped while exporting or compiling (the runtime helpers check ONNX inputs instead).
        """
        if is_tracing():
            return
        if position_ids.dtype.is_floating_point or position_ids.dtype == torch.bool:
            raise ConfigError(f"position ids must be an integer tensor, got {position_ids.dtype}.")
        if position_ids.numel() == 0:
            return
        low = int(position_ids.min())
        if low < 0:
            raise PositionError(f"position ids must be >= 0, got {low}.")
        limit = self.position_limit
        if limit is not None:
            high = int(position_ids.max())
            if high >= limit:
                raise PositionError(
                    f"{self.spec.name}: position {high} is past the precomputed table of {limit} rows; "
                    f"{self.beyond_table_remedy(high)}"
                )

    def guard(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(position ids, poison)`` for a graph being exported: :func:`posenc.functional.position_guard` with
        this scheme's :attr:`position_limit` while tracing with :attr:`guard_exported` on; otherwise the ids
        unchanged and ``None`` (eager calls check positions with :meth:`check_positions`).

        Callers (the export units and :class:`~posenc.blocks.AttentionBlock`) pass the safe ids on and add the
        poison to what the positions produced (:func:`poisoned`).
        """
        if not (self.guard_exported and is_tracing()):
            return position_ids, None
        safe, poison = position_guard(position_ids, self.position_limit)
        if poison.dim() == 3:  # multi-axis ids [A, B, S] (M-RoPE, axial): an invalid id on any axis poisons its token
            poison = poison.sum(dim=0)
        return safe, poison

    def beyond_table_remedy(self, position: int) -> str:
        """What a user whose position ids reach ``position`` (past the table) should do; schemes may override."""
        longer = f"export with a longer table (max_positions > {position})"
        if TableMode.DYNAMIC in self.spec.table_modes:
            return f"{longer} or use table mode 'dynamic'."
        return f"{longer}."

    def share_projections(self, query: nn.Linear, key: nn.Linear) -> None:
        """Called by :class:`~posenc.blocks.AttentionBlock` with its ``q_proj`` / ``k_proj``.

        Schemes whose position terms reuse the block's projections (DeBERTa with ``share_att_key``) keep
        references to them; the default ignores them.
        """

    # -- placement methods (override the one that applies) ---------------------------------------

    def embed(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def rotate(self, q: torch.Tensor, k: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def bias(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def score_scale(self) -> float:
        """Multiplier of ``q @ k^T`` (and of any term inside :meth:`bias` that is scaled with it).

        ``config.attn_scale`` when set, else the scheme's :meth:`default_score_scale`.
        """
        if self.config.attn_scale is not None:
            return self.config.attn_scale
        return self.default_score_scale()

    def default_score_scale(self) -> float:
        """The scheme's own score multiplier (``1/√D``; schemes with more or unscaled terms override it)."""
        return 1.0 / math.sqrt(self.config.head_dim)

    def visible(self, q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool) -> torch.Tensor | None:
        """:func:`attention_mask` with this scheme's ``config.sliding_window`` and ``attention_chunk_size`` (for
        schemes that attend)."""
        return attention_mask(q_pos, k_pos, causal, self.config.sliding_window, self.config.attention_chunk_size)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        causal: bool,
    ) -> torch.Tensor:
        raise NotImplementedError


def poisoned(x: torch.Tensor, poison: torch.Tensor | None, seq_axis: int) -> torch.Tensor:
    """``x`` plus ``poison [B, S]`` (0 or NaN per position, :meth:`PositionalScheme.guard`) broadcast over every
    axis of ``x`` but batch (axis 0) and ``seq_axis``; ``x`` itself when there is no poison."""
    if poison is None:
        return x
    for axis in range(1, x.dim()):
        if axis != seq_axis:
            poison = poison.unsqueeze(axis)
    return x + poison.to(x.dtype)


def joint_poison(query: torch.Tensor | None, keys: torch.Tensor | None) -> torch.Tensor | None:
    """Per query ``[B, Sq]``: its own poison plus that of every key ``[B, Sk]`` it may attend (an invalid key
    position poisons every query of its row)."""
    if query is None or keys is None:
        return query if keys is None else keys.sum(dim=1, keepdim=True)
    return query + keys.sum(dim=1, keepdim=True)


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Boolean ``[B, 1, Sq, Sk]``: True where key position <= query position (may attend)."""
    return (k_pos.unsqueeze(1) <= q_pos.unsqueeze(2)).unsqueeze(1)


def attention_mask(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    causal: bool,
    sliding_window: int | None = None,
    chunk_size: int | None = None,
) -> torch.Tensor | None:
    """Which keys each query sees: boolean ``[B, 1, Sq, Sk]`` (True = may attend), or ``None`` for all.

    Causal: key position <= query position, and with a window ``w`` also ``k_pos > q_pos - w`` (transformers'
    ``sliding_window_overlay``); bidirectional with a window: ``|q_pos - k_pos| < w``. With chunks of ``c``
    positions (Llama 4's chunked attention, transformers' ``chunked_overlay``) also ``k_pos // c == q_pos // c``.
    """
    mask = _window_mask(q_pos, k_pos, causal, sliding_window)
    if chunk_size is None:
        return mask
    same = (torch.div(k_pos, chunk_size, rounding_mode="floor").unsqueeze(1)
            == torch.div(q_pos, chunk_size, rounding_mode="floor").unsqueeze(2)).unsqueeze(1)  # fmt: skip
    return same if mask is None else mask & same


def _window_mask(
    q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, sliding_window: int | None
) -> torch.Tensor | None:
    if sliding_window is None:
        return causal_mask(q_pos, k_pos) if causal else None
    if causal:
        recent = k_pos.unsqueeze(1) > q_pos.unsqueeze(2) - sliding_window
        return causal_mask(q_pos, k_pos) & recent.unsqueeze(1)
    near = (q_pos.unsqueeze(2) - k_pos.unsqueeze(1)).abs() < sliding_window
    return near.unsqueeze(1)


def soft_cap(scores: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Gemma 2's logit soft-capping ``cap · tanh(scores / cap)`` (identity when ``cap`` is ``None``)."""
    if cap is None:
        return scores
    return torch.tanh(scores / cap) * cap


def relative_distance(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """``key_pos - query_pos`` as ``[B, Sq, Sk]`` int64."""
    return k_pos.unsqueeze(1).to(torch.int64) - q_pos.unsqueeze(2).to(torch.int64)


def repeat_kv(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Repeat ``[B, Hkv, S, D]`` key/value heads to ``[B, H, S, D]`` (grouped-query attention)."""
    groups = num_heads // x.shape[1]
    if groups == 1:
        return x
    b, hkv, s, d = x.shape
    return x[:, :, None].expand(b, hkv, groups, s, d).reshape(b, hkv * groups, s, d)


def softmax_attention(
    scores: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, sinks: torch.Tensor | None = None
) -> torch.Tensor:
    """``softmax(scores + mask) @ v`` with the softmax in float32 (float64 for float64 input).

    Args:
        scores: ``[B, H, Sq, Sk]`` (already scaled and biased).
        v: ``[B, H, Sk, D]``.
        mask: boolean, broadcastable to scores, True = may attend; or ``None``.
        sinks: ``[H]`` attention sinks (gpt-oss): one more softmax column per head holding ``sinks[h]``, dropped
            after the softmax (``Concat``, ``Softmax``, ``Slice`` once exported), so the weights of the keys sum to
            less than one; ``None``: none.
    """
    compute = compute_dtype(scores)
    s = scores.to(compute)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    if sinks is None:
        return torch.softmax(s, dim=-1).to(v.dtype) @ v
    b, h, q = s.shape[0], s.shape[1], s.shape[2]
    column = sinks.to(compute).view(1, h, 1, 1).expand(b, h, q, 1)
    probs = torch.softmax(torch.cat((s, column), dim=-1), dim=-1)[..., :-1]
    return probs.to(v.dtype) @ v


def table_keys(module: nn.Module) -> set[str]:
    """``state_dict`` keys of position tables (buffers registered with :meth:`TableHolder.register_table`).

    Tables are functions of the scheme parameters: loaders and rebuilds compute their own instead of copying them.
    """
    keys = set()
    for prefix, sub in module.named_modules():
        for name in sub.__dict__.get("_kept_dtype_buffers", ()):
            keys.add(f"{prefix}.{name}" if prefix else name)
    return keys
