"""AttentionBlock: q/k/v/o projections, grouped-query heads, a KV cache, and one positional scheme.

This is the unit users export and deploy. The scheme acts at exactly one place (see
:class:`posenc.schemes.base.Placement`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from posenc.artifacts.memory import check_bytes
from posenc.blocks.norms import HeadRMSNorm, qk_norms
from posenc.config import AttentionConfig
from posenc.dtypes import compute_dtype
from posenc.errors import ConfigError
from posenc.functional import is_tracing, write_cache
from posenc.schemes import build_scheme
from posenc.schemes.base import (
    Placement,
    PositionalScheme,
    TableMode,
    attention_mask,
    joint_poison,
    poisoned,
    repeat_kv,
    soft_cap,
    softmax_attention,
)


def temperature_tuned(
    q: torch.Tensor, q_pos: torch.Tensor, floor_scale: int, scale: float, offset: int = 1
) -> torch.Tensor:
    """Llama 4's attention-temperature tuning (Nakanishi, "Scalable-Softmax Is Superior for Attention", 2025,
    https://arxiv.org/abs/2501.19399): ``q [B, H, S, D]`` at positions ``q_pos [B, S]`` times
    ``1 + scale · ln(1 + floor((p + offset) / floor_scale))`` (Llama 4: offset 1; Ministral 3's ``llama_4_scaling``:
    offset 0), computed in float32 (float64 for float64 q) with an exact integer floor, cast back to q's dtype."""
    compute = compute_dtype(q)
    steps = torch.div(q_pos + offset, floor_scale, rounding_mode="floor").to(compute)
    factor = torch.log(steps + 1.0) * scale + 1.0
    return (q.to(compute) * factor[:, None, :, None]).to(q.dtype)


def gated(out: torch.Tensor, gate: torch.Tensor, activation: str, heads: int) -> torch.Tensor:
    """The attention output ``out [B, S, H·D]`` times ``activation(gate)``: ``gate [B, S, H·D]``, or ``[B, S, H]``
    (one value per head). ``sigmoid`` or ``softplus``, computed in float32 (float64 for float64 input) and cast to
    ``out``'s dtype before the product."""
    compute = compute_dtype(gate)
    g = gate.to(compute)
    g = (torch.sigmoid(g) if activation == "sigmoid" else F.softplus(g)).to(out.dtype)
    if g.shape[-1] == out.shape[-1]:
        return out * g
    b, s = out.shape[0], out.shape[1]
    return (out.view(b, s, heads, -1) * g.unsqueeze(-1)).view(b, s, -1)


def default_positions(batch: int, seq: int, past: int, device: torch.device | None = None) -> torch.Tensor:
    """Position ids ``[B, S]`` of ``seq`` new tokens after ``past`` cached ones: ``past + arange(seq)`` per row."""
    return (torch.arange(seq, device=device) + past).unsqueeze(0).expand(batch, seq)


def block_scheme(
    config: AttentionConfig,
    scheme: str | PositionalScheme,
    params: Mapping[str, Any] | None,
    table_mode: TableMode | str | None,
    max_positions: int | None,
    table_dtype: torch.dtype | None,
) -> PositionalScheme:
    """The scheme module of a block whose positions have geometry ``config``: ``scheme`` itself when it is built
    (for ``config``; the other arguments must then be unset), else built by name (tables float32 by default).

    Raises:
        ConfigError: options given with a built scheme, or a scheme built for another geometry.
    """
    if not isinstance(scheme, PositionalScheme):
        dtype = torch.float32 if table_dtype is None else table_dtype
        return build_scheme(scheme, config, params, table_mode, max_positions, dtype)
    given = {"params": params, "table_mode": table_mode, "max_positions": max_positions, "table_dtype": table_dtype}
    extra = [name for name, value in given.items() if value]
    if extra:
        raise ConfigError(
            f"pass {', '.join(extra)} only with a scheme name; the built {scheme.spec.name!r} module "
            f"already fixed them (build it with build_scheme(..., table_mode=..., max_positions=...))."
        )
    if scheme.config != config:
        raise ConfigError(
            f"the built {scheme.spec.name!r} module was built for {scheme.config}, but the block's config "
            f"is {config}; build the scheme with the block's config."
        )
    return scheme


