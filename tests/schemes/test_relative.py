"""Relative family: shared distance helpers, Shaw, Transformer-XL / XLNet, and checks across the family."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from posenc import AttentionBlock, AttentionConfig, ConfigError, PositionError, build_scheme
from posenc.schemes.relative import lookup_magnitude, magnitude_lookup_table, rel_shift
from tests.conftest import SMALL, covers

FAMILY = ("shaw", "transformer_xl", "t5", "deberta", "tupe")
CONFIG = AttentionConfig(hidden_size=32, num_heads=2, head_dim=8, max_position_embeddings=64)


def _decode_positions(batch: int, past: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries at ``past .. past + length - 1``, keys at ``0 .. past + length - 1`` (a decode step with a cache)."""
    q_pos = (torch.arange(length) + past).expand(batch, length)
    k_pos = torch.arange(past + length).expand(batch, past + length)
    return q_pos, k_pos


def _qkv(batch: int, sq: int, sk: int, config: AttentionConfig = CONFIG) -> tuple[torch.Tensor, ...]:
    h, d = config.num_heads, config.head_dim
    return tuple(torch.randn(batch, h, s, d, dtype=torch.float64) for s in (sq, sk, sk))


# --------------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------------


def test_magnitude_lookup_matches_a_saturating_function_everywhere() -> None:
    def bucket(m: torch.Tensor) -> torch.Tensor:
        return torch.minimum(torch.sqrt(m.double()).floor().long(), torch.tensor(9))

    table = magnitude_lookup_table(bucket, lambda b: b >= 9, start=4)
    magnitudes = torch.arange(0, 5000)
    assert torch.equal(lookup_magnitude(table, magnitudes), bucket(magnitudes))
    assert table.shape[0] == 82  # first saturated magnitude is 81 = 9**2


def test_magnitude_lookup_raises_when_the_function_never_saturates() -> None:
    with pytest.raises(ConfigError, match="does not saturate"):
        magnitude_lookup_table(lambda m: m, lambda b: b < 0, start=4, limit=64)


# --------------------------------------------------------------------------------------------------
# Shaw
# --------------------------------------------------------------------------------------------------


def _naive_shaw(scheme, q, k, v, q_pos, k_pos, causal: bool, scale=None, cap=None, window=None) -> torch.Tensor:
    """Shaw et al. 2018 (arXiv:1803.02155), one (b, h, i) at a time, float64; optional scale, soft-cap and window."""
    r = scheme.params["max_relative_position"]
    a_k, a_v = scheme.key_table.detach().double(), scheme.value_table.detach().double()
    b_, h_, sq, d = q.shape
    out = torch.zeros_like(q)
    for b in range(b_):
        for h in range(h_):
            for i in range(sq):
                logits, rows = [], []
                for j in range(k.shape[2]):
                    row = min(max(int(k_pos[b, j] - q_pos[b, i]), -r), r) + r
                    rows.append(row)
                    e = float(q[b, h, i] @ (k[b, h, j] + a_k[row])) * (scale or 1 / math.sqrt(d))
                    e = cap * math.tanh(e / cap) if cap else e
                    distance = int(q_pos[b, i] - k_pos[b, j])
                    hidden = (causal and distance < 0) or (window is not None and abs(distance) >= window)
                    logits.append(-math.inf if hidden else e)
                alpha = torch.softmax(torch.tensor(logits, dtype=torch.float64), dim=0)
                out[b, h, i] = sum(alpha[j] * (v[b, h, j] + a_v[rows[j]]) for j in range(k.shape[2]))
    return out


@covers("shaw")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
@pytest.mark.parametrize(("radius", "causal"), [(2, True), (2, False), (16, True)])
def test_shaw_matches_naive_loop(mode: str, radius: int, causal: bool) -> None:
    scheme = build_scheme("shaw", CONFIG, {"max_relative_position": radius}, mode, table_dtype=torch.float64).double()
    q_pos, k_pos = _decode_positions(2, 4, 5)
    q, k, v = _qkv(2, 5, 9)
    got = scheme.attend(q, k, v, q_pos, k_pos, causal)
    torch.testing.assert_close(got, _naive_shaw(scheme, q, k, v, q_pos, k_pos, causal), atol=1e-12, rtol=1e-12)


