"""DeBERTa disentangled attention against Hugging Face's DeBERTa-v2 and a naive per-(i, j) loop."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from posenc import AttentionBlock, AttentionConfig, ConfigError, build_scheme
from tests.conftest import covers

CONFIG = AttentionConfig(hidden_size=32, num_heads=2, max_position_embeddings=64)
BUCKET_SETTINGS = [(256, 512), (8, 16), (16, 100), (5, 40), (0, 4), (0, 700)]


def _hf():
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


# --------------------------------------------------------------------------------------------------
# share_att_key, pos_att_type, rel_norm (DeBERTa-v3 settings)
# --------------------------------------------------------------------------------------------------

ENCODER = dataclasses.replace(CONFIG, causal=False, qkv_bias=True)
V3_SETTINGS = [  # share_att_key, pos_att_type, norm_rel_ebd layer_norm, position_buckets, max_relative_positions
    (True, ["c2p", "p2c"], True, 8, 16),
    (True, ["c2p"], False, 0, 5),
    (True, ["p2c"], True, 8, 16),
    (False, ["p2c"], True, 16, 100),
    (False, ["c2p"], False, 8, 16),
]


def _v3_block(share: bool, terms: list[str], norm: bool, buckets: int, max_relative: int, mode: str = "dynamic"):
    params = {**_params(buckets, max_relative), "share_att_key": share, "pos_att_type": "|".join(terms),
              "rel_norm": norm, "rel_norm_eps": 1e-7}  # fmt: skip
    return AttentionBlock(ENCODER, "deberta", params, mode).double()


@covers("deberta")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
@pytest.mark.parametrize(("share", "terms", "norm", "buckets", "max_relative"), V3_SETTINGS)
def test_block_equals_hugging_face_deberta_v3_attention(share, terms, norm, buckets, max_relative, mode) -> None:
    """DisentangledSelfAttention.forward with DebertaV2Encoder.get_rel_embedding, the same weights (float64)."""
    modeling = _hf()
    hf_config = pytest.importorskip("transformers").DebertaV2Config(
        hidden_size=32, num_attention_heads=2, intermediate_size=8, num_hidden_layers=1, relative_attention=True,
        pos_att_type=terms, share_att_key=share, position_buckets=buckets if buckets > 0 else -1,
        max_relative_positions=max_relative, norm_rel_ebd="layer_norm" if norm else "none", layer_norm_eps=1e-7,
        attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0, max_position_embeddings=64,
    )  # fmt: skip
    hf = modeling.DisentangledSelfAttention(hf_config).double().eval()
    encoder = modeling.DebertaV2Encoder(hf_config).double().eval()
    with torch.no_grad():
        encoder.rel_embeddings.weight.normal_()
        if norm:
            encoder.LayerNorm.weight.normal_(mean=1.0, std=0.2)
            encoder.LayerNorm.bias.normal_(std=0.2)
    block = _v3_block(share, terms, norm, buckets, max_relative, mode)
    state = {"q_proj": hf.query_proj, "k_proj": hf.key_proj, "v_proj": hf.value_proj}
    if not share:
        state.update({f"scheme.{name}": getattr(hf, name) for name in ("pos_key_proj", "pos_query_proj")
                      if hasattr(hf, name)})  # fmt: skip
    weights = {
        f"{prefix}.{key}": value for prefix, module in state.items() for key, value in module.state_dict().items()
    }
    weights["scheme.rel_embeddings"] = encoder.rel_embeddings.weight
    if norm:
        weights.update({f"scheme.rel_norm.{k}": v for k, v in encoder.LayerNorm.state_dict().items()})
    weights["o_proj.weight"] = torch.eye(32, dtype=torch.float64)  # compare the context layer itself
    missing, unexpected = block.load_state_dict(weights, strict=False)
    assert not unexpected
    assert all(key.endswith("_table") or key.endswith("_buckets") for key in missing)

    x = torch.randn(2, 12, 32, dtype=torch.float64)
    with torch.no_grad():
        expected, _ = hf(x, torch.ones(2, 1, 12, 12, dtype=torch.bool), rel_embeddings=encoder.get_rel_embedding())
        got, _, _ = block(x)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)  # transformers' scale is a float32 sqrt
    assert block.scheme.score_scale() == pytest.approx((16 * (1 + len(terms))) ** -0.5)


@covers("deberta")
def test_shared_projections_are_the_blocks_own_and_saved_once(tmp_path) -> None:
    safetensors = pytest.importorskip("safetensors.torch")
    block = _v3_block(True, ["c2p", "p2c"], True, 8, 16)
    assert block.scheme.projection("pos_key_proj") is block.k_proj
    assert block.scheme.projection("pos_query_proj") is block.q_proj
    keys = set(block.state_dict())
    assert not any("pos_key_proj" in key or "pos_query_proj" in key for key in keys)
    assert {"scheme.rel_embeddings", "scheme.rel_norm.weight", "scheme.rel_norm.bias", "q_proj.bias"} <= keys
    safetensors.save_file(dict(block.state_dict().items()), tmp_path / "w.safetensors")  # no shared storage
    copy = _v3_block(True, ["c2p", "p2c"], True, 8, 16)
    copy.load_state_dict(safetensors.load_file(tmp_path / "w.safetensors"))
    x = torch.randn(1, 7, 32, dtype=torch.float64)
    torch.testing.assert_close(copy(x)[0], block(x)[0], atol=0, rtol=0)
    q, k = torch.randn(2, 1, 2, 7, 16, dtype=torch.float64)
    positions = torch.arange(7).unsqueeze(0)
    with torch.no_grad():  # the c2p term follows k_proj: changing k_proj changes the position bias
        before = copy.scheme.bias(q, k, positions, positions)
        copy.k_proj.weight.add_(torch.randn_like(copy.k_proj.weight))
        assert not torch.allclose(copy.scheme.bias(q, k, positions, positions), before)
    torch.save(copy, tmp_path / "block.pt")
    loaded = torch.load(tmp_path / "block.pt", weights_only=False)
    assert loaded.scheme.projection("pos_key_proj") is loaded.k_proj  # pickling keeps the tie
    assert loaded.half().scheme.projection("pos_query_proj").weight.dtype == torch.float16
    alone = build_scheme(
        "deberta", ENCODER, {"share_att_key": True, "position_buckets": 8, "max_relative_positions": 16}
    )
    assert {"pos_key_proj.weight", "pos_query_proj.weight"} <= set(alone.state_dict())  # the op unit keeps its own


@covers("deberta")
def test_only_the_projections_of_the_selected_terms_exist() -> None:
    c2p = build_scheme("deberta", CONFIG, {"pos_att_type": "c2p"})
    assert hasattr(c2p, "pos_key_proj")
    assert not hasattr(c2p, "pos_query_proj")
    assert math.isclose(c2p.score_scale(), 1 / math.sqrt(2 * 16))
    p2c = build_scheme("deberta", CONFIG, {"pos_att_type": "p2c"})
    assert hasattr(p2c, "pos_query_proj")
    assert not hasattr(p2c, "pos_key_proj")


@covers("deberta")
def test_bad_v3_settings_raise() -> None:
    gqa = AttentionConfig(hidden_size=32, num_heads=2, num_kv_heads=1, max_position_embeddings=64)
    with pytest.raises(ConfigError, match=r"share_att_key projects .* num_kv_heads = num_heads"):
        AttentionBlock(gqa, "deberta", {"share_att_key": True})
    with pytest.raises(ConfigError, match=r"pos_att_type' must be one of \['c2p\|p2c', 'c2p', 'p2c'\]"):
        build_scheme("deberta", CONFIG, {"pos_att_type": "c2c"})
    with pytest.raises(ConfigError, match="rel_norm_eps' must be > 0"):
        build_scheme("deberta", CONFIG, {"rel_norm": True, "rel_norm_eps": 0.0})
