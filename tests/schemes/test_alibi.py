"""ALiBi against the paper's slope code, BLOOM, and the bias written out with loops."""

from __future__ import annotations

import math

import pytest
import torch

from posenc import AttentionBlock, AttentionConfig, PositionError, build_scheme, functional
from tests.conftest import covers


def paper_slopes(n: int) -> list[float]:
    """The ALiBi authors' get_slopes (ofirpress/attention_with_linear_biases), transcribed."""

    def power_of_2(m: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(m) - 3)))
        return [start * start**i for i in range(m)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


def _config(heads: int, causal: bool = True) -> AttentionConfig:
    return AttentionConfig(
        hidden_size=8 * heads, num_heads=heads, head_dim=8, causal=causal, max_position_embeddings=40
    )


@covers("alibi")
@pytest.mark.parametrize("heads", [1, 3, 5, 6, 8, 12, 16, 20, 24, 40, 64, 96])
def test_slopes_match_the_paper_code(heads: int) -> None:
    expected = torch.tensor(paper_slopes(heads), dtype=torch.float64)
    torch.testing.assert_close(functional.alibi_slopes(heads, dtype=torch.float64), expected, rtol=1e-14, atol=0)


@covers("alibi")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
@pytest.mark.parametrize("symmetric", [False, True], ids=["causal", "symmetric"])
@pytest.mark.parametrize("heads", [8, 6])
def test_bias_equals_loops(heads: int, symmetric: bool, mode: str) -> None:
    """Causal: m_h (j - i) (equal to -m_h |i - j| where j <= i); symmetric: -m_h |i - j|."""
    scheme = build_scheme("alibi", _config(heads), {"symmetric": symmetric}, mode, table_dtype=torch.float64)
    slopes = paper_slopes(heads)
    k_pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8], [30, 31, 32, 33, 34, 35, 36, 37, 38]])
    q_pos = k_pos[:, 6:]
    bias = scheme.bias(None, None, q_pos, k_pos)
    assert bias.shape == (2, heads, 3, 9)
    for b in range(2):
        for h in range(heads):
            for i in range(3):
                for j in range(9):
                    qi, kj = int(q_pos[b, i]), int(k_pos[b, j])
                    expected = -slopes[h] * abs(qi - kj) if symmetric else slopes[h] * (kj - qi)
                    assert bias[b, h, i, j].item() == pytest.approx(expected, abs=1e-12)


@covers("alibi")
@pytest.mark.parametrize("symmetric", [False, True])
def test_precomputed_equals_dynamic(symmetric: bool) -> None:
    config = _config(12)
    pre = build_scheme("alibi", config, {"symmetric": symmetric}, "precomputed")
    dyn = build_scheme("alibi", config, {"symmetric": symmetric}, "dynamic")
    positions = torch.arange(40).unsqueeze(0)
    torch.testing.assert_close(pre.bias(None, None, positions, positions), dyn.bias(None, None, positions, positions))
    with pytest.raises(PositionError, match="past the precomputed table"):
        pre.bias(None, None, positions + 1, positions)
    far = torch.tensor([[100_000, 100_001]])
    assert dyn.bias(None, None, far, far)[0, 0, 1, 0].item() == pytest.approx(-paper_slopes(12)[0])  # j - i = -1


@covers("alibi")
@pytest.mark.parametrize("causal", [True, False])
def test_block_adds_the_bias_to_the_scaled_scores(causal: bool) -> None:
    config = _config(4, causal)
    block = AttentionBlock(config, "alibi", {"symmetric": not causal}).double()
    x = torch.randn(2, 10, config.hidden_size, dtype=torch.float64)
    out, _, _ = block(x)
    q = block.q_proj(x).view(2, 10, 4, 8).transpose(1, 2)
    k = block.k_proj(x).view(2, 10, 4, 8).transpose(1, 2)
    v = block.v_proj(x).view(2, 10, 4, 8).transpose(1, 2)
    i, j = torch.arange(10).view(-1, 1), torch.arange(10).view(1, -1)
    slopes = torch.tensor(paper_slopes(4), dtype=torch.float64).view(-1, 1, 1)
    bias = slopes * (j - i) if causal else -slopes * (i - j).abs()
    scores = q @ k.transpose(-1, -2) / math.sqrt(8) + bias
    if causal:
        scores = scores.masked_fill(j > i, float("-inf"))
    expected = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(2, 10, 32)
    torch.testing.assert_close(out, block.o_proj(expected))


