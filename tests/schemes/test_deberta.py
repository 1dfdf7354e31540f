"""DeBERTa disentangled attention against Hugging Face's DeBERTa-v2 and a naive per-(i, j) loop."""

from __future__ import annotations

import math

import pytest
import torch

from posenc import AttentionConfig, ConfigError, build_scheme
from tests.conftest import covers

CONFIG = AttentionConfig(hidden_size=32, num_heads=2, max_position_embeddings=64)
BUCKET_SETTINGS = [(256, 512), (8, 16), (16, 100), (5, 40), (0, 4), (0, 700)]


def _hf():  # type: ignore[no-untyped-def]
    return pytest.importorskip("transformers").models.deberta_v2.modeling_deberta_v2


def _params(buckets: int, max_relative: int) -> dict:
    return {"position_buckets": buckets, "max_relative_positions": max_relative}


def _hf_index(delta: torch.Tensor, buckets: int, max_relative: int) -> torch.Tensor:
    """Hugging Face's c2p index ``clamp(r + span, 0, 2·span - 1)``, r its (log-bucketed) q - k."""
    bucket = _hf().make_log_bucket_position(delta, buckets, max_relative) if buckets > 0 else delta
    span = buckets if buckets > 0 else max_relative
    return torch.clamp(bucket.long() + span, 0, 2 * span - 1)


@covers("deberta")
@pytest.mark.parametrize(("buckets", "max_relative"), BUCKET_SETTINGS)
def test_index_matches_hugging_face_log_buckets_over_a_wide_range(buckets: int, max_relative: int) -> None:
    delta = torch.cat((torch.arange(-5000, 5001), torch.tensor([-(2**24) + 1, -77777, 123456, 2**24 - 1])))
    expected = _hf_index(delta, buckets, max_relative)
    dynamic = build_scheme("deberta", CONFIG, _params(buckets, max_relative), "dynamic")
    assert torch.equal(dynamic.graph_index(delta), expected)
    precomputed = build_scheme("deberta", CONFIG, _params(buckets, max_relative), "precomputed", max_positions=5001)
    rows = precomputed.row_table + precomputed.first_row  # over key - query = -delta
    assert torch.equal(rows.flip(0), expected[:10001])


@covers("deberta")
@pytest.mark.parametrize(("buckets", "max_relative"), [(8, 16), (0, 6), (256, 512)])
def test_bias_matches_hugging_face_disentangled_attention(buckets: int, max_relative: int) -> None:
    modeling = _hf()
    hf_config = pytest.importorskip("transformers").DebertaV2Config(
        hidden_size=32, num_attention_heads=2, relative_attention=True, pos_att_type=["c2p", "p2c"],
        share_att_key=False, position_buckets=buckets if buckets > 0 else -1,
        max_relative_positions=max_relative, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0,
    )  # fmt: skip
    hf = modeling.DisentangledSelfAttention(hf_config).eval()
    scheme = build_scheme("deberta", CONFIG, _params(buckets, max_relative), "dynamic")
    hf.pos_key_proj.load_state_dict(scheme.pos_key_proj.state_dict())
    hf.pos_query_proj.load_state_dict(scheme.pos_query_proj.state_dict())
    b, h, s, d = 2, 2, 30, 16
    q, k = torch.randn(b, h, s, d), torch.randn(b, h, s, d)
    with torch.no_grad():
        expected = hf.disentangled_attention_bias(
            q.reshape(b * h, s, d), k.reshape(b * h, s, d), None, scheme.rel_embeddings, scale_factor=3
        )
        pos = torch.arange(s).expand(b, s)
        got = scheme.bias(q, k, pos, pos)
    torch.testing.assert_close(got.reshape(b * h, s, s), expected, atol=1e-5, rtol=1e-5)
    assert math.isclose(scheme.score_scale(), 1 / math.sqrt(3 * d))


@covers("deberta")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
def test_bias_matches_naive_loop_while_decoding(mode: str) -> None:
    """``[q_i·K_r[idx] + k_j·Q_r[idx]] / √(3D)`` with ``idx`` from Hugging Face's buckets of q_pos - k_pos."""
    params = _params(8, 16)
    scheme = build_scheme("deberta", CONFIG, params, mode, table_dtype=torch.float64).double()
    q_pos, k_pos = (torch.arange(3) + 37).expand(2, 3), torch.arange(40).expand(2, 40)
    q, k = torch.randn(2, 2, 3, 16, dtype=torch.float64), torch.randn(2, 2, 40, 16, dtype=torch.float64)
    emb = scheme.rel_embeddings.detach()
    pos_key = scheme.pos_key_proj(emb).detach().view(-1, 2, 16)
    pos_query = scheme.pos_query_proj(emb).detach().view(-1, 2, 16)
    got = scheme.bias(q, k, q_pos, k_pos)
    for b in range(2):
        for i in range(3):
            idx = _hf_index(q_pos[b, i] - k_pos[b], 8, 16)
            for j in range(40):
                for h in range(2):
                    c2p = q[b, h, i] @ pos_key[idx[j], h]
                    p2c = k[b, h, j] @ pos_query[idx[j], h]
                    torch.testing.assert_close(got[b, h, i, j], (c2p + p2c) / math.sqrt(48), atol=1e-12, rtol=1e-12)


@covers("deberta")
def test_precomputed_projects_only_the_rows_its_distances_reach() -> None:
    scheme = build_scheme("deberta", CONFIG, {}, "precomputed", max_positions=64)  # 512 embedding rows
    assert scheme.num_rows == 127  # distances -63..63 are exact buckets
    dynamic = build_scheme("deberta", CONFIG, {}, "dynamic")
    dynamic.load_state_dict(scheme.state_dict(), strict=False)
    q_pos, k_pos = torch.arange(50, 64).expand(2, 14), torch.arange(64).expand(2, 64)
    q, k = torch.randn(2, 2, 14, 16), torch.randn(2, 2, 64, 16)
    torch.testing.assert_close(scheme.bias(q, k, q_pos, k_pos), dynamic.bias(q, k, q_pos, k_pos))


@covers("deberta")
@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"position_buckets": 2}, "use >= 4, or 0"),
        ({"position_buckets": 64, "max_relative_positions": 33}, "raise max_relative_positions"),
        ({"max_relative_positions": 0}, "max_relative_positions.*>= 1"),
        ({"position_buckets": -1}, "position_buckets.*>= 0"),
    ],
)
def test_bad_parameters_raise(params: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_scheme("deberta", CONFIG, params)