@covers("shaw")
@pytest.mark.parametrize("causal", [True, False])
def test_shaw_honours_scale_soft_cap_and_window(causal: bool) -> None:
    config = dataclasses.replace(CONFIG, attn_scale=0.9, logit_softcap=1.5, sliding_window=3)
    scheme = build_scheme("shaw", config, {"max_relative_position": 2}, "dynamic", table_dtype=torch.float64).double()
    q_pos, k_pos = _decode_positions(2, 4, 5)
    q, k, v = _qkv(2, 5, 9)
    got = scheme.attend(q, k, v, q_pos, k_pos, causal)
    expected = _naive_shaw(scheme, q, k, v, q_pos, k_pos, causal, scale=0.9, cap=1.5, window=3)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12)


@covers("shaw")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
def test_shaw_distances_past_the_clip_use_only_the_end_rows(mode: str) -> None:
    scheme = build_scheme("shaw", CONFIG, {"max_relative_position": 2}, mode).double()
    q_pos = torch.tensor([[20]])
    k_pos = torch.cat((torch.arange(0, 19), torch.arange(22, 40))).unsqueeze(0)  # every |j - i| >= 2
    q, k, v = _qkv(1, 1, k_pos.shape[1])
    before = scheme.attend(q, k, v, q_pos, k_pos, causal=False)
    with torch.no_grad():
        scheme.key_table[1:-1].normal_()
        scheme.value_table[1:-1].normal_()
    torch.testing.assert_close(scheme.attend(q, k, v, q_pos, k_pos, causal=False), before, atol=0, rtol=0)
    with torch.no_grad():
        scheme.value_table[-1].add_(1.0)
    assert not torch.allclose(scheme.attend(q, k, v, q_pos, k_pos, causal=False), before)


@covers("shaw")
def test_shaw_bad_clip_distance_raises() -> None:
    with pytest.raises(ConfigError, match=r"max_relative_position.*>= 1"):
        build_scheme("shaw", CONFIG, {"max_relative_position": 0})


# --------------------------------------------------------------------------------------------------
# Transformer-XL / XLNet
# --------------------------------------------------------------------------------------------------


