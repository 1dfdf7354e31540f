"""Export units: what goes into one ONNX graph, with its inputs, outputs and dynamic dims.

Three units exist:

``op``
    the scheme's positional op alone, one signature per placement
    (see :class:`posenc.schemes.base.Placement`):

    ==========  =================================================  ====================================
    placement   inputs                                             outputs
    ==========  =================================================  ====================================
    embedding   hidden ``[B, S, E]``, position_ids ``[B, S]``      hidden_out ``[B, S, E]``
    qk          q ``[B, H, S, D]``, k ``[B, Hkv, S, D]``,          q_rot, k_rot (shapes of q, k)
                position_ids ``[B, S]``
    score       q ``[B, H, S, D]``, k ``[B, H, Sk, D]``,           bias ``[B|1, H, S, Sk]``
                q_pos ``[B, S]``, k_pos ``[B, Sk]``
    attention   q, k, v (k/v ``[B, H, Sk, D]``), q_pos, k_pos      attn_out ``[B, H, S, D]``
    ==========  =================================================  ====================================

    Inputs a scheme does not read (q and k of a position-only bias such as ALiBi) are removed from
    the graph and from the manifest. NoPE has no op.
``op-3d``
    for rotary (``qk``) schemes: the same rotation on the projection layout a deployed block feeds it,
    q ``[B, S, H*D]``, k ``[B, S, Hkv*D]``, position_ids ``[B, S]`` -> q_rot, k_rot in that layout. ONNX
    Runtime's CPU RotaryEmbedding kernel streams this layout several times faster than ``[B, H, S, D]``.
``block``
    :class:`posenc.blocks.AttentionBlock`: hidden ``[B, S, E]``, position_ids ``[B, S]`` (int64),
    past_key / past_value ``[B, Hkv, P, D]`` -> out ``[B, S, E]``, present_key / present_value
    ``[B, Hkv, P + S, D]``. The past inputs always exist; P = 0 is a valid size. The concatenated cache
    (``--kv-cache concat``): every step copies the whole cache into new presents.
``block-inplace``
    the same block over a preallocated cache (``--kv-cache inplace``,
    :meth:`posenc.blocks.AttentionBlock.forward_in_place`): hidden ``[B, S, E]``, position_ids ``[B, S]``,
    key_cache / value_cache ``[B, Hkv, C, D]`` (finite values in every slot), past_length ``[B]`` (int64, slots
    filled per row) -> out ``[B, S, E]``, present_key / present_value ``[B, Hkv, C, D]``: the caches with the new
    keys and values at slots ``past_length .. past_length + S - 1``, written by one ONNX ``TensorScatter`` each
    (opset 24). Bind each present to its cache's buffer and a step writes only the new slots. Attention reads
    the slots up to the longest row's ``past_length + S``. ``C`` is static: the block's ``max_positions`` (the
    rows of its tables, by default the context length), as TensorRT's KV-cache update layer requires. A causal
    sliding-window block's caches are a **ring** of ``W + RING_STEP - 1`` slots by default (any ``C >= W`` with
    ``cache_capacity``; a ``C`` that covers the positions keeps the linear cache): token ``t`` at slot ``t mod C``
    (``TensorScatter`` in ``circular`` mode), ``past_length`` counts every token written, and a call brings at most
    ``C - min(past_length, W - 1)`` new tokens (the manifest's ``cache_ring``).

A :class:`Shape` ``(batch, seq, past)`` sizes every unit: ``seq`` new tokens at positions ``past .. past + seq - 1``;
keys (score/attention ops) cover positions ``0 .. past + seq - 1``. Feeds (:mod:`posenc.export.feeds`) of a
``block-inplace`` graph hold ``past`` filled slots per row; the slots after the new tokens hold random values too
(which the attention must not read).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from posenc.blocks import AttentionBlock, MLABlock, MLAConfig, rotary_geometry
from posenc.blocks.attention import ring_serves
from posenc.config import AttentionConfig
from posenc.dtypes import NUMPY_DTYPES
from posenc.errors import ExportError
from posenc.export.feeds import SOURCE, Slot, make_inputs
from posenc.export.kinds import BLOCK_INPLACE as BLOCK_INPLACE  # re-exported: the unit names' old home
from posenc.export.kinds import UnitKind
from posenc.export.shapes import SAMPLE_SHAPE, Shape
from posenc.schemes.base import Placement, PositionalScheme, joint_poison, poisoned

# --------------------------------------------------------------------------------------------------
# Unit modules (thin forwards into the scheme / block; no math here)
# --------------------------------------------------------------------------------------------------


class _SchemeOp(nn.Module):
    """An export wrapper whose forward calls one method of ``scheme`` with graph inputs."""

    def __init__(self, scheme: PositionalScheme) -> None:
        super().__init__()
        self.scheme = scheme


class EmbeddingOp(_SchemeOp):
    """``(hidden [B, S, E], position_ids [B, S]) -> hidden [B, S, E]``."""

    def forward(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        position_ids, poison = self.scheme.guard(position_ids)
        return poisoned(self.scheme.embed(hidden, position_ids), poison, 1)


class RotateOp(_SchemeOp):
    """``(q [B, H, S, D], k [B, Hkv, S, D], position_ids [B, S]) -> (q_rot, k_rot)``."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        position_ids, poison = self.scheme.guard(position_ids)
        q_rot, k_rot = self.scheme.rotate(q, k, position_ids)
        return poisoned(q_rot, poison, 2), poisoned(k_rot, poison, 2)


