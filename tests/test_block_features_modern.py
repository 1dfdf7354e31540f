"""Block options of today's models against transformers' modules: Llama 4's chunked attention, L2 q/k norm after
complex RoPE and attention-temperature tuning of NoPE layers (``Llama4TextAttention``), HunYuan's weighted q/k
norms after the rotation (``HunYuanDenseV1Attention``), and the options' checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from posenc import AttentionBlock, AttentionConfig, ConfigError
from posenc import functional as PF
from posenc.schemes.base import attention_mask
from tests.conftest import decode_in_steps

transformers = pytest.importorskip("transformers", reason="transformers is the upstream reference")

BASE = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=64)


def _llama4(layer: int, **settings):
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    hf = transformers.Llama4TextConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=4,
        intermediate_size=64, intermediate_size_mlp=64, vocab_size=96, attention_chunk_size=4, floor_scale=3,
        attn_scale=0.25, **settings,
    )  # fmt: skip
    hf._attn_implementation = "eager"
    attention = Llama4TextAttention(hf, layer_idx=layer).double().eval()
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_(0.0, 0.2)
    return hf, attention


def _mask(q_pos: torch.Tensor, k_pos: torch.Tensor, chunk: int | None) -> torch.Tensor:
    from transformers.masking_utils import and_masks, causal_mask_function, chunked_overlay

    function = causal_mask_function
    if chunk is not None:
        function = and_masks(chunked_overlay(chunk, torch.zeros(1, dtype=torch.int64)), causal_mask_function)
    allowed = function(0, 0, q_pos.view(-1, 1), k_pos.view(1, -1))
    return torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, float("-inf"))[None, None]


def test_chunked_mask_is_transformers_chunked_overlay() -> None:
    positions = torch.arange(11)
    for chunk in (1, 3, 4, 16):
        ours = attention_mask(positions[None], positions[None], True, None, chunk)[0, 0]
        theirs = _mask(positions, positions, chunk)[0, 0] == 0
        assert torch.equal(ours, theirs), chunk
    window_and_chunk = attention_mask(positions[None], positions[None], True, 2, 4)[0, 0]
    assert window_and_chunk.sum(-1).tolist() == [1, 2, 2, 2, 1, 2, 2, 2, 1, 2, 2]  # both limits hold


def test_llama4_rope_layer_equals_the_module() -> None:
    """Complex RoPE (interleaved pairs), L2 q/k norm after it, chunks of 4: the block equals Llama4TextAttention
    on a prefill past a chunk boundary and on decode steps; without the chunks or the norm it does not."""
    hf, attention = _llama4(0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    config = dataclasses.replace(BASE, qk_norm="l2", qk_norm_eps=hf.rms_norm_eps, qk_norm_after_rope=True,
                                 attention_chunk_size=4)  # fmt: skip
    block = AttentionBlock(config, "rope", {"layout": "interleaved"}, table_dtype=torch.float64).double()
    block.load_state_dict(attention.state_dict(), strict=False)
    x = torch.randn(2, 9, 64, dtype=torch.float64)
    positions = torch.arange(9)
    inv_freq, _ = PF.rope_inv_freq(16)
    cos, sin = PF.rope_cos_sin(positions.expand(2, 9), inv_freq, dtype=torch.float64)
    with torch.no_grad():
        want = attention(x, torch.complex(cos, sin), _mask(positions, positions, 4))[0]
    got, _, _ = block(x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)  # transformers: float32 complex rotation
    torch.testing.assert_close(decode_in_steps(block, x, 5), got, atol=1e-10, rtol=1e-10)
    for change in ({"attention_chunk_size": None}, {"qk_norm": "none"}):
        other = AttentionBlock(dataclasses.replace(config, **change), "rope", {"layout": "interleaved"}).double()
        other.load_state_dict(block.state_dict(), strict=False)
        assert (other(x)[0] - want).abs().max() > 1e-3, change


def test_llama4_nope_layer_temperature_equals_the_module() -> None:
    """q scaled by 1 + attn_scale · ln(1 + floor((p + 1) / floor_scale)) before the scores, by position (cache
    length + i in the module), for a prefill and a decode step after a cache."""
    _, attention = _llama4(3)
    assert not attention.use_rope
    config = dataclasses.replace(BASE, temperature_floor_scale=3, temperature_scale=0.25)
    block = AttentionBlock(config, "nope").double()
    block.load_state_dict(attention.state_dict(), strict=False)
    x = torch.randn(2, 10, 64, dtype=torch.float64)
    positions = torch.arange(10)
    with torch.no_grad():
        want = attention(x, None, _mask(positions, positions, None))[0]
        cache = transformers.DynamicCache()
        attention(x[:, :7], None, _mask(positions[:7], positions[:7], None), past_key_values=cache)
        step = attention(x[:, 7:], None, _mask(positions[7:], positions, None), past_key_values=cache)[0]
    got, key, value = block(x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    _, key, value = block(x[:, :7])
    torch.testing.assert_close(block(x[:, 7:], past_key=key, past_value=value)[0], step, atol=1e-6, rtol=1e-6)
    plain = AttentionBlock(BASE, "nope").double()
    plain.load_state_dict(block.state_dict())
    assert (plain(x)[0] - want).abs().max() > 1e-3  # the temperature matters from position 2 on


def test_hunyuan_norms_after_the_rotation_equal_the_module_and_the_order_matters() -> None:
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import HunYuanDenseV1Attention

    hf = transformers.HunYuanDenseV1Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=2,
        intermediate_size=64, vocab_size=96, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    hf._attn_implementation = "eager"
    attention = HunYuanDenseV1Attention(hf, layer_idx=0).double().eval()
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_(0.0, 0.2)
    state = dict(attention.state_dict())
    state["q_norm.weight"], state["k_norm.weight"] = state["query_layernorm.weight"], state["key_layernorm.weight"]
    config = dataclasses.replace(BASE, qk_norm="rms", qk_norm_eps=hf.rms_norm_eps, qk_norm_after_rope=True)
    block = AttentionBlock(config, "rope", table_dtype=torch.float64).double()
    block.load_state_dict(state, strict=False)
    x = torch.randn(2, 8, 64, dtype=torch.float64)
    positions = torch.arange(8)
    inv_freq, _ = PF.rope_inv_freq(16)
    cos, sin = PF.rope_cos_sin(positions.expand(2, 8), inv_freq, dtype=torch.float64)
    embeddings = (torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))
    with torch.no_grad():
        want = attention(x, embeddings, _mask(positions, positions, None))[0]
    torch.testing.assert_close(block(x)[0], want, atol=1e-6, rtol=1e-6)
    before = AttentionBlock(dataclasses.replace(config, qk_norm_after_rope=False), "rope").double()
    before.load_state_dict(block.state_dict(), strict=False)
    assert (before(x)[0] - want).abs().max() > 1e-4  # weighted norms do not commute with the rotation


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("attention_chunk_size", 0, r"attention_chunk_size must be an int >= 1"),
        ("temperature_floor_scale", 2.5, r"temperature_floor_scale must be an int >= 1"),
        ("temperature_scale", -0.1, r"temperature_scale must be a finite number > 0"),
        ("qk_norm_after_rope", 1, r"qk_norm_after_rope must be True or False"),
    ],
)
def test_bad_options_raise(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(BASE, **{field: value})