@covers("alibi")
@pytest.mark.parametrize("causal", [True, False])
def test_symmetry_follows_causality_unless_given(causal: bool) -> None:
    """An encoder's ALiBi must not reward distant future keys: unset ``symmetric`` means ``not causal``."""
    config = _config(4, causal)
    positions = torch.arange(6).unsqueeze(0)
    default = build_scheme("alibi", config).bias(None, None, positions, positions)
    chosen = build_scheme("alibi", config, {"symmetric": not causal}).bias(None, None, positions, positions)
    torch.testing.assert_close(default, chosen)
    assert (default <= 0).all() if not causal else (default[..., 0, 1:] > 0).all()


# --------------------------------------------------------------------------------------------------
# MPT's and Falcon's forms
# --------------------------------------------------------------------------------------------------

HEADS_1_TO_17 = list(range(1, 18))


@covers("alibi")
@pytest.mark.parametrize("bias_max", [8.0, 6.0, 5.0])
def test_slopes_equal_build_mpt_alibi_tensor_for_every_head_count(bias_max: float) -> None:
    """MPT's order (even positions of the next power of two, then odd ones) is BLOOM's sequence, any alibi_bias_max."""
    mpt = pytest.importorskip("transformers.models.mpt.modeling_mpt", reason="MPT is the reference")
    for n in HEADS_1_TO_17:
        alibi = mpt.build_mpt_alibi_tensor(n, 2, alibi_bias_max=bias_max)  # [n, 1, 2]: slope * (j - 1)
        torch.testing.assert_close(functional.alibi_slopes(n, bias_max=bias_max), -alibi[:, 0, 0], rtol=1e-6, atol=0)


@covers("alibi")
def test_falcon_slopes_are_bloom_slopes_rounded_to_bfloat16() -> None:
    """Falcon's build_alibi_tensor rounds slopes (and slope · position) to bfloat16; the slopes are BLOOM's."""
    falcon = pytest.importorskip("transformers.models.falcon.modeling_falcon", reason="Falcon is the reference")
    for n in HEADS_1_TO_17:
        alibi = falcon.build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), n, torch.float32)  # [n, 1, 2]
        assert torch.equal(alibi[:, 0, 1], functional.alibi_slopes(n).to(torch.bfloat16).float()), n


def _fused_rows(weight: torch.Tensor, heads: int, which: int) -> torch.Tensor:
    """Rows of q (0), k (1) or v (2) in Falcon's fused ``query_key_value`` (per head: q, k, v)."""
    return weight.view(heads, 3, -1, *weight.shape[1:])[:, which].reshape(-1, *weight.shape[1:])