class RotateProjectionOp(_SchemeOp):
    """``(q [B, S, H*D], k [B, S, Hkv*D], position_ids [B, S]) -> (q_rot, k_rot)`` in the projection layout.

    Splits heads, calls the scheme's :meth:`~posenc.schemes.base.PositionalScheme.rotate` and merges heads
    back (``posenc optimize --target ort-cpu`` turns that into two 3-D RotaryEmbedding nodes and nothing else;
    the position guard's poison is added after the merge, where it leaves that pattern whole).
    """

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.scheme.config
        b, s = q.shape[0], q.shape[1]
        position_ids, poison = self.scheme.guard(position_ids)
        q4 = q.reshape(b, s, cfg.num_heads, cfg.head_dim).transpose(1, 2)
        k4 = k.reshape(b, s, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        q_rot, k_rot = self.scheme.rotate(q4, k4, position_ids)
        return (
            poisoned(q_rot.transpose(1, 2).reshape(b, s, cfg.num_heads * cfg.head_dim), poison, 1),
            poisoned(k_rot.transpose(1, 2).reshape(b, s, cfg.num_kv_heads * cfg.head_dim), poison, 1),
        )


class BiasOp(_SchemeOp):
    """``(q [B, H, S, D], k [B, H, Sk, D], q_pos [B, S], k_pos [B, Sk]) -> bias [B|1, H, S, Sk]``."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        q_pos, q_poison = self.scheme.guard(q_pos)
        k_pos, k_poison = self.scheme.guard(k_pos)
        return poisoned(poisoned(self.scheme.bias(q, k, q_pos, k_pos), q_poison, 2), k_poison, 3)


class AttendOp(_SchemeOp):
    """``(q, k, v [B, H, *, D], q_pos [B, S], k_pos [B, Sk]) -> attn_out [B, H, S, D]`` (causal per config)."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> torch.Tensor:
        q_pos, q_poison = self.scheme.guard(q_pos)
        k_pos, k_poison = self.scheme.guard(k_pos)
        out = self.scheme.attend(q, k, v, q_pos, k_pos, self.scheme.config.causal)
        return poisoned(out, joint_poison(q_poison, k_poison), 2)


class InPlaceBlock(nn.Module):
    """``(hidden, position_ids, key_cache, value_cache, past_length) -> (out, present_key, present_value)``:
    :meth:`posenc.blocks.AttentionBlock.forward_in_place` (the unit ``block-inplace``); ``ring``: the caches are a
    sliding window's ring buffer."""

    def __init__(self, block: AttentionBlock, ring: bool = False) -> None:
        super().__init__()
        self.block = block
        self.ring = ring

    @property
    def scheme(self) -> PositionalScheme:
        """The block's scheme (what callers of any unit module read its positions and tables from)."""
        return self.block.scheme

    def forward(
        self,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        past_length: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.block.forward_in_place(hidden, position_ids, key_cache, value_cache, past_length, self.ring)


_OP_CLASSES: Mapping[Placement, type[nn.Module]] = {
    Placement.EMBEDDING: EmbeddingOp,
    Placement.QK: RotateOp,
    Placement.SCORE: BiasOp,
    Placement.ATTENTION: AttendOp,
}


# --------------------------------------------------------------------------------------------------
# Input / output layout of each unit
# --------------------------------------------------------------------------------------------------


def _position_slot(axes: int) -> Slot:
    """``position_ids [B, S]``, or ``[A, B, S]`` (one row per axis) for multi-axis schemes."""
    if axes == 1:
        return Slot("position_ids", "pos_q", ("batch", "seq"), "[B, S]")
    return Slot("position_ids", "pos_q", (axes, "batch", "seq"), f"[{axes}, B, S]")


def _slots(
    unit: UnitKind,
    placement: Placement,
    config: AttentionConfig | MLAConfig,
    position_axes: int = 1,
    cache_slots: int | None = None,
) -> tuple[list[Slot], list[tuple[str, str]]]:
    """Input slots and ``(output name, layout)`` of a unit (``position_axes``: the scheme's, see
    :attr:`posenc.schemes.SchemeSpec.position_axes`; ``cache_slots``: ``C`` of ``block-inplace``, default the
    context length)."""
    positions = _position_slot(position_axes)
    if unit is UnitKind.BLOCK and isinstance(config, MLAConfig):
        return _mla_slots(config, positions)
    config = rotary_geometry(config)  # an MLA geometry's op rotates its rope slice
    e, h, hkv, d = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
    dv, width = config.value_dim, "D" if config.v_head_dim is None else "Dv"  # values narrower than keys: Dv
    if unit is UnitKind.BLOCK:
        return (
            [
                Slot("hidden", "act", ("batch", "seq", e), "[B, S, E]"),
                positions,
                Slot("past_key", "past", ("batch", hkv, "past", d), "[B, Hkv, P, D]"),
                Slot("past_value", "past", ("batch", hkv, "past", dv), f"[B, Hkv, P, {width}]"),
            ],
            [("out", "[B, S, E]"), ("present_key", "[B, Hkv, P+S, D]"), ("present_value", f"[B, Hkv, P+S, {width}]")],
        )
    if unit is UnitKind.BLOCK_INPLACE:
        c = config.max_position_embeddings if cache_slots is None else cache_slots
        return (
            [
                Slot("hidden", "act", ("batch", "seq", e), "[B, S, E]"),
                positions,
                Slot("key_cache", "past", ("batch", hkv, c, d), "[B, Hkv, C, D]"),
                Slot("value_cache", "past", ("batch", hkv, c, dv), f"[B, Hkv, C, {width}]"),
                Slot("past_length", "length", ("batch",), "[B]"),
            ],
            [("out", "[B, S, E]"), ("present_key", "[B, Hkv, C, D]"), ("present_value", f"[B, Hkv, C, {width}]")],
        )
    if unit is UnitKind.OP_3D:
        return (
            [
                Slot("q", "act", ("batch", "seq", h * d), "[B, S, H*D]"),
                Slot("k", "act", ("batch", "seq", hkv * d), "[B, S, Hkv*D]"),
                positions,
            ],
            [("q_rot", "[B, S, H*D]"), ("k_rot", "[B, S, Hkv*D]")],
        )
    if placement is Placement.EMBEDDING:
        return (
            [
                Slot("hidden", "act", ("batch", "seq", e), "[B, S, E]"),
                positions,
            ],
            [("hidden_out", "[B, S, E]")],
        )
    if placement is Placement.QK:
        return (
            [
                Slot("q", "act", ("batch", h, "seq", d), "[B, H, S, D]"),
                Slot("k", "act", ("batch", hkv, "seq", d), "[B, Hkv, S, D]"),
                positions,
            ],
            [("q_rot", "[B, H, S, D]"), ("k_rot", "[B, Hkv, S, D]")],
        )
    qk = [
        Slot("q", "act", ("batch", h, "seq", d), "[B, H, S, D]"),
        Slot("k", "act", ("batch", h, "kv_seq", d), "[B, H, Sk, D]"),
    ]
    pair = [
        Slot("q_pos", "pos_q", ("batch", "seq"), "[B, S]"),
        Slot("k_pos", "pos_k", ("batch", "kv_seq"), "[B, Sk]"),
    ]
    if placement is Placement.SCORE:
        return [*qk, *pair], [("bias", "[B|1, H, S, Sk]")]
    if placement is Placement.ATTENTION:
        v = Slot("v", "act", ("batch", h, "kv_seq", d), "[B, H, Sk, D]")
        return [*qk, v, *pair], [("attn_out", "[B, H, S, D]")]
    raise ExportError(f"placement {placement.value!r} has no positional op; export unit 'block' instead.")


def _mla_slots(config: MLAConfig, positions: Slot) -> tuple[list[Slot], list[tuple[str, str]]]:
    """An MLA block's inputs and outputs: its cache holds the latent ``[B, 1, P, C]`` and the rotated key slice."""
    c, r = config.kv_lora_rank, config.qk_rope_head_dim
    return (
        [
            Slot("hidden", "act", ("batch", "seq", config.hidden_size), "[B, S, E]"),
            positions,
            Slot("past_key", "past", ("batch", 1, "past", c), "[B, 1, P, C] (latent)"),
            Slot("past_value", "past", ("batch", 1, "past", r), "[B, 1, P, R] (rotated shared key)"),
        ],
        [
            ("out", "[B, S, E]"),
            ("present_key", "[B, 1, P+S, C] (latent)"),
            ("present_value", "[B, 1, P+S, R] (rotated shared key)"),
        ],
    )


@dataclasses.dataclass
class ExportUnit:
    """A module ready for export plus everything needed to trace it and describe its graph.

    Attributes:
        kind: what the graph holds (:class:`~posenc.export.kinds.UnitKind`).
        module: the module whose ``forward`` is exported (inputs in :attr:`input_names` order).
        inner: the scheme or block whose ``state_dict`` is saved as the weights.
        config: attention geometry.
        dtype: activation dtype.
    """

    kind: UnitKind
    module: nn.Module
    inner: nn.Module
    config: AttentionConfig | MLAConfig
    dtype: torch.dtype
    slots: list[Slot]
    outputs: list[tuple[str, str]]

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.slots]

    @property
    def output_names(self) -> list[str]:
        return [name for name, _ in self.outputs]

    @property
    def scheme(self) -> PositionalScheme:
        if isinstance(self.inner, (AttentionBlock, MLABlock)):
            return self.inner.scheme
        return self.inner  # type: ignore[return-value]  # an op unit wraps the scheme itself

    def input_layouts(self) -> dict[str, tuple[tuple[int | str, ...], str, str]]:
        """name -> (symbolic shape, layout, role)."""
        roles = {"act": "activation", "pos_q": "positions", "pos_k": "positions", "past": "cache", "length": "length",
                 "boxes": "boxes"}  # fmt: skip
        return {s.name: (s.shape, s.layout, roles[s.kind]) for s in self.slots}

    def sample_inputs(self, shape: Shape = SAMPLE_SHAPE, position_limit: int | None = None) -> tuple:
        """Torch tensors for tracing, in input order (see :func:`make_inputs`)."""
        arrays = make_inputs(self.slots, shape, self.dtype, seed=0, position_limit=position_limit)
        return tuple(
            torch.from_numpy(np.ascontiguousarray(a)) if a.dtype != NUMPY_DTYPES["bfloat16"] else _bf16_tensor(a)
            for a in arrays
        )

    def dynamic_shapes(self, names: bool = False) -> tuple[dict[int, Any], ...]:
        """Per-input ``{axis: Dim}`` (or ``{axis: name}`` with ``names=True``) for torch.export / renaming."""
        dims = _export_dims()
        return tuple(
            {axis: (size if names else dims[size]) for axis, size in enumerate(s.shape) if isinstance(size, str)}
            for s in self.slots
        )


def _export_dims() -> dict[str, Any]:
    Dim = torch.export.Dim
    return {
        "batch": Dim("batch", min=1),
        "seq": Dim("seq", min=1),
        "past": Dim("past", min=0),
        "kv_seq": Dim("kv_seq", min=1),
        SOURCE: Dim(SOURCE, min=1),  # a second stream's own length (posenc.export.feeds.SOURCE)
    }


RING_STEP = 16
"""New tokens per call a sliding-window block's default ring cache (``W + RING_STEP - 1`` slots) serves once its
window is full (the decode steps of ``posenc.graphs.cache_decode``)."""


def ring_capacity(block: AttentionBlock, cache_capacity: int | None) -> int | None:
    """Slots of ``block``'s in-place ring cache, or ``None`` for a linear cache: a causal sliding-window block
    (:func:`posenc.blocks.attention.ring_serves`) gets ``cache_capacity`` (default ``W + RING_STEP - 1``) when it is
    shorter than the block's positions.

    Raises:
        ExportError: a ring shorter than the window.
    """
    if not ring_serves(block):
        return None
    window = int(block.config.sliding_window)  # type: ignore[arg-type]  # ring_serves: a window
    slots = window + RING_STEP - 1 if cache_capacity is None else int(cache_capacity)
    if slots >= int(block.scheme.max_positions):
        return None
    if slots < window:
        raise ExportError(
            f"cache_capacity {slots} is shorter than the block's sliding window ({window}): a ring cache holds the "
            f"window; give --cache-capacity >= {window} (or >= {int(block.scheme.max_positions)} for a linear cache)."
        )
    return slots


def make_unit(
    inner: nn.Module, unit: UnitKind, dtype: torch.dtype, cache_capacity: int | None = None, ring: bool | None = None
) -> ExportUnit:
    """Wrap an :class:`AttentionBlock` (a block unit) or a :class:`PositionalScheme` (an op unit; a block's scheme
    where a block is given).

    ``cache_capacity``: slots of a ``block-inplace`` unit's caches (default: the block's table length; a causal
    sliding-window block's ring, :func:`ring_capacity`). ``ring``: the rebuild of an export says whether its caches
    are a ring (``None``: as :func:`ring_capacity` decides).

    Raises:
        ExportError: the scheme has no op (NoPE) or the unit does not fit the module.
    """
    if unit is UnitKind.BLOCK:
        if not isinstance(inner, (AttentionBlock, MLABlock)):
            raise ExportError("unit 'block' exports an AttentionBlock or an MLABlock; pass one (or a scheme name).")
        slots, outputs = _slots(unit, inner.scheme.placement, inner.config, inner.scheme.spec.position_axes)
        return ExportUnit(unit, inner, inner, inner.config, dtype, slots, outputs)
    if unit is UnitKind.BLOCK_INPLACE:
        if not isinstance(inner, AttentionBlock):
            raise ExportError(f"unit {unit.value!r} exports an AttentionBlock; pass one (or a scheme name).")
        ring_slots = ring_capacity(inner, cache_capacity) if ring is None else None
        cache = int(inner.scheme.max_positions) if cache_capacity is None else int(cache_capacity)
        cache = ring_slots if ring_slots is not None else cache
        slots, outputs = _slots(unit, inner.scheme.placement, inner.config, inner.scheme.spec.position_axes, cache)
        in_place = InPlaceBlock(inner, ring=bool(ring) if ring is not None else ring_slots is not None)
        return ExportUnit(unit, in_place, inner, inner.config, dtype, slots, outputs)
    scheme = op_module(inner, unit)
    slots, outputs = _slots(unit, scheme.placement, scheme.config, scheme.spec.position_axes)
    op = RotateProjectionOp(scheme) if unit is UnitKind.OP_3D else _OP_CLASSES[scheme.placement](scheme)
    return ExportUnit(unit, op, scheme, scheme.config, dtype, slots, outputs)


def op_module(inner: nn.Module, unit: UnitKind) -> PositionalScheme:
    """The scheme an op unit exports: ``inner`` itself, or a block's scheme.

    Raises:
        ExportError: ``inner`` holds no scheme, the scheme has no op (NoPE), or ``op-3d`` of a scheme that does not
            rotate q and k.
    """
    scheme = inner.scheme if isinstance(inner, (AttentionBlock, MLABlock)) else inner
    if not isinstance(scheme, PositionalScheme):
        raise ExportError(f"unit {unit.value!r} exports a PositionalScheme, got {type(inner).__name__}.")
    if scheme.placement not in _OP_CLASSES or "op" not in scheme.spec.exports:
        raise ExportError(
            f"scheme {scheme.spec.name!r} has no positional op to export (acts at {scheme.placement.value!r}); "
            f"export unit 'block' instead (it supports {sorted(scheme.spec.exports)})."
        )
    if unit is UnitKind.OP_3D and scheme.placement is not Placement.QK:
        raise ExportError(
            f"unit 'op-3d' is a rotation of q and k in the projection layout; {scheme.spec.name!r} acts at "
            f"{scheme.placement.value!r}. Use unit 'op' or 'block'."
        )
    return scheme


def _bf16_tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array.astype(np.float32))).to(torch.bfloat16)