def _sinusoid(distance: int, width: int) -> torch.Tensor:
    """Transformer-XL's R_t = [sin(t ω_k), cos(t ω_k)], ω_k = 10000^(-2k / width), from the formula."""
    omega = [10000.0 ** (-2 * i / width) for i in range(width // 2)]
    values = [math.sin(distance * w) for w in omega] + [math.cos(distance * w) for w in omega]
    return torch.tensor(values, dtype=torch.float64)


def _naive_xl_bias(scheme, q, k, q_pos, k_pos) -> torch.Tensor:
    """``[u·k_j + (q_i + v)·W_R R_{i-j}] / √D`` per (b, h, i, j), float64 (Dai et al. 2019,
    arXiv:1901.02860, §3.3, as XLNet uses it)."""
    h_, d = scheme.config.num_heads, scheme.config.head_dim
    u, v = scheme.content_bias.detach().double(), scheme.position_bias.detach().double()
    w_r = scheme.r_proj.weight.detach().double()
    out = torch.zeros(q.shape[0], h_, q.shape[2], k.shape[2], dtype=torch.float64)
    for b in range(q.shape[0]):
        for i in range(q.shape[2]):
            for j in range(k.shape[2]):
                r = (w_r @ _sinusoid(int(q_pos[b, i] - k_pos[b, j]), w_r.shape[1])).view(h_, d)
                for h in range(h_):
                    out[b, h, i, j] = (u[h] @ k[b, h, j] + (q[b, h, i] + v[h]) @ r[h]) / math.sqrt(d)
    return out


@covers("transformer_xl")
def test_rel_shift_equals_naive_gather_and_xlnet() -> None:
    transformers = pytest.importorskip("transformers")
    xlnet = transformers.models.xlnet.modeling_xlnet.XLNetRelativeAttention
    sq, sk = 5, 9
    x = torch.randn(2, 3, sq, sk + sq)
    got = rel_shift(x, sk)
    naive = torch.empty(2, 3, sq, sk)
    for i in range(sq):
        for j in range(sk):
            naive[:, :, i, j] = x[:, :, i, sq - i + j]
    torch.testing.assert_close(got, naive, atol=0, rtol=0)
    torch.testing.assert_close(got, xlnet.rel_shift_bnij(x, klen=sk), atol=0, rtol=0)


@covers("transformer_xl")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
@pytest.mark.parametrize("use_rel_shift", [True, False])
def test_transformer_xl_bias_matches_naive_loop(mode: str, use_rel_shift: bool) -> None:
    params = {"rel_shift": use_rel_shift}
    scheme = build_scheme("transformer_xl", CONFIG, params, mode, table_dtype=torch.float64).double()
    for past, length in ((0, 6), (5, 3), (8, 1)):
        q_pos, k_pos = _decode_positions(2, past, length)
        q, k, _ = _qkv(2, length, past + length)
        expected = _naive_xl_bias(scheme, q, k, q_pos, k_pos)
        torch.testing.assert_close(scheme.bias(q, k, q_pos, k_pos), expected, atol=1e-12, rtol=1e-10)


@covers("transformer_xl")
@pytest.mark.parametrize("past", [0, 4])
def test_transformer_xl_matches_xlnet_rel_attn_core(past: int) -> None:
    transformers = pytest.importorskip("transformers")
    modeling = transformers.models.xlnet.modeling_xlnet
    hf_config = transformers.XLNetConfig(d_model=32, n_head=2, n_layer=1, d_inner=64, dropout=0.0)
    config = AttentionConfig(hidden_size=32, num_heads=2, max_position_embeddings=64, causal=False)
    scheme = build_scheme("transformer_xl", config, table_mode="dynamic")
    hf = modeling.XLNetRelativeAttention(hf_config).eval()
    with torch.no_grad():
        hf.r_w_bias.copy_(scheme.content_bias)
        hf.r_r_bias.copy_(scheme.position_bias)
        hf.r.copy_(scheme.r_proj.weight.T.reshape(32, 2, 16))
    qlen, klen = 5, 5 + past
    q, k, v = (torch.randn(1, 2, s, 16) for s in (qlen, klen, klen))
    pos_emb = modeling.XLNetModel(hf_config).relative_positional_encoding(qlen, klen, bsz=1)  # [klen + qlen, 1, E]
    k_head_r = torch.einsum("ibh,hnd->ibnd", pos_emb, hf.r)

    def ibnd(t: torch.Tensor) -> torch.Tensor:
        return t.permute(2, 0, 1, 3)

    expected = hf.rel_attn_core(ibnd(q), ibnd(k), ibnd(v), k_head_r).permute(1, 2, 0, 3)
    q_pos, k_pos = _decode_positions(1, past, qlen)
    scores = q @ k.transpose(-1, -2) * scheme.score_scale() + scheme.bias(q, k, q_pos, k_pos)
    torch.testing.assert_close(torch.softmax(scores, -1) @ v, expected, atol=2e-5, rtol=1e-4)


@covers("transformer_xl")
def test_transformer_xl_paths_and_modes_agree_and_stay_accurate_far_out() -> None:
    q_pos, k_pos = _decode_positions(1, 40, 6)
    q, k, _ = _qkv(1, 6, 46)
    reference = build_scheme("transformer_xl", CONFIG, {}, "dynamic", table_dtype=torch.float64)
    state = reference.state_dict()
    expected = reference.double().bias(q, k, q_pos, k_pos)
    q, k = q.float(), k.float()
    for mode in ("precomputed", "dynamic"):
        for path in (True, False):
            scheme = build_scheme("transformer_xl", CONFIG, {"rel_shift": path}, mode)
            scheme.load_state_dict(state, strict=False)
            torch.testing.assert_close(scheme.bias(q, k, q_pos, k_pos).double(), expected, atol=1e-5, rtol=1e-5)
    # dynamic mode has no length limit, and its float32-exact angles keep far positions accurate
    scheme = build_scheme("transformer_xl", CONFIG, {}, "dynamic")
    scheme.load_state_dict(state, strict=False)
    far = scheme.bias(q, k, q_pos + 131000, k_pos + 131000).double()
    torch.testing.assert_close(far, expected, atol=1e-5, rtol=1e-5)


@covers("transformer_xl")
def test_transformer_xl_position_layout_errors() -> None:
    q, k, _ = _qkv(1, 2, 5)
    shift = build_scheme("transformer_xl", CONFIG, {"rel_shift": True}, "dynamic", table_dtype=torch.float64).double()
    with pytest.raises(PositionError, match="rel_shift=False"):
        shift.bias(q, k, torch.tensor([[3, 5]]), torch.tensor([[0, 1, 2, 3, 5]]))
    gather = build_scheme("transformer_xl", CONFIG, {"rel_shift": False}, "dynamic", table_dtype=torch.float64)
    gather = gather.double()
    gather.load_state_dict(shift.state_dict())
    with pytest.raises(PositionError, match="contiguous"):
        gather.bias(q, k, torch.tensor([[0, 9]]), torch.tensor([[0, 1, 2, 3, 9]]))
    # Repeated positions (e.g. padding) stay inside the run of distances: the gather path serves them exactly.
    padded_q, padded_k = torch.tensor([[2, 2]]), torch.tensor([[0, 0, 1, 2, 2]])
    expected = _naive_xl_bias(gather, q, k, padded_q, padded_k)
    torch.testing.assert_close(gather.bias(q, k, padded_q, padded_k), expected, atol=1e-12, rtol=1e-10)


@covers("transformer_xl")
def test_transformer_xl_odd_hidden_raises() -> None:
    config = AttentionConfig(hidden_size=33, num_heads=3, head_dim=11)
    with pytest.raises(ConfigError, match="even hidden_size"):
        build_scheme("transformer_xl", config)


# --------------------------------------------------------------------------------------------------
# Across the family
# --------------------------------------------------------------------------------------------------

_PAPER_SCALE = {"transformer_xl": 0.25, "t5": 1.0, "deberta": 1 / math.sqrt(48), "tupe": 1 / math.sqrt(32)}
"""Content-term scale of each paper for head_dim 16: 1/√D, 1 (T5), 1/√(3D) (DeBERTa), 1/√(2D) (TUPE)."""


@covers("transformer_xl", "t5", "deberta", "tupe")
@pytest.mark.parametrize("name", sorted(_PAPER_SCALE))
def test_block_adds_bias_to_content_scaled_as_in_the_paper(name: str) -> None:
    block = AttentionBlock(SMALL, name).double()
    x = torch.randn(2, 7, SMALL.hidden_size, dtype=torch.float64)
    got, _, _ = block(x)
    h, hkv, d = SMALL.num_heads, SMALL.num_kv_heads, SMALL.head_dim
    q = block.q_proj(x).view(2, 7, h, d).transpose(1, 2)
    k = block.k_proj(x).view(2, 7, hkv, d).transpose(1, 2).repeat_interleave(h // hkv, dim=1)
    v = block.v_proj(x).view(2, 7, hkv, d).transpose(1, 2).repeat_interleave(h // hkv, dim=1)
    pos = torch.arange(7).expand(2, 7)
    scores = q @ k.transpose(-1, -2) * _PAPER_SCALE[name] + block.scheme.bias(q, k, pos, pos)
    scores = scores.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), -math.inf)
    expected = block.o_proj((torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(2, 7, h * d))
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12)


@covers(*FAMILY)
@pytest.mark.parametrize("name", FAMILY)
def test_precomputed_positions_past_the_table_raise(name: str) -> None:
    block = AttentionBlock(SMALL, name, table_mode="precomputed", max_positions=16)
    x = torch.randn(1, 4, SMALL.hidden_size)
    cache = torch.zeros(1, SMALL.num_kv_heads, 12, SMALL.head_dim)
    block(x, past_key=cache, past_value=cache)  # positions 12..15: the last rows of the table
    with pytest.raises(PositionError, match="max_positions > 16"):
        block(x, position_ids=torch.tensor([[13, 14, 15, 16]]), past_key=cache, past_value=cache)
