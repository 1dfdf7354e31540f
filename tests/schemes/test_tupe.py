"""TUPE: untied position correlation and the T5 bucket term, against a naive per-(i, j) loop."""

from __future__ import annotations

import math

import pytest
import torch

from posenc import AttentionConfig, ConfigError, build_scheme
from tests.conftest import covers

CONFIG = AttentionConfig(hidden_size=32, num_heads=2, head_dim=8, max_position_embeddings=64)


@covers("tupe")
@pytest.mark.parametrize("relative", [True, False])
def test_bias_matches_naive_loop(relative: bool) -> None:
    """``(p_i U^Q)·(p_j U^K)/√(2D) + b[bucket(j - i)]`` per (b, h, i, j), buckets from Hugging Face's T5."""
    hf_bucket = pytest.importorskip("transformers").models.t5.modeling_t5.T5Attention._relative_position_bucket
    scheme = build_scheme("tupe", CONFIG, {"relative": relative}, table_dtype=torch.float64).double()
    p = scheme.position_embeddings.detach()
    u_q, u_k = scheme.pos_query_proj.weight.detach(), scheme.pos_key_proj.weight.detach()
    q_pos, k_pos = torch.tensor([[20, 21], [5, 6]]), torch.tensor([[0, 3, 7, 20, 21], [0, 1, 2, 5, 6]])
    q, k = torch.randn(2, 2, 2, 8, dtype=torch.float64), torch.randn(2, 2, 5, 8, dtype=torch.float64)
    got = scheme.bias(q, k, q_pos, k_pos)
    for b in range(2):
        for i in range(2):
            for j in range(5):
                pq = (u_q @ p[q_pos[b, i]]).view(2, 8)
                pk = (u_k @ p[k_pos[b, j]]).view(2, 8)
                expected = (pq * pk).sum(-1) / math.sqrt(16)
                if relative:
                    bucket = int(hf_bucket(k_pos[b, j] - q_pos[b, i]))
                    expected = expected + scheme.relative_bias.weight.detach()[bucket]
                torch.testing.assert_close(got[b, :, i, j], expected, atol=1e-12, rtol=1e-12)
    assert math.isclose(scheme.score_scale(), 1 / math.sqrt(16))


@covers("tupe")
def test_untied_term_depends_on_absolute_positions() -> None:
    """Unlike the relative schemes, shifting queries and keys together changes TUPE's bias."""
    scheme = build_scheme("tupe", CONFIG, {"relative": False}).double()
    q_pos, k_pos = torch.tensor([[3, 4]]), torch.arange(5).unsqueeze(0)
    q, k = torch.randn(1, 2, 2, 8, dtype=torch.float64), torch.randn(1, 2, 5, 8, dtype=torch.float64)
    assert not torch.allclose(scheme.bias(q, k, q_pos, k_pos), scheme.bias(q, k, q_pos + 7, k_pos + 7))


@covers("tupe")
def test_only_precomputed_mode_exists() -> None:
    with pytest.raises(ConfigError, match="does not support table mode 'dynamic'"):
        build_scheme("tupe", CONFIG, table_mode="dynamic")
