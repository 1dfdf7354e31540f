"""Multi-head latent attention (MLA, DeepSeek-V2/V3): a low-rank latent KV cache and a decoupled RoPE slice.

MLA is its own attention block (:class:`MLABlock`), exported with the unit conventions of
:class:`~posenc.blocks.AttentionBlock` (``hidden``, ``position_ids``, past keys/values in, ``out`` and presents out)
but with the cache MLA keeps: ``past_key`` is the normalised KV latent ``[B, 1, P, kv_lora_rank]`` and
``past_value`` the rotated shared key slice ``[B, 1, P, qk_rope_head_dim]`` (what transformers' DeepSeek modules
hand to their ``Cache``). :mod:`posenc.blocks.build` picks the block class of a geometry
(:class:`~posenc.config.AttentionConfig` or :class:`MLAConfig`), so checkpoints, manifests and eager rebuilds carry
either.

Reference: DeepSeek-AI, "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language Model" (2024),
arXiv:2405.04434, section 2.1; transformers 5.23's ``DeepseekV2Attention`` / ``DeepseekV3Attention``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from posenc import rope_types
from posenc.blocks.attention import AttentionBlock, block_scheme, temperature_tuned
from posenc.blocks.norms import HeadRMSNorm
from posenc.config import AttentionConfig
from posenc.errors import ConfigError
from posenc.schemes.base import (
    Placement,
    PositionalScheme,
    TableMode,
    attention_mask,
    poisoned,
    softmax_attention,
)

MLA_KIND = "mla"
"""The ``block`` entry of an :class:`MLAConfig`'s dict (manifests tell the two geometries apart by it)."""


@dataclasses.dataclass(frozen=True)
class MLAConfig:
    """Geometry of one MLA block (the names of transformers' ``DeepseekV2Config``).

    Attributes:
        hidden_size: model width E.
        num_heads: query heads H (every head gets its own keys and values from the shared latent).
        kv_lora_rank: C, width of the KV latent ``c = RMSNorm(W_a x)`` the cache holds.
        qk_nope_head_dim: per-head width of the position-free part of q and k.
        qk_rope_head_dim: R, per-head width of the rotated part; k's rotated part is one head shared by all heads.
        v_head_dim: per-head width of v.
        q_lora_rank: rank of the low-rank query (``q_a_proj`` -> ``q_a_layernorm`` -> ``q_b_proj``); ``None``: one
            ``q_proj`` (DeepSeek-V2-Lite).
        max_position_embeddings: the model's context length (rows of precomputed tables by default).
        attention_bias: biases on ``q_a_proj``, ``kv_a_proj_with_mqa`` and ``o_proj`` (transformers'
            ``attention_bias``; ``q_proj``, ``q_b_proj`` and ``kv_b_proj`` never have one).
        norm_eps: epsilon of the latent RMSNorms (transformers builds them with its default 1e-6).
        rope_interleave: DeepSeek-V3's ``rope_interleave``: the rope slice holds interleaved pairs (2i, 2i+1) that
            come out in rotate_half order (the rotation of ``x[0::2] ++ x[1::2]`` in the half layout). DeepSeek-V2
            rotates in place (complex form: the scheme's ``interleaved`` layout).
        attn_scale: the multiplier of ``q·kᵀ``; ``None``: ``(nope + R) ** -0.5``, times YaRN's
            ``mscale(factor, mscale_all_dim)²`` when the scheme is scaled and gives ``mscale_all_dim``.
        causal: decoder attention.
        temperature_floor_scale, temperature_scale, temperature_offset: q (both parts) at position p times
            ``1 + temperature_scale · ln(1 + floor((p + temperature_offset) / temperature_floor_scale))`` before the
            scores (Mistral 4's ``llama_4_scaling``: offset 0); ``None``: off. As in
            :class:`~posenc.config.AttentionConfig`.
    """

    hidden_size: int
    num_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    max_position_embeddings: int = 2048
    attention_bias: bool = False
    norm_eps: float = 1e-6
    rope_interleave: bool = False
    attn_scale: float | None = None
    causal: bool = True
    temperature_floor_scale: int | None = None
    temperature_scale: float = 0.1
    temperature_offset: int = 1

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_heads", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim",
                     "max_position_embeddings"):  # fmt: skip
            _positive_int(self, name)
        if (
            isinstance(self.qk_nope_head_dim, bool)
            or not isinstance(self.qk_nope_head_dim, int)
            or (self.qk_nope_head_dim < 0)
        ):
            raise ConfigError(f"MLAConfig.qk_nope_head_dim must be an int >= 0, got {self.qk_nope_head_dim!r}.")
        if self.q_lora_rank is not None:
            _positive_int(self, "q_lora_rank")
        if self.qk_rope_head_dim % 2:
            raise ConfigError(
                f"MLAConfig.qk_rope_head_dim must be even (RoPE rotates pairs), got {self.qk_rope_head_dim}."
            )
        for name in ("attention_bias", "rope_interleave", "causal"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"MLAConfig.{name} must be True or False, got {getattr(self, name)!r}.")
        temperature = self.temperature_floor_scale
        if temperature is not None:
            _positive_int(self, "temperature_floor_scale")
        offset = self.temperature_offset
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ConfigError(f"MLAConfig.temperature_offset must be an int >= 0, got {offset!r}.")
        for name in ("norm_eps", "attn_scale", "temperature_scale"):
            value = getattr(self, name)
            if value is None and name == "attn_scale":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"MLAConfig.{name} must be a finite number > 0, got {value!r}.")
            object.__setattr__(self, name, float(value))

    # What generic code reads of a geometry (masks, references): MLA has no window, chunks or soft-cap.
    sliding_window = None
    attention_chunk_size = None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def rope_config(self) -> AttentionConfig:
        """The geometry the positional scheme rotates: H query heads and one shared key head of width R."""
        return AttentionConfig(
            hidden_size=self.hidden_size,
            num_heads=self.num_heads,
            num_kv_heads=1,
            head_dim=self.qk_rope_head_dim,
            causal=self.causal,
            max_position_embeddings=self.max_position_embeddings,
        )

    def to_dict(self) -> dict[str, Any]:
        return {"block": MLA_KIND, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MLAConfig:
        fields = dict(data)
        if fields.pop("block", MLA_KIND) != MLA_KIND:
            raise ConfigError(f"not an MLA geometry: block is {data.get('block')!r}.")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ConfigError(f"unknown MLAConfig field(s) {unknown}; valid fields are {sorted(known)}.")
        return cls(**fields)


def _positive_int(config: MLAConfig, name: str) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"MLAConfig.{name} must be a positive int, got {value!r}.")


