"""AttentionBlock: q/k/v/o projections, grouped-query heads, a KV cache, and one positional scheme.

This is the unit users export and deploy. The scheme acts at exactly one place (see
:class:`posenc.schemes.base.Placement`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from posenc.config import AttentionConfig
from posenc.errors import ConfigError
from posenc.functional import is_tracing, write_cache
from posenc.schemes import build_scheme
from posenc.schemes.base import (
    Placement,
    PositionalScheme,
    TableMode,
    attention_mask,
    repeat_kv,
    soft_cap,
    softmax_attention,
)


class HeadRMSNorm(nn.Module):
    """RMSNorm over the last axis (``head_dim``) of q or k (Qwen3 / Gemma 3 ``q_norm`` / ``k_norm``).

    ``x · rsqrt(mean(x²) + eps) · weight`` computed in float32 (float64 for float64 input) and cast back to the
    input's dtype. ``weight [D]`` starts at ones. Gemma's ``(1 + w)`` form is stored as ``1 + w`` (the checkpoint
    loader adds the one). Shapes: ``[..., D] -> [..., D]``.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        normed = F.rms_norm(x.to(compute), self.weight.shape, self.weight.to(compute), self.eps)
        return normed.to(x.dtype)  # ONNX opset 23: one RMSNormalization in float32 between two casts

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


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
        past_key / past_value ``[B, Hkv, P, D]``; returns ``(out [B, S, E], present_key, present_value)``
        with presents ``[B, Hkv, P + S, D]``. Cached keys sit at positions ``0 .. P - 1``, new keys at
        ``position_ids`` (so the causal mask and relative distances follow the ids you pass).
        For ``qk`` schemes the cache holds rotated keys; for ``attention`` schemes, unrotated keys.

    Computation: ``q, k, v`` from ``q_proj``/``k_proj``/``v_proj`` (bias when ``config.qkv_bias``), then
    ``q_norm``/``k_norm`` (``config.qk_norm="rms"``), then the scheme; scores ``q·kᵀ · scale`` (+ bias of a
    ``score`` scheme), ``cap · tanh(scores / cap)`` when ``config.logit_softcap``, masked by causality and
    ``config.sliding_window``, softmax in float32, ``@ v``, heads merged, ``o_proj`` (bias when ``config.out_bias``).

    State dict keys: ``q_proj.*``, ``k_proj.*``, ``v_proj.*``, ``o_proj.*`` (``.bias`` as configured),
    ``q_norm.weight`` / ``k_norm.weight`` ``[D]`` with ``qk_norm="rms"``, and ``scheme.*``. A DeBERTa scheme with
    ``share_att_key`` uses ``q_proj`` / ``k_proj`` for its position terms (no ``scheme.pos_*_proj`` keys).
    """

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
        if isinstance(scheme, PositionalScheme):
            given = {
                "params": params,
                "table_mode": table_mode,
                "max_positions": max_positions,
                "table_dtype": table_dtype,
            }
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
            self.scheme = scheme
        else:
            dtype = torch.float32 if table_dtype is None else table_dtype
            self.scheme = build_scheme(scheme, config, params, table_mode, max_positions, dtype)
        h, hkv, d, e = config.num_heads, config.num_kv_heads, config.head_dim, config.hidden_size
        self.q_proj = nn.Linear(e, h * d, bias=config.qkv_bias)
        self.k_proj = nn.Linear(e, hkv * d, bias=config.qkv_bias)
        self.v_proj = nn.Linear(e, hkv * d, bias=config.qkv_bias)
        self.o_proj = nn.Linear(h * d, e, bias=config.out_bias)
        self.q_norm = HeadRMSNorm(d, config.qk_norm_eps) if config.qk_norm == "rms" else None
        self.k_norm = HeadRMSNorm(d, config.qk_norm_eps) if config.qk_norm == "rms" else None
        self.scheme.share_projections(self.q_proj, self.k_proj)

    def forward(
        self,
        hidden: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        past_key: torch.Tensor | None = None,
        past_value: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b = hidden.shape[0]
        past = 0 if past_key is None else past_key.shape[2]
        position_ids = self.positions(hidden, position_ids, past)
        if past_key is not None and past_value is None:
            raise ConfigError("past_key was given without past_value; pass both or neither.")
        if past_value is not None and past_key is None:
            raise ConfigError("past_value was given without past_key; pass both or neither.")
        q, k, v = self.project(hidden, position_ids)
        if past_key is not None and past_value is not None:
            k = torch.cat((past_key.to(k.dtype), k), dim=2)
            v = torch.cat((past_value.to(v.dtype), v), dim=2)
        # Cached keys sit at 0..P-1, the new keys at the queries' own positions.
        past_positions = torch.arange(past, device=hidden.device, dtype=position_ids.dtype)
        key_positions = torch.cat((past_positions.unsqueeze(0).expand(b, past), position_ids), dim=1)
        return self.attend(q, k, v, position_ids, key_positions), k, v

    def positions(self, hidden: torch.Tensor, position_ids: torch.Tensor | None, past: int) -> torch.Tensor:
        """``position_ids [B, S]`` of the new tokens: given (``[1, S]`` broadcast), or ``past + arange(S)``."""
        b, s = hidden.shape[0], hidden.shape[1]
        if position_ids is None:
            return (torch.arange(s, device=hidden.device) + past).unsqueeze(0).expand(b, s)
        if not is_tracing() and tuple(position_ids.shape) != (b, s):  # eager only: export keeps [B, S]
            if tuple(position_ids.shape) != (1, s):
                raise ConfigError(
                    f"position_ids have shape {tuple(position_ids.shape)}; hidden [B={b}, S={s}, E] needs "
                    f"[{b}, {s}] (or [1, {s}], shared by the batch)."
                )
            return position_ids.expand(b, s)
        return position_ids

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
        q = self.q_proj(x).view(b, s, cfg.num_heads, cfg.head_dim)
        k = self.k_proj(x).view(b, s, cfg.num_kv_heads, cfg.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(b, s, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        if placement is Placement.QK:
            q, k = self.scheme.rotate(q, k, position_ids)
        return q, k, v

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of ``q [B, H, Sq, D]`` over all keys ``k``, ``v [B, Hkv, Sk, D]`` at positions ``q_pos [B, Sq]``
        and ``k_pos [B, Sk]`` (grouped heads, scheme bias or attention, soft-cap, causal and window masks), heads
        merged and ``o_proj``: ``[B, Sq, E]``. ``key_mask [B, Sk]`` (bool, True = a real key) hides cache slots that
        hold no key yet (a preallocated cache)."""
        cfg = self.config
        b, s = q.shape[0], q.shape[2]
        placement = self.scheme.placement
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
            compute = torch.float64 if scores.dtype == torch.float64 else torch.float32
            if placement is Placement.SCORE:
                scores = scores.to(compute) + self.scheme.bias(q, k, q_pos, k_pos).to(compute)
            if cfg.logit_softcap is not None:
                scores = soft_cap(scores.to(compute), cfg.logit_softcap)
            mask = attention_mask(q_pos, k_pos, cfg.causal, cfg.sliding_window)
            if key_mask is not None:
                visible = key_mask[:, None, None, :]
                mask = visible if mask is None else mask & visible
            out = softmax_attention(scores, v, mask)
        out = out.transpose(1, 2).reshape(b, s, cfg.num_heads * cfg.head_dim)
        return self.o_proj(out)

    def forward_in_place(
        self,
        hidden: torch.Tensor,
        position_ids: torch.Tensor | None,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        past_length: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step over preallocated caches: the new keys and values written at their slots, attention over the
        filled slots only.

        The same computation as :meth:`forward` with the cache rows ``0 .. past_length - 1`` as ``past_key`` /
        ``past_value``: cached keys sit at positions ``0 .. P - 1``, the new ones at ``position_ids``. Each row of
        the batch has its own ``past_length``; slots past ``past_length + S`` are never read (hidden by a key mask,
        and left out of the attention altogether beyond the longest row). Schemes that compute attention
        themselves (``attention`` placement) take no key mask: every row must then share its ``past_length``.

        Shapes: hidden ``[B, S, E]``; position_ids ``[B, S]`` or ``[1, S]`` int64 (default ``past_length +
        arange(S)``); key_cache / value_cache ``[B, Hkv, C, D]`` with finite values in every slot (zeros will do);
        past_length ``[B]`` int64 with ``past_length + S <= C``. Returns ``(out [B, S, E], key_cache, value_cache)``
        with the caches ``[B, Hkv, C, D]`` (new tensors in eager mode; one ``TensorScatter`` each once exported,
        which runtimes run in place when the output is bound to the input's buffer).

        Raises:
            ConfigError: (eager) a cache too short, a negative ``past_length``, or rows of different
                ``past_length`` for a scheme that computes attention itself.
        """
        s = hidden.shape[1]
        if position_ids is None:
            position_ids = past_length.to(torch.int64)[:, None] + torch.arange(s, device=hidden.device)
        position_ids = self.positions(hidden, position_ids, 0)
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
        q, k, v = self.project(hidden, position_ids)
        key_cache = write_cache(key_cache, k, past_length)
        value_cache = write_cache(value_cache, v, past_length)
        total = (past_length.max() + s).item()  # keys of the longest row: an unbacked size under export
        torch._check(total >= s)
        torch._check(total <= key_cache.shape[2])
        slots = torch.arange(total, device=hidden.device)[None, :]
        past = past_length.to(torch.int64)[:, None]
        offset = (slots - past).clamp(0, s - 1)
        key_positions = torch.where(slots < past, slots, position_ids.gather(1, offset))  # [B, total]
        key_mask = None if attention_placement else slots < past + s
        keys, values = key_cache.narrow(2, 0, total), value_cache.narrow(2, 0, total)
        out = self.attend(q, keys, values, position_ids, key_positions, key_mask)
        return out, key_cache, value_cache
