"""Per-head norms of queries, keys or values: RMSNorm and LayerNorm over the last axis, and the q/k pair a config
asks for (:func:`qk_norms`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from posenc.config import AttentionConfig
from posenc.dtypes import compute_dtype


class HeadRMSNorm(nn.Module):
    """RMSNorm over the last axis (``head_dim``) of q or k (Qwen3 / Gemma 3 ``q_norm`` / ``k_norm``), or v.

    ``x · rsqrt(mean(x²) + eps) · weight`` computed in float32 (float64 for float64 input) and cast back to the
    input's dtype. ``weight [D]`` starts at ones. Gemma's ``(1 + w)`` form is stored as ``1 + w`` (the checkpoint
    loader adds the one). ``learned=False``: no weight (Llama 4's L2 norm, Gemma 4's ``v_norm``). Shapes:
    ``[..., D] -> [..., D]``; the same module normalises a whole projection ``[..., H·D]`` when built with
    ``dim = H·D`` (OLMo 2).
    """

    def __init__(self, dim: int, eps: float, learned: bool = True) -> None:
        super().__init__()
        self.dim = dim
        self.weight = nn.Parameter(torch.ones(dim)) if learned else None
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compute = compute_dtype(x)
        weight = None if self.weight is None else self.weight.to(compute)
        normed = F.rms_norm(x.to(compute), (self.dim,), weight, self.eps)
        return normed.to(x.dtype)  # ONNX opset 23: one RMSNormalization in float32 between two casts

    def extra_repr(self) -> str:
        return f"({self.dim},), eps={self.eps}" + ("" if self.weight is not None else ", no weight")


class HeadLayerNorm(nn.Module):
    """LayerNorm over the last axis (``head_dim``) of q or k (Phi, Persimmon ``q_layernorm`` / ``k_layernorm``).

    ``(x - mean(x)) · rsqrt(var(x) + eps) · weight + bias`` computed in float32 (float64 for float64 input), cast
    back to the input's dtype (one LayerNormalization between two casts once exported). ``weight``, ``bias [D]``
    (ones, zeros at first). Shapes: ``[..., D] -> [..., D]``.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.dim = dim
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compute = compute_dtype(x)
        weight, bias = self.weight.to(compute), self.bias.to(compute)
        return F.layer_norm(x.to(compute), (self.dim,), weight, bias, self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"({self.dim},), eps={self.eps}"


def qk_norms(config: AttentionConfig) -> tuple[nn.Module | None, nn.Module | None]:
    """The q and k norm modules of ``config.qk_norm`` (``None, None`` for none): per head over ``D``, or over the
    whole projection (``qk_norm_full_width``: ``H·D`` and ``Hkv·D``)."""
    if config.qk_norm == "none":
        return None, None
    h, hkv, d, eps = config.num_heads, config.num_kv_heads, config.head_dim, config.qk_norm_eps
    if config.qk_norm_full_width:
        return HeadRMSNorm(h * d, eps), HeadRMSNorm(hkv * d, eps)
    if config.qk_norm == "layer":
        return HeadLayerNorm(d, eps), HeadLayerNorm(d, eps)
    learned = config.qk_norm == "rms"
    return HeadRMSNorm(d, eps, learned), HeadRMSNorm(d, eps, learned)


__all__ = ["HeadLayerNorm", "HeadRMSNorm", "qk_norms"]
