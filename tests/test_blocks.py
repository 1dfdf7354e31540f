"""AttentionBlock: grouped-query heads, the decode cache, Hugging Face Llama attention, bad input."""

from __future__ import annotations

import pytest
import torch

from posenc import AttentionBlock, AttentionConfig, ConfigError, PositionError, build_scheme, get_spec, scheme_names
from posenc.schemes import TableMode

GQA = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=64)
MHA = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=4, max_position_embeddings=64)


def _mode(name: str) -> TableMode:
    return sorted(get_spec(name).table_modes, key=lambda m: m.value)[0]


@pytest.mark.parametrize("name", scheme_names())
def test_grouped_query_attention_equals_mha_with_repeated_kv_heads(name: str) -> None:
    params = get_spec(name).cases["default"]
    gqa = AttentionBlock(GQA, name, params, _mode(name)).double()
    mha = AttentionBlock(MHA, name, params, _mode(name)).double()
    state = gqa.state_dict()
    for proj in ("k_proj", "v_proj"):  # kv head g serves query heads 2g and 2g + 1
        weight = state[f"{proj}.weight"].view(2, 16, 64)
        state[f"{proj}.weight"] = weight.repeat_interleave(2, dim=0).reshape(64, 64)
    mha.load_state_dict(state)
    x = torch.randn(2, 9, 64, dtype=torch.float64)
    got, present_k, _ = gqa(x)
    expected, _, _ = mha(x)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12)
    assert present_k.shape == (2, 2, 9, 16)  # the cache keeps the kv heads only


def test_block_equals_hugging_face_llama_attention() -> None:
    """Llama-3.1-style block (llama3 scaling, GQA, causal) against transformers' LlamaAttention, same weights."""
    pytest.importorskip("transformers", reason="transformers is the upstream reference (pip install transformers)")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    rope = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32}  # fmt: skip
    hf_config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            max_position_embeddings=128, rope_parameters=dict(rope), attention_bias=False)  # fmt: skip
    hf_config._attn_implementation = "eager"
    hf = LlamaAttention(hf_config, layer_idx=0)
    config = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=128)
    params = {k: v for k, v in rope.items() if k != "rope_type"}
    block = AttentionBlock(config, "rope_llama3", params)
    missing, unexpected = block.load_state_dict(hf.state_dict(), strict=False)
    assert not unexpected
    assert all(key.startswith("scheme.") for key in missing)

    x = torch.randn(2, 40, 64)
    positions = torch.arange(40).unsqueeze(0).expand(2, 40)
    cos, sin = LlamaRotaryEmbedding(hf_config)(x, positions)
    mask = torch.full((40, 40), float("-inf")).triu(1).view(1, 1, 40, 40)
    with torch.no_grad():
        expected, _ = hf(x, position_embeddings=(cos, sin), attention_mask=mask)
        got, _, _ = block(x)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_decode_positions_start_at_the_past_length() -> None:
    block = AttentionBlock(GQA, "rope").double()
    x = torch.randn(1, 6, 64, dtype=torch.float64)
    full, _, _ = block(x)
    _, k, v = block(x[:, :4])
    step, k, v = block(x[:, 4:], past_key=k, past_value=v)
    torch.testing.assert_close(step, full[:, 4:])
    assert k.shape == (1, 2, 6, 16)
    explicit, _, _ = block(x[:, 4:], torch.tensor([[4, 5]]), *block(x[:, :4])[1:])
    torch.testing.assert_close(explicit, step)


def test_past_key_without_past_value_raises() -> None:
    block = AttentionBlock(GQA, "rope")
    x = torch.randn(1, 3, 64)
    _, k, _ = block(x)
    with pytest.raises(ConfigError, match="past_key was given without past_value; pass both"):
        block(x[:, :1], past_key=k)


def test_bad_positions_reach_the_user_as_posenc_errors() -> None:
    block = AttentionBlock(GQA, "rope", max_positions=8)
    with pytest.raises(PositionError, match=r"max_positions > 9.*'dynamic'"):
        block(torch.randn(1, 10, 64))
    with pytest.raises(ConfigError, match="integer tensor"):
        block(torch.randn(1, 3, 64), torch.tensor([[0.0, 1.0, 2.0]]))


def test_block_construction_errors() -> None:
    with pytest.raises(ConfigError, match="valid schemes are"):
        AttentionBlock(GQA, "rotary")
    with pytest.raises(ConfigError, match="pass params only with a scheme name"):
        AttentionBlock(GQA, AttentionBlock(GQA, "rope").scheme, {"layout": "half"})