def mla_score_scale(config: MLAConfig, scheme: PositionalScheme) -> float:
    """``attn_scale``, else ``qk_head_dim ** -0.5`` times ``mscale(factor, mscale_all_dim)²`` for a scaled rope type
    with ``mscale_all_dim`` (transformers' ``yarn_apply_mscale``: YaRN's magnitude correction applies to the whole
    q·k product, not only to the rotated slice whose cos/sin carry ``mscale / mscale_all_dim``)."""
    if config.attn_scale is not None:
        return config.attn_scale
    scale = config.qk_head_dim**-0.5
    rope_type = getattr(scheme, "rope_type", "default")
    mscale_all_dim = scheme.params.get("mscale_all_dim")
    if rope_type != "default" and mscale_all_dim:
        mscale = rope_types.yarn_get_mscale(float(scheme.params["factor"]), float(mscale_all_dim))
        scale *= mscale * mscale
    return scale


class MLABlock(nn.Module):
    """Multi-head latent attention with a RoPE scheme on the decoupled rope slice.

    Args:
        config: the MLA geometry.
        scheme: a registered one-axis RoPE scheme (``rope``, ``rope_yarn``, ...) or a built one for
            ``config.rope_config()``; it rotates q's last ``qk_rope_head_dim`` features of every head and the one
            shared key slice.
        params, table_mode, max_positions, table_dtype: as for :class:`~posenc.blocks.AttentionBlock`.

    Shapes:
        hidden ``[B, S, E]``; position_ids ``[B, S]`` (default ``P + arange(S)``); past_key ``[B, 1, P, C]`` (the
        normalised latent), past_value ``[B, 1, P, R]`` (the rotated shared key slice); returns ``(out [B, S, E],
        present_key [B, 1, P + S, C], present_value [B, 1, P + S, R])``. Cached tokens sit at positions
        ``0 .. P - 1``, new ones at ``position_ids``.

    Computation (DeepSeek-V2 section 2.1): ``q = q_proj(x)`` (or ``q_b_proj(RMSNorm(q_a_proj(x)))``), split per head
    into ``[q_nope, q_rope]``; ``[c, k_rope] = kv_a_proj_with_mqa(x)``, ``c = kv_a_layernorm(c)``; q_rope and k_rope
    rotated by the scheme; the cache appends ``c`` and ``k_rope``; ``[k_nope, v] = kv_b_proj(c)`` per head;
    ``k = [k_nope, k_rope]`` (k_rope shared by every head); softmax in float32 of ``q·kᵀ · scale`` (see
    :func:`mla_score_scale`) under the causal mask; ``o_proj``.
    """

    scheme: PositionalScheme  # the positional scheme module, a submodule

    def __init__(
        self,
        config: MLAConfig,
        scheme: str | PositionalScheme = "rope",
        params: Mapping[str, Any] | None = None,
        table_mode: TableMode | str | None = None,
        max_positions: int | None = None,
        table_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.scheme = block_scheme(config.rope_config(), scheme, params, table_mode, max_positions, table_dtype)
        spec = self.scheme.spec
        if spec.placement is not Placement.QK or spec.position_axes != 1:
            raise ConfigError(
                f"MLA rotates its rope slice with a one-axis RoPE scheme (rope, rope_yarn, ...); {spec.name!r} "
                f"acts at {spec.placement.value!r} with {spec.position_axes} position axes."
            )
        h, e, bias = config.num_heads, config.hidden_size, config.attention_bias
        if config.q_lora_rank is None:
            self.q_proj = nn.Linear(e, h * config.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(e, config.q_lora_rank, bias=bias)
            self.q_a_layernorm = HeadRMSNorm(config.q_lora_rank, config.norm_eps)
            self.q_b_proj = nn.Linear(config.q_lora_rank, h * config.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(e, config.kv_lora_rank + config.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = HeadRMSNorm(config.kv_lora_rank, config.norm_eps)
        self.kv_b_proj = nn.Linear(config.kv_lora_rank, h * (config.qk_nope_head_dim + config.v_head_dim), bias=False)
        self.o_proj = nn.Linear(h * config.v_head_dim, e, bias=bias)

    def score_scale(self) -> float:
        return mla_score_scale(self.config, self.scheme)

    def forward(
        self,
        hidden: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        past_key: torch.Tensor | None = None,
        past_value: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b = hidden.shape[0]
        if (past_key is None) != (past_value is None):
            raise ConfigError("pass past_key (latent) and past_value (rotated key slice) together, or neither.")
        past = 0 if past_key is None else past_key.shape[2]
        position_ids = self.positions(hidden, position_ids, past)
        # An exported graph guards positions (posenc.functional.position_guard); the poison enters the new tokens'
        # hidden states, so out and the cache carry it (cached keys need none: AttentionBlock.guard_keys).
        position_ids, poison = self.scheme.guard(position_ids)
        q_nope, q_rope, latent, k_rope = self.project(poisoned(hidden, poison, 1), position_ids)
        if past_key is not None and past_value is not None:
            latent = torch.cat((past_key.to(latent.dtype), latent), dim=2)
            k_rope = torch.cat((past_value.to(k_rope.dtype), k_rope), dim=2)
        cached = torch.arange(past, device=hidden.device, dtype=position_ids.dtype).unsqueeze(0).expand(b, past)
        key_positions = torch.cat((cached, position_ids), dim=1)
        out = self.attend(q_nope, q_rope, latent, k_rope, position_ids, key_positions)
        return out, latent, k_rope

    def positions(self, hidden: torch.Tensor, position_ids: torch.Tensor | None, past: int) -> torch.Tensor:
        """``position_ids [B, S]``: the block's one rule for default, broadcast and checked ids
        (:meth:`posenc.blocks.AttentionBlock.positions`, which reads only ``self.scheme``)."""
        return AttentionBlock.positions(self, hidden, position_ids, past)  # type: ignore[arg-type]  # duck-typed self

    def project(
        self, hidden: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The new tokens' ``q_nope [B, H, S, nope]``, rotated ``q_rope [B, H, S, R]``, normalised latent
        ``[B, 1, S, C]`` and rotated shared key slice ``[B, 1, S, R]`` (the last two are what the cache holds)."""
        cfg = self.config
        b, s = hidden.shape[0], hidden.shape[1]
        if cfg.q_lora_rank is None:
            q = self.q_proj(hidden)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        q = q.view(b, s, cfg.num_heads, cfg.qk_head_dim).transpose(1, 2)
        q_nope, q_rope = q[..., : cfg.qk_nope_head_dim], q[..., cfg.qk_nope_head_dim :]
        compressed = self.kv_a_proj_with_mqa(hidden)
        latent = self.kv_a_layernorm(compressed[..., : cfg.kv_lora_rank]).unsqueeze(1)
        k_rope = compressed[..., cfg.kv_lora_rank :].unsqueeze(1)
        if cfg.rope_interleave:  # DeepSeek-V3: interleaved pairs, rotated in rotate_half order
            q_rope, k_rope = (torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1) for x in (q_rope, k_rope))
        q_rope, k_rope = self.scheme.rotate(q_rope, k_rope, position_ids)
        return q_nope, q_rope, latent, k_rope

    def attend(
        self,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        latent: torch.Tensor,
        k_rope: torch.Tensor,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
    ) -> torch.Tensor:
        """Attention of the new queries over every cached and new key, heads merged and ``o_proj``: ``[B, S, E]``."""
        cfg = self.config
        b, h, s = q_nope.shape[0], cfg.num_heads, q_nope.shape[2]
        keys = latent.shape[2]
        kv = self.kv_b_proj(latent).view(b, keys, h, cfg.qk_nope_head_dim + cfg.v_head_dim).transpose(1, 2)
        k_nope, v = kv[..., : cfg.qk_nope_head_dim], kv[..., cfg.qk_nope_head_dim :]
        k = torch.cat((k_nope, k_rope.expand(b, h, keys, cfg.qk_rope_head_dim)), dim=-1)
        q = torch.cat((q_nope, q_rope), dim=-1)
        if cfg.temperature_floor_scale is not None:
            q = temperature_tuned(q, q_pos, cfg.temperature_floor_scale, cfg.temperature_scale, cfg.temperature_offset)
        scores = (q @ k.transpose(-1, -2)) * self.score_scale()
        out = softmax_attention(scores, v, attention_mask(q_pos, k_pos, cfg.causal))
        return self.o_proj(out.transpose(1, 2).reshape(b, s, h * cfg.v_head_dim))


__all__ = [
    "MLA_KIND",
    "MLABlock",
    "MLAConfig",
    "mla_score_scale",
]
