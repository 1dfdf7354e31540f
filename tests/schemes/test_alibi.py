"""ALiBi against the paper's slope code, BLOOM, and the bias written out with loops."""

from __future__ import annotations

import math

import pytest
import torch

from posenc import AttentionBlock, AttentionConfig, PositionError, build_scheme
from posenc import functional as PF
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
    torch.testing.assert_close(PF.alibi_slopes(heads, dtype=torch.float64), expected, rtol=1e-14, atol=0)


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
