"""NoPE: the block is plain scaled dot-product attention (torch's SDPA is the reference)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from posenc import AttentionBlock, AttentionConfig
from tests.conftest import covers


def _qkv(block: AttentionBlock, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    cfg = block.config
    b, s, _ = x.shape
    q = block.q_proj(x).view(b, s, cfg.num_heads, cfg.head_dim).transpose(1, 2)
    k = block.k_proj(x).view(b, s, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
    v = block.v_proj(x).view(b, s, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
    return q, k, v


@covers("nope")
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_nope_block_equals_scaled_dot_product_attention(causal: bool, kv_heads: int) -> None:
    config = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=kv_heads, causal=causal, qkv_bias=True)
    block = AttentionBlock(config, "nope").double()
    assert set(block.state_dict()) == {f"{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")} | {"o_proj.weight"}
    x = torch.randn(2, 9, 64, dtype=torch.float64)
    out, present_k, present_v = block(x)
    q, k, v = _qkv(block, x)
    attended = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    torch.testing.assert_close(out, block.o_proj(attended.transpose(1, 2).reshape(2, 9, 64)))
    torch.testing.assert_close(present_k, k)
    torch.testing.assert_close(present_v, v)


@covers("nope")
def test_nope_decode_step_equals_sdpa_over_the_whole_sequence() -> None:
    config = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, causal=True)
    block = AttentionBlock(config, "nope").double()
    x = torch.randn(1, 8, 64, dtype=torch.float64)
    _, past_k, past_v = block(x[:, :7])
    step, _, _ = block(x[:, 7:], past_key=past_k, past_value=past_v)
    q, k, v = _qkv(block, x)
    attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)[:, :, 7:]
    torch.testing.assert_close(step, block.o_proj(attended.transpose(1, 2).reshape(1, 1, 64)))