@covers("alibi")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
@pytest.mark.parametrize("rounded", [True, False], ids=["bf16_rounding", "exact_slopes"])
def test_scaled_alibi_equals_falcon_attention(mode: str, rounded: bool) -> None:
    """FalconAttention (eager): softmax((q·k + alibi)·1/√D + mask), 16 heads (slopes 2^(-i/2)), biases on, float64.

    ``rounded``: the alibi of transformers' ``build_alibi_tensor`` (bfloat16) against ``bf16_rounding``; else the
    unrounded ``m·j`` against the exact slopes. Keys reach position 299, past bfloat16's exact integers.
    """
    transformers = pytest.importorskip("transformers", reason="Falcon is the reference")
    from transformers.models.falcon.modeling_falcon import FalconAttention, build_alibi_tensor

    heads, length = 16, 300
    hf_config = transformers.FalconConfig(
        hidden_size=64, num_attention_heads=heads, alibi=True, bias=True, multi_query=False,
        new_decoder_architecture=False, num_hidden_layers=1,
    )  # fmt: skip
    hf_config._attn_implementation = "eager"
    hf = FalconAttention(hf_config, layer_idx=0).double().eval()
    config = AttentionConfig(hidden_size=64, num_heads=heads, max_position_embeddings=length, qkv_bias=True,
                             out_bias=True)  # fmt: skip
    params = {"scaled": True, "bf16_rounding": rounded}
    block = AttentionBlock(config, "alibi", params, mode, table_dtype=torch.float64).double()
    fused = hf.query_key_value
    state = {"o_proj.weight": hf.dense.weight, "o_proj.bias": hf.dense.bias}
    for which, name in enumerate(("q_proj", "k_proj", "v_proj")):
        state[f"{name}.weight"] = _fused_rows(fused.weight, heads, which)
        state[f"{name}.bias"] = _fused_rows(fused.bias, heads, which)
    block.load_state_dict(state, strict=False)

    x = torch.randn(1, length, 64, dtype=torch.float64)
    if rounded:
        alibi = build_alibi_tensor(torch.ones(1, length, dtype=torch.long), heads, torch.float64)
    else:
        alibi = (functional.alibi_slopes(heads, dtype=torch.float64).view(heads, 1, 1) * torch.arange(length)).double()
    mask = torch.full((length, length), float("-inf"), dtype=torch.float64).triu(1).view(1, 1, length, length)
    with torch.no_grad():
        expected, _ = hf(x, alibi=alibi, attention_mask=mask)
        got, _, _ = block(x)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)
    other = AttentionBlock(config, "alibi", {**params, "bf16_rounding": not rounded}, mode, table_dtype=torch.float64)
    other.double().load_state_dict(state, strict=False)
    assert not torch.allclose(other(x)[0], expected, atol=1e-5)  # the rounding is visible at these positions
    plain = AttentionBlock(config, "alibi", {**params, "scaled": False}, mode, table_dtype=torch.float64).double()
    plain.load_state_dict(state, strict=False)
    assert not torch.allclose(plain(x)[0], expected, atol=1e-4)  # BLOOM's unscaled bias is another model


@covers("alibi")
def test_alibi_bias_max_equals_mpt_attention() -> None:
    """MptAttention: softmax(q·k/√D + build_mpt_alibi_tensor + mask), 6 heads, alibi_bias_max 6."""
    transformers = pytest.importorskip("transformers", reason="MPT is the reference")
    from transformers.models.mpt.modeling_mpt import MptAttention, build_mpt_alibi_tensor

    hf_config = transformers.MptConfig(d_model=48, n_heads=6, n_layers=1, max_seq_len=40,
                                       attn_config={"alibi": True, "alibi_bias_max": 6})  # fmt: skip
    hf = MptAttention(hf_config, layer_idx=0).double().eval()
    config = AttentionConfig(hidden_size=48, num_heads=6, max_position_embeddings=40)
    block = AttentionBlock(config, "alibi", {"alibi_bias_max": 6.0}, table_dtype=torch.float64)
    block = block.double()
    q, k, v = hf.Wqkv.weight.chunk(3, dim=0)
    block.load_state_dict({"q_proj.weight": q, "k_proj.weight": k, "v_proj.weight": v,
                           "o_proj.weight": hf.out_proj.weight}, strict=False)  # fmt: skip
    x = torch.randn(2, 11, 48, dtype=torch.float64)
    position_bias = build_mpt_alibi_tensor(6, 11, alibi_bias_max=6).double()
    future = torch.ones(11, 11, dtype=torch.bool).triu(1).view(1, 1, 11, 11)
    with torch.no_grad():
        expected, _ = hf(x, position_bias, attention_mask=future)
        got, _, _ = block(x)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)  # MPT's slopes are float32


@covers("alibi")
def test_bad_slope_parameters_raise() -> None:
    from posenc import ConfigError

    with pytest.raises(ConfigError, match=r"alibi has no parameter\(s\) \['slopes'\]"):
        build_scheme("alibi", _config(4), {"slopes": "mpt"})
    with pytest.raises(ConfigError, match="'alibi_bias_max' must be > 0"):
        build_scheme("alibi", _config(4), {"alibi_bias_max": 0})
    with pytest.raises(ConfigError, match="bias_max must be a finite number > 0"):
        functional.alibi_slopes(4, bias_max=-8.0)
    with pytest.raises(ConfigError, match=r"bf16_rounding reproduces Falcon's bias .* causal"):
        build_scheme("alibi", _config(4, causal=False), {"bf16_rounding": True})