class AttentionBlock(nn.Module):
    """Multi-head (grouped-query) attention with a positional scheme plugged in where it acts.

    Args:
        config: geometry (hidden size, heads, kv heads, head dim, causal, context length) and the attention options
            (projection biases, score scale, logit soft-cap, sliding window, q/k RMSNorm).
        scheme: registered scheme name or an already built :class:`PositionalScheme`.
        params: scheme parameter overrides (when ``scheme`` is a name).
        table_mode: ``precomputed`` or ``dynamic`` (default: ``precomputed`` where the scheme has it).
        max_positions: rows of precomputed tables (default ``config.max_position_embeddings``).
        table_dtype: dtype of position tables (float32 by default, whatever the activation dtype).
            ``params``, ``table_mode``, ``max_positions`` and ``table_dtype`` apply only to a scheme name;
            a built scheme already fixed them and must have been built for ``config``.

    Shapes:
        hidden ``[B, S, E]``; position_ids ``[B, S]`` or ``[1, S]`` int64 (default ``P + arange(S)``);
        past_key / past_value ``[B, Hkv, P, D]`` (values ``Dv`` wide with ``config.v_head_dim``); returns
        ``(out [B, S, E], present_key, present_value)`` with presents ``[B, Hkv, P + S, D]``. Cached keys sit at
        positions ``0 .. P - 1``, new keys at ``position_ids`` (so the causal mask and relative distances follow the
        ids you pass).
        For ``qk`` schemes the cache holds rotated keys; for ``attention`` schemes, unrotated keys.

    Computation: ``q, k, v`` from ``q_proj``/``k_proj``/``v_proj`` (bias when ``config.qkv_bias``), then
    ``q_norm``/``k_norm`` (``config.qk_norm``; after the rotation with ``config.qk_norm_after_rope``; over the whole
    projection with ``config.qk_norm_full_width``) and ``v_norm`` (``config.v_norm``, no weights; the values are
    ``k_proj``'s output before its norm with ``config.values_from_keys``, which has no ``v_proj``), then the scheme;
    q's temperature (``config.temperature_floor_scale``); scores ``q·kᵀ · scale`` (+ bias of a ``score``
    scheme), ``cap · tanh(scores / cap)`` when ``config.logit_softcap``, masked by causality,
    ``config.sliding_window`` and ``config.attention_chunk_size``, softmax in float32, ``@ v``, heads merged,
    ``o_proj`` (bias when ``config.out_bias``; its input ``H·Dv`` wide with values narrower than keys,
    ``config.v_head_dim``). Multi-axis schemes take position ids ``[A, B, S]`` and mask in
    token order (cached keys at ``0 .. P - 1``, new tokens at ``P .. P + S - 1``), as transformers' Qwen2-VL does.

    With ``config.attention_sinks`` the softmax has one more column per head holding ``sinks[h]``; with
    ``config.output_gate`` the merged heads are multiplied by ``sigmoid`` / ``softplus`` of ``gate_proj(hidden)``
    before ``o_proj`` (:func:`gated`).

    State dict keys: ``q_proj.*``, ``k_proj.*``, ``v_proj.*`` (none with ``values_from_keys``), ``o_proj.*``
    (``.bias`` as configured),
    ``q_norm.weight`` / ``k_norm.weight`` (``[D]``; ``[H·D]`` / ``[Hkv·D]`` with ``qk_norm_full_width``; and
    ``.bias`` for ``qk_norm="layer"``), ``sinks [H]``,
    ``gate_proj.*``, and ``scheme.*``. A DeBERTa scheme with
    ``share_att_key`` uses ``q_proj`` / ``k_proj`` for its position terms (no ``scheme.pos_*_proj`` keys).
    """

    scheme: PositionalScheme  # the positional scheme module, a submodule

    def __init__(
        self,
        config: AttentionConfig,
        scheme: str | PositionalScheme = "rope",
        params: Mapping[str, Any] | None = None,
        table_mode: TableMode | str | None = None,
        max_positions: int | None = None,
        table_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        h, hkv, d, e = config.num_heads, config.num_kv_heads, config.head_dim, config.hidden_size
        dv = config.value_dim
        check_bytes(
            4 * e * (h * d + h * dv + hkv * d + hkv * dv),  # q, o, k and v projections in float32
            f"the projection weights of hidden size {e} with {h}/{hkv} heads of {d}",
            "choose a smaller hidden size, head count or head dim.",
        )
        self.scheme = block_scheme(config, scheme, params, table_mode, max_positions, table_dtype)
        self.q_proj = nn.Linear(e, h * d, bias=config.qkv_bias)
        self.k_proj = nn.Linear(e, hkv * d, bias=config.qkv_bias)
        self.v_proj = None if config.values_from_keys else nn.Linear(e, hkv * dv, bias=config.qkv_bias)
        self.o_proj = nn.Linear(h * dv, e, bias=config.out_bias)
        self.q_norm, self.k_norm = qk_norms(config)
        self.v_norm = HeadRMSNorm(dv, config.qk_norm_eps, learned=False) if config.v_norm else None
        # sinks drawn like the projections' seeded weights (a checkpoint's replace them), so that they show
        self.sinks = nn.Parameter(torch.randn(h)) if config.attention_sinks else None
        gate_width = h if config.output_gate_per_head else h * dv
        self.gate_proj = nn.Linear(e, gate_width, bias=config.qkv_bias) if config.output_gate != "none" else None
        self.scheme.share_projections(self.q_proj, self.k_proj)

    def forward(
        self,
        hidden: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        past_key: torch.Tensor | None = None,
        past_value: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, s = hidden.shape[0], hidden.shape[1]
        past = 0 if past_key is None else past_key.shape[2]
        position_ids = self.positions(hidden, position_ids, past)
        if past_key is not None and past_value is None:
            raise ConfigError("past_key was given without past_value; pass both or neither.")
        if past_value is not None and past_key is None:
            raise ConfigError("past_value was given without past_key; pass both or neither.")
        # An exported graph guards positions (posenc.functional.position_guard): safe ids go on, and the poison
        # (NaN for an invalid query or key position) enters the new tokens' hidden states, so q, k, v, out and the
        # cache carry it. Poisoning before the projections leaves the rotation and attention fusable.
        position_ids, poison = self.scheme.guard(position_ids)
        # Cached keys sit at 0..P-1, the new keys at the queries' own positions (token order for multi-axis ids).
        order = position_ids if position_ids.dim() == 2 else default_positions(b, s, past, hidden.device)
        past_positions = torch.arange(past, device=hidden.device, dtype=order.dtype)
        key_positions = torch.cat((past_positions.unsqueeze(0).expand(b, past), order), dim=1)
        key_positions, key_poison = self.guard_keys(key_positions)
        poison = joint_poison(poison, key_poison)
        x = poisoned(hidden, poison, 1)
        q, k, v = self.project(x, position_ids)
        if past_key is not None and past_value is not None:
            k = torch.cat((past_key.to(k.dtype), k), dim=2)
            v = torch.cat((past_value.to(v.dtype), v), dim=2)
        return self.attend(q, k, v, order, key_positions, gate=self.gate(x, position_ids)), k, v

    def guard_keys(self, key_positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`PositionalScheme.guard` of the key positions ``[B, Sk]``, where the scheme reads a table with them.

        Only ``score`` and ``attention`` schemes do (a bias or attention computed from query and key positions).
        Elsewhere a key's position was used once, when its key was projected: the new keys' positions are the
        queries' own (guarded; their poison rides in the new keys and values to every query that attends them), the
        cached keys' are only compared by the masks. Skipping them keeps the guard off the cache's length at decode.
        """
        if self.scheme.placement in (Placement.SCORE, Placement.ATTENTION):
            return self.scheme.guard(key_positions)
        return key_positions, None

    def positions(self, hidden: torch.Tensor, position_ids: torch.Tensor | None, past: int) -> torch.Tensor:
        """``position_ids [B, S]`` of the new tokens: given (``[1, S]`` broadcast), or ``past + arange(S)``.

        Multi-axis schemes (``scheme.spec.position_axes`` A > 1: M-RoPE, axial) take ``[A, B, S]`` (``[A, 1, S]``
        broadcast); ``[B, S]`` ids are text-only and stand for every axis (as transformers' Qwen2-VL expands them).
        """
        b, s = hidden.shape[0], hidden.shape[1]
        axes = self.scheme.spec.position_axes
        if position_ids is None:
            order = default_positions(b, s, past, hidden.device)
            return order if axes == 1 else order.unsqueeze(0).expand(axes, b, s)
        if is_tracing():  # export keeps the ids as given ([B, S] or [A, B, S])
            return position_ids
        shape = tuple(position_ids.shape)
        if axes > 1 and len(shape) == 2:
            return self.positions(hidden, position_ids.unsqueeze(0).expand(axes, *shape), past)
        lead = () if axes == 1 else (axes,)
        if shape not in ((*lead, b, s), (*lead, 1, s)):
            per_axis = f", one row per axis of {self.scheme.spec.name}" if lead else ""
            raise ConfigError(
                f"position_ids have shape {shape}; hidden [B={b}, S={s}, E] needs {[*lead, b, s]} (or "
                f"{[*lead, 1, s]}, shared by the batch){per_axis}."
            )
        return position_ids.expand(*lead, b, s)

    def project(
        self, hidden: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The new tokens' ``q [B, H, S, D]``, ``k``, ``v [B, Hkv, S, D]``: the embedding step of an
        ``embedding`` scheme, the projections, the q/k norms and, for a ``qk`` scheme, its rotation (so ``k`` is
        what a KV cache holds)."""
        cfg = self.config
        b, s, _ = hidden.shape
        placement = self.scheme.placement
        x = self.scheme.embed(hidden, position_ids) if placement is Placement.EMBEDDING else hidden
        q, k = self.q_proj(x), self.k_proj(x)
        v = k if self.v_proj is None else self.v_proj(x)  # values_from_keys: the keys before their norm and rotation
        norms = self.q_norm is not None and self.k_norm is not None
        if norms and cfg.qk_norm_full_width:  # over the whole projection [B, S, H·D], before the head split
            q, k = self.q_norm(q), self.k_norm(k)  # type: ignore[misc]  # set whenever qk_norm is
        q = q.view(b, s, cfg.num_heads, cfg.head_dim)
        k = k.view(b, s, cfg.num_kv_heads, cfg.head_dim)
        if norms and not cfg.qk_norm_after_rope and not cfg.qk_norm_full_width:
            q, k = self.q_norm(q), self.k_norm(k)  # type: ignore[misc]  # set whenever qk_norm is
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, s, cfg.num_kv_heads, cfg.value_dim)
        if self.v_norm is not None:
            v = self.v_norm(v)
        v = v.transpose(1, 2)
        if placement is Placement.QK:
            q, k = self.scheme.rotate(q, k, position_ids)
        if norms and cfg.qk_norm_after_rope:
            q, k = self.q_norm(q), self.k_norm(k)  # type: ignore[misc]  # set whenever qk_norm is
        return q, k, v

    def gate(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor | None:
        """The output gate's pre-activation ``[B, S, H·D]`` (``[B, S, H]`` per head) from the same input as the
        projections (``config.output_gate``), or ``None`` for a block without a gate."""
        if self.gate_proj is None:
            return None
        embedding = self.scheme.placement is Placement.EMBEDDING
        return self.gate_proj(self.scheme.embed(hidden, position_ids) if embedding else hidden)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        key_mask: torch.Tensor | None = None,
        gate: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of ``q [B, H, Sq, D]`` over all keys ``k``, ``v [B, Hkv, Sk, D]`` at positions ``q_pos [B, Sq]``
        and ``k_pos [B, Sk]`` (grouped heads, scheme bias or attention, soft-cap, causal and window masks, sinks),
        heads merged, the output gate and ``o_proj``: ``[B, Sq, E]``. ``key_mask [B, Sk]`` (bool, True = a real key)
        hides cache slots that hold no key yet (a preallocated cache). ``gate``: :meth:`gate` of the new tokens'
        input, for a block with ``config.output_gate``.

        Raises:
            ConfigError: a gated block called without ``gate``.
        """
        cfg = self.config
        b, s = q.shape[0], q.shape[2]
        placement = self.scheme.placement
        if cfg.temperature_floor_scale is not None:
            q = temperature_tuned(q, q_pos, cfg.temperature_floor_scale, cfg.temperature_scale, cfg.temperature_offset)
        k, v = repeat_kv(k, cfg.num_heads), repeat_kv(v, cfg.num_heads)
        if placement is Placement.ATTENTION:
            if key_mask is not None:
                raise ConfigError(
                    f"{self.scheme.spec.name} computes attention itself and cannot hide unused cache slots; "
                    f"use the concatenated cache."
                )
            out = self.scheme.attend(q, k, v, q_pos, k_pos, cfg.causal)
        else:
            scores = (q @ k.transpose(-1, -2)) * self.scheme.score_scale()
            compute = compute_dtype(scores)
            if placement is Placement.SCORE:
                scores = scores.to(compute) + self.scheme.bias(q, k, q_pos, k_pos).to(compute)
            if cfg.logit_softcap is not None:
                scores = soft_cap(scores.to(compute), cfg.logit_softcap)
            mask = attention_mask(q_pos, k_pos, cfg.causal, cfg.sliding_window, cfg.attention_chunk_size)
            if key_mask is not None:
                visible = key_mask[:, None, None, :]
                mask = visible if mask is None else mask & visible
            out = softmax_attention(scores, v, mask, self.sinks)
        out = out.transpose(1, 2).reshape(b, s, cfg.num_heads * cfg.value_dim)
        if self.gate_proj is not None:
            if gate is None:
                raise ConfigError(
                    f"this block gates its output ({cfg.output_gate}): pass gate=block.gate(hidden, position_ids)."
                )
            out = gated(out, gate, cfg.output_gate, cfg.num_heads)
        return self.o_proj(out)

    def forward_in_place(
        self,
        hidden: torch.Tensor,
        position_ids: torch.Tensor | None,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        past_length: torch.Tensor,
        ring: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step over preallocated caches: the new keys and values written at their slots, attention over the
        filled slots only.

        The same computation as :meth:`forward` with the cache rows ``0 .. past_length - 1`` as ``past_key`` /
        ``past_value``: cached keys sit at positions ``0 .. P - 1``, the new ones at ``position_ids``. Each row of
        the batch has its own ``past_length``; slots past ``past_length + S`` are never read (hidden by a key mask,
        and left out of the attention altogether beyond the longest row). Schemes that compute attention
        themselves (``attention`` placement) take no key mask: every row must then share its ``past_length``.

        Shapes: hidden ``[B, S, E]``; position_ids ``[B, S]`` or ``[1, S]`` int64 (``[A, B, S]`` for multi-axis
        schemes; default ``past_length + arange(S)``); key_cache / value_cache ``[B, Hkv, C, D]`` with finite
        values in every slot (zeros will do); past_length ``[B]`` int64 with ``past_length + S <= C``. Returns
        ``(out [B, S, E], key_cache, value_cache)`` with the caches ``[B, Hkv, C, D]`` (new tensors in eager mode;
        one ``TensorScatter`` each once exported, which runtimes run in place when the output is bound to the
        input's buffer). Exported graphs guard the positions as :meth:`forward` does.

        ``ring`` (a sliding-window block, :attr:`AttentionConfig.sliding_window` ``W``): the caches are a ring of
        ``C >= W`` slots. Token ``t`` (``past_length + i`` for the new ones) sits at slot ``t mod C``; the
        attention reads ``min(past_length + S, C)`` slots, each holding the last token written there, at its
        position (cached tokens at their token index, as above), and the window mask keeps the keys the block
        would keep. Exact where no key a new query sees was overwritten by the call's own writes:
        ``S <= C - min(past_length, W - 1)`` (any ``S`` up to ``C`` on a first prompt; ``C - W + 1`` new tokens per
        call once the window is full).

        Raises:
            ConfigError: (eager) a cache too short, a negative ``past_length``, rows of different
                ``past_length`` for a scheme that computes attention itself, or (``ring``) a call the ring does not
                serve.
        """
        s = hidden.shape[1]
        if ring:
            self._check_ring(s, key_cache.shape[2], past_length)
        past = past_length.to(torch.int64)[:, None]
        token_order = past + torch.arange(s, device=hidden.device)  # [B, S]
        position_ids = self.positions(hidden, token_order if position_ids is None else position_ids, 0)
        position_ids, poison = self.scheme.guard(position_ids)
        order = position_ids if position_ids.dim() == 2 else token_order  # multi-axis ids: masks use token order
        attention_placement = self.scheme.placement is Placement.ATTENTION
        if (
            attention_placement
            and not is_tracing()
            and past_length.numel()
            and bool((past_length != past_length[0]).any())
        ):
            raise ConfigError(
                f"{self.scheme.spec.name} computes attention itself and cannot hide unfilled cache slots, so every "
                f"row must share past_length (got {past_length.tolist()}); step the rows separately."
            )
        # keys of the longest row (an int tensor's item: an unbacked size under export); a ring's whole buffer
        capacity = key_cache.shape[2]
        longest = past_length.max() + s
        total = cast(int, (longest.clamp(max=capacity) if ring else longest).item())
        torch._check(total >= s)
        torch._check(total <= capacity)
        slots = torch.arange(total, device=hidden.device)[None, :]
        # the token each slot holds after the write (negative: never written); slot j itself without a ring
        token = slots + capacity * torch.div(past + s - 1 - slots, capacity, rounding_mode="floor") if ring else slots
        offset = (token - past).clamp(0, s - 1)
        key_positions = torch.where(token < past, token.clamp(min=0), order.gather(1, offset))  # [B, total]
        key_positions, key_poison = self.guard_keys(key_positions)
        poison = joint_poison(poison, key_poison)
        x = poisoned(hidden, poison, 1)  # the guard's poison, as in forward
        q, k, v = self.project(x, position_ids)
        key_cache = write_cache(key_cache, k, past_length, ring=ring)
        value_cache = write_cache(value_cache, v, past_length, ring=ring)
        key_mask = None if attention_placement else ((token >= 0) if ring else slots < past + s)
        keys, values = key_cache.narrow(2, 0, total), value_cache.narrow(2, 0, total)
        out = self.attend(q, keys, values, order, key_positions, key_mask, self.gate(x, position_ids))
        return out, key_cache, value_cache

    def _check_ring(self, s: int, capacity: int, past_length: torch.Tensor) -> None:
        """Refuse (eager) a ring cache on a block without a causal sliding window, or a call the ring does not
        serve (:meth:`forward_in_place`)."""
        window = self.config.sliding_window
        if not ring_serves(self):
            raise ConfigError(
                "a ring cache serves a causal sliding-window block whose attention posenc computes; export this "
                "block with a linear in-place cache (no ring)."
            )
        if capacity < window:  # type: ignore[operator]  # ring_serves: a window
            raise ConfigError(f"a ring cache of {capacity} slots is shorter than the window ({window}); give it >= W.")
        if is_tracing() or not past_length.numel():
            return
        served = capacity - min(int(past_length.max()), window - 1)  # type: ignore[operator]
        if s > served:
            raise ConfigError(
                f"{s} new tokens after {int(past_length.max())} cached ones overwrite keys the window still needs "
                f"in a ring of {capacity} slots (window {window}): feed at most {served} tokens per call "
                f"(S <= C - min(past_length, W - 1)), or export with a larger --cache-capacity."
            )


def ring_serves(block: AttentionBlock) -> bool:
    """Whether a ring cache of the window's size serves the block (:meth:`AttentionBlock.forward_in_place`): a
    causal sliding window, no attention chunks, attention that posenc computes (not the scheme)."""
    cfg = block.config
    return (
        cfg.sliding_window is not None
        and cfg.causal
        and cfg.attention_chunk_size is None
        and block.scheme.placement is not Placement.ATTENTION
    )