@pytest.mark.parametrize("name", ["rope", "alibi", "t5", "shaw", "rerope"])
def test_custom_position_ids_shift_keys_with_the_queries(name: str) -> None:
    """Prefill at positions 10..16 equals prefill at 0..6 for relative schemes, with a causal mask intact."""
    from posenc import get_spec

    config = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=64)
    block = AttentionBlock(config, name, get_spec(name).cases["default"], "dynamic").double()
    x = torch.randn(2, 7, 64, dtype=torch.float64)
    base, _, _ = block(x)
    shifted, _, _ = block(x, position_ids=torch.arange(10, 17).expand(2, 7))
    torch.testing.assert_close(shifted, base)
    # causality: changing the last token must not change earlier outputs
    y = x.clone()
    y[:, -1] += 1.0
    later, _, _ = block(y, position_ids=torch.arange(10, 17).expand(2, 7))
    torch.testing.assert_close(later[:, :-1], base[:, :-1])


def test_past_value_without_past_key_raises() -> None:
    block = AttentionBlock(GQA, "rope")
    x = torch.randn(1, 3, 64)
    _, _, v = block(x)
    with pytest.raises(ConfigError, match="past_value was given without past_key; pass both"):
        block(x[:, :1], past_value=v)


def test_position_ids_shared_by_the_batch() -> None:
    block = AttentionBlock(GQA, "rope").double()
    x = torch.randn(3, 5, 64, dtype=torch.float64)
    shared, _, _ = block(x, torch.arange(2, 7).unsqueeze(0))
    full, _, _ = block(x, torch.arange(2, 7).expand(3, 5))
    torch.testing.assert_close(shared, full)
    with pytest.raises(ConfigError, match=r"position_ids have shape \(2, 5\); .* needs \[3, 5\]"):
        block(x, torch.arange(5).expand(2, 5))


def test_a_built_scheme_must_match_the_block() -> None:
    other = AttentionConfig(hidden_size=64, num_heads=8, num_kv_heads=2)  # head_dim 8, not GQA's 16
    scheme = build_scheme("rope", other)
    with pytest.raises(ConfigError, match=r"was built for .* build the scheme with the block's config"):
        AttentionBlock(GQA, scheme)
    own = build_scheme("rope", GQA)
    with pytest.raises(ConfigError, match="pass table_mode, max_positions only with a scheme name"):
        AttentionBlock(GQA, own, table_mode="dynamic", max_positions=10)
    assert AttentionBlock(GQA, own).scheme is own


def test_table_mode_defaults_to_what_the_scheme_has() -> None:
    assert AttentionBlock(GQA, "rope").scheme.table_mode.value == "precomputed"
    assert AttentionBlock(GQA, "rope_dynamic").scheme.table_mode.value == "dynamic"  # dynamic only


def test_blocks_pickle_for_torch_save(tmp_path) -> None:
    for name in ("rope", "rope_yarn", "alibi"):
        block = AttentionBlock(GQA, name, {"factor": 4.0} if name == "rope_yarn" else None)
        torch.save(block, tmp_path / f"{name}.pt")
        loaded = torch.load(tmp_path / f"{name}.pt", weights_only=False)
        x = torch.randn(1, 4, 64)
        torch.testing.assert_close(loaded(x)[0], block(x)[0])


@pytest.mark.parametrize("causal", [True, False])
def test_project_and_attend_over_a_preallocated_cache_equal_the_concatenated_cache(causal: bool) -> None:
    """The block's two steps with a cache of 12 slots, 7 of them filled (the rest garbage, masked): same output.

    Causal blocks would hide the empty slots anyway (they sit at future positions); bidirectional ones need the mask.
    """
    torch.manual_seed(3)
    config = AttentionConfig(hidden_size=32, num_heads=4, num_kv_heads=2, max_position_embeddings=64, causal=causal)
    block = AttentionBlock(config, "rope").double().eval()
    hidden = torch.randn(2, 3, 32, dtype=torch.float64)
    past_key, past_value = torch.randn(2, 2, 4, 8, dtype=torch.float64), torch.randn(2, 2, 4, 8, dtype=torch.float64)
    want, _, _ = block(hidden, None, past_key, past_value)
    positions = block.positions(hidden, None, past=4)
    q, k, v = block.project(hidden, positions)
    slots = 12
    key_cache = torch.randn(2, 2, slots, 8, dtype=torch.float64) * 1e3  # unused slots hold garbage
    value_cache = torch.randn(2, 2, slots, 8, dtype=torch.float64) * 1e3
    key_cache[:, :, :4], value_cache[:, :, :4] = past_key, past_value
    key_cache[:, :, 4:7], value_cache[:, :, 4:7] = k, v
    slot_positions = torch.arange(slots).expand(2, slots)
    filled = slot_positions < 7
    got = block.attend(q, key_cache, value_cache, positions, slot_positions, key_mask=filled)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    unmasked = (block.attend(q, key_cache, value_cache, positions, slot_positions) - want).abs().max()
    assert (unmasked < 1e-12) if causal else (unmasked > 1e-3)
