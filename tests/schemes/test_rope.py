"""Rotary schemes (RoPE and its scalings, ReRoPE, Leaky ReRoPE, RoPE in linear attention) against references.

References: Hugging Face transformers' rotary embedding module (cos/sin per rope_type, dynamic and LongRoPE
switching included), explicit 2x2 rotation matrices, the complex-number form, ReRoPE's g(t) (Su Jianlin 2023,
https://kexue.fm/archives/9708) computed per (i, j), and RoPE's linear attention (Su Jianlin 2021,
https://kexue.fm/archives/8265, section 线性场景) computed per query with explicit loops.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from posenc import AttentionConfig, ConfigError, PositionError, build_scheme, get_spec
from posenc.schemes import TableMode
from tests.conftest import covers
from tests.test_functional import rotation_matrix

CONFIG = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=64)
ROPE_SCHEMES = [
    "rope", "rope_linear", "rope_ntk", "rope_dynamic", "rope_yarn", "rope_longrope", "rope_llama3", "rope_truncation",
    "rope_ntk_alpha",
]  # fmt: skip


def _modes(name: str) -> list[TableMode]:
    return sorted(get_spec(name).table_modes, key=lambda m: m.value)


def _rotary_dim(params: dict[str, Any], head_dim: int = 16) -> int:
    return int(head_dim * params.get("partial_rotary_factor", 1.0))


def _theta(rotary_dim: int, base: float = 10000.0) -> list[float]:
    return [base ** (-2 * i / rotary_dim) for i in range(rotary_dim // 2)]


# --------------------------------------------------------------------------------------------------
# RoPE and its scalings
# --------------------------------------------------------------------------------------------------

ROPE_MATRIX = [
    pytest.param(name, mode, case, id=f"{name}-{mode.value}-{case}")
    for name in ROPE_SCHEMES
    for mode in _modes(name)
    for case in get_spec(name).cases
]


@covers(*ROPE_SCHEMES)
@pytest.mark.parametrize(("name", "mode", "case"), ROPE_MATRIX)
def test_scores_depend_only_on_relative_position_and_norms_scale_by_attention_factor(
    name: str, mode: TableMode, case: str
) -> None:
    """Same q and k vectors at every position: the score matrix is Toeplitz (depends on j - i only).

    Holds within one call for the length-dependent types too (one frequency set per call).
    """
    params = dict(get_spec(name).cases[case])
    scheme = build_scheme(name, CONFIG, params, mode, max_positions=4200, table_dtype=torch.float64)
    r = _rotary_dim(get_spec(name).resolve(params))
    for start in (0, 4100):
        positions = torch.arange(start, start + 40).unsqueeze(0)
        q = torch.randn(1, 4, 1, 16, dtype=torch.float64).expand(1, 4, 40, 16)
        k = torch.randn(1, 2, 1, 16, dtype=torch.float64).expand(1, 2, 40, 16)
        qr, kr = scheme.rotate(q, k, positions)
        scores = qr[:, :2] @ kr.transpose(-1, -2)  # [1, 2, 40, 40]
        torch.testing.assert_close(scores[..., 1:, 1:], scores[..., :-1, :-1], atol=1e-10, rtol=1e-10)
        assert not torch.allclose(scores[..., 0, 0], scores[..., 0, 5])  # and it does vary with distance
        ratio = qr[..., :r].norm(dim=-1) / q[..., :r].norm(dim=-1)
        torch.testing.assert_close(ratio, torch.full_like(ratio, ratio[0, 0, 0].item()), atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(qr[..., r:], q[..., r:], atol=0, rtol=0)
    expected_factor = {"rope_yarn": 0.1 * math.log(params.get("factor", 4.0)) + 1.0, "rope_longrope": math.sqrt(1.5)}
    if case == "deepseek_mscale":  # mscale == mscale_all_dim: the two mscales cancel
        expected_factor["rope_yarn"] = 1.0
    assert ratio[0, 0, 0].item() == pytest.approx(expected_factor.get(name, 1.0), rel=1e-12)


def _hf_rotary(rope_parameters: dict[str, Any], head_dim: int = 16, max_position_embeddings: int = 64):
    pytest.importorskip("transformers", reason="transformers is the upstream reference (pip install transformers)")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=dict(rope_parameters),
    )
    return LlamaRotaryEmbedding(config)


_SHORT = [1.0, 1.1, 1.2, 1.3, 1.5, 1.7, 2.0, 2.5]
_LONG = [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 9.0, 12.0]
HF_MODULE_CASES = [
    ("rope", {}, {"rope_type": "default", "rope_theta": 10000.0}),
    ("rope", {"rope_theta": 5e5}, {"rope_type": "default", "rope_theta": 5e5}),
    ("rope_linear", {"factor": 4.0}, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    ("rope_linear", {"factor": 2.0, "partial_rotary_factor": 0.5},
     {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0, "partial_rotary_factor": 0.5}),
    ("rope_dynamic", {"factor": 2.0}, {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
    ("rope_dynamic", {"factor": 3.0, "partial_rotary_factor": 0.5},
     {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 3.0, "partial_rotary_factor": 0.5}),
    ("rope_yarn", {}, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}),
    ("rope_yarn", {"factor": 8.0, "original_max_position_embeddings": 16, "beta_fast": 8.0, "truncate": False},
     {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 16,
      "beta_fast": 8.0, "truncate": False}),
    ("rope_yarn", {"factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.5, "partial_rotary_factor": 0.5},
     {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.5,
      "partial_rotary_factor": 0.5}),
    ("rope_longrope", {"original_max_position_embeddings": 16, "short_factor": _SHORT, "long_factor": _LONG},
     {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 16,
      "short_factor": _SHORT, "long_factor": _LONG}),
    ("rope_longrope", {"original_max_position_embeddings": 16, "short_factor": _SHORT, "long_factor": _LONG,
                       "factor": 2.0, "attention_factor": 1.1},
     {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 16,
      "short_factor": _SHORT, "long_factor": _LONG, "factor": 2.0, "attention_factor": 1.1}),
    ("rope_llama3", {}, {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0}),
    ("rope_llama3", {"factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
                     "original_max_position_embeddings": 128, "rope_theta": 5e5},
     {"rope_type": "llama3", "rope_theta": 5e5, "factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
      "original_max_position_embeddings": 128}),
]  # fmt: skip


@covers("rope", "rope_linear", "rope_dynamic", "rope_yarn", "rope_longrope", "rope_llama3")
@pytest.mark.parametrize(
    ("name", "params", "hf_params"), [pytest.param(*c, id=f"{c[0]}-{i}") for i, c in enumerate(HF_MODULE_CASES)]
)
def test_cos_sin_match_hugging_face_rotary_embedding(name: str, params: dict, hf_params: dict) -> None:
    """Short calls, then calls past the context (dynamic NTK grows its base, LongRoPE switches to long factors)."""
    r = _rotary_dim(params)
    for mode in _modes(name):
        hf = _hf_rotary(hf_params)  # fresh: HF's dynamic update is stateful
        scheme = build_scheme(name, CONFIG, params, mode, max_positions=200)
        for length in (12, 16, 17, 64, 150, 33):  # 16 | 17: the LongRoPE switch of these cases
            positions = torch.arange(length).unsqueeze(0).expand(2, length)
            expected_cos, expected_sin = hf(torch.zeros(1, dtype=torch.float32), positions)
            cos, sin = scheme.cos_sin(positions)
            assert cos.shape == (2, length, r // 2)
            for expected, got in ((expected_cos, cos), (expected_sin, sin)):
                torch.testing.assert_close(got, expected[..., : r // 2], atol=3e-5, rtol=0)  # HF angles in fp32
                torch.testing.assert_close(got, expected[..., r // 2 :], atol=3e-5, rtol=0)


@covers("rope")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
@pytest.mark.parametrize(("layout", "partial"), [("half", 1.0), ("interleaved", 1.0), ("half", 0.5),
                                                 ("interleaved", 0.5)])  # fmt: skip
def test_rope_rotation_equals_explicit_matrices(mode: str, layout: str, partial: float) -> None:
    """RoFormer's rotation (arXiv:2104.09864) with θ_i = 10000^(-2i/r), positions in a batch of two rows,
    including decode offsets."""
    params = {"layout": layout, "partial_rotary_factor": partial}
    scheme = build_scheme("rope", CONFIG, params, mode, table_dtype=torch.float64)
    r = _rotary_dim(params)
    positions = torch.tensor([[0, 1, 2, 3, 4], [40, 41, 42, 63, 7]])
    q, k = torch.randn(2, 4, 5, 16, dtype=torch.float64), torch.randn(2, 2, 5, 16, dtype=torch.float64)
    qr, kr = scheme.rotate(q, k, positions)
    for b in range(2):
        for s in range(5):
            matrix = rotation_matrix([positions[b, s].item() * t for t in _theta(r)], 16, layout)
            torch.testing.assert_close(qr[b, :, s], q[b, :, s] @ matrix.T, atol=1e-12, rtol=1e-12)
            torch.testing.assert_close(kr[b, :, s], k[b, :, s] @ matrix.T, atol=1e-12, rtol=1e-12)


@covers("rope")
def test_rope_interleaved_equals_complex_form() -> None:
    """Meta's Llama reference code (github.com/meta-llama/llama, model.py): xq_ = view_as_complex(xq);
    view_as_real(xq_ * freqs_cis) with freqs_cis = polar(1, t ⊗ θ)."""
    scheme = build_scheme("rope", CONFIG, {"layout": "interleaved"}, table_dtype=torch.float64)
    t = torch.arange(20, dtype=torch.float64)
    freqs_cis = torch.polar(torch.ones(20, 8, dtype=torch.float64), torch.outer(t, torch.tensor(_theta(16))))
    q = torch.randn(1, 4, 20, 16, dtype=torch.float64)
    k = torch.randn(1, 2, 20, 16, dtype=torch.float64)
    qr, kr = scheme.rotate(q, k, torch.arange(20).unsqueeze(0))
    for x, got in ((q, qr), (k, kr)):
        x_ = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
        torch.testing.assert_close(got, torch.view_as_real(x_ * freqs_cis).flatten(-2))


@covers("rope")
def test_rope_long_range_decay_trend_of_roformer() -> None:
    """f(m) = (1/(d/2)) Σ_j |S_j|, S_j = Σ_{i<j} e^{i m θ_i}, d = 128, from the scheme's own cos/sin tables."""
    config = AttentionConfig(hidden_size=256, num_heads=2, head_dim=128, max_position_embeddings=257)
    scheme = build_scheme("rope", config, table_dtype=torch.float64)
    cos, sin = scheme.cos_sin(torch.arange(257).unsqueeze(0))
    partial_sums = torch.cumsum(torch.complex(cos[0], sin[0]), dim=-1)  # S_1 .. S_64 for every m
    f = partial_sums.abs().mean(dim=-1)
    assert f[0].item() == pytest.approx(32.5)  # (1/64) Σ_{j=1}^{64} j
    assert (f[1:] < f[0]).all()
    windows = f[:256].view(8, 32).mean(dim=-1)
    assert (windows[1:] < windows[:-1]).all(), windows
    assert windows[-1] < 0.5 * windows[0]


@covers("rope_ntk")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
def test_ntk_lowest_frequency_is_interpolated_highest_kept(mode: str) -> None:
    factor = 4.0
    ntk = build_scheme("rope_ntk", CONFIG, {"factor": factor}, mode, table_dtype=torch.float64)
    positions = torch.arange(64).unsqueeze(0)
    cos, sin = ntk.cos_sin(positions)
    theta = _theta(16)
    p = positions[0].double()
    torch.testing.assert_close(cos[0, :, -1], torch.cos(p * theta[-1] / factor))  # lowest: position / k
    torch.testing.assert_close(sin[0, :, -1], torch.sin(p * theta[-1] / factor))
    torch.testing.assert_close(cos[0, :, 0], torch.cos(p * theta[0]))  # highest: unchanged


@covers("rope_truncation")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
def test_truncation_cos_sin_follow_the_seed_rule(mode: str) -> None:
    a, c, beta = 2e-3, 0.05, 0.02  # θ_i = 10000^(-i/8): bands kept / β / zero all occur
    params = {"truncation_a": a, "truncation_c": c, "truncation_beta": beta}
    scheme = build_scheme("rope_truncation", CONFIG, params, mode, table_dtype=torch.float64)
    h = [t if t >= c else beta if t > a else 0.0 for t in _theta(16)]
    assert {0.0, beta} <= set(h)
    positions = torch.arange(64).unsqueeze(0)
    cos, sin = scheme.cos_sin(positions)
    angles = positions[0].double().unsqueeze(-1) * torch.tensor(h, dtype=torch.float64)
    torch.testing.assert_close(cos[0], angles.cos())
    torch.testing.assert_close(sin[0], angles.sin())


@covers("rope_dynamic", "rope_longrope")
def test_length_dependent_schemes_pick_frequencies_from_the_longest_position() -> None:
    dynamic = build_scheme("rope_dynamic", CONFIG, {"factor": 2.0}, "dynamic", table_dtype=torch.float64)
    plain = build_scheme("rope", CONFIG, table_dtype=torch.float64, table_mode="dynamic")
    short = torch.arange(64).unsqueeze(0)
    torch.testing.assert_close(dynamic.cos_sin(short), plain.cos_sin(short))
    long = torch.arange(65).unsqueeze(0)
    assert not torch.allclose(dynamic.cos_sin(long)[0][:, :64], plain.cos_sin(short)[0])


@covers(*ROPE_SCHEMES)
def test_fp32_dynamic_tables_stay_accurate_at_long_positions() -> None:
    """In-graph tables (float32 exact angles) against the float64 tables at positions near 2**17 and 2**23."""
    config = AttentionConfig(hidden_size=256, num_heads=2, head_dim=128, max_position_embeddings=4096)
    positions = torch.tensor([[0, 1, 131071, 131072, 131073, 8_000_000]])
    for name in ("rope", "rope_yarn", "rope_llama3", "rope_ntk", "rope_linear", "rope_dynamic", "rope_ntk_alpha"):
        fp32 = build_scheme(name, config, table_mode="dynamic")
        fp64 = build_scheme(name, config, table_mode="dynamic", table_dtype=torch.float64)
        for got, expected in zip(fp32.cos_sin(positions), fp64.cos_sin(positions), strict=True):
            assert got.dtype == torch.float32
            assert (got.double() - expected).abs().max() < 2e-6, name


def test_rope_bad_input_raises_with_a_remedy() -> None:
    with pytest.raises(ConfigError, match=r"even rotary_dim.*Choose a factor"):
        build_scheme("rope", CONFIG, {"partial_rotary_factor": 5 / 16})  # 16 * 5/16 = 5: odd
    with pytest.raises(ConfigError, match=r"partial_rotary_factor.*must be <= 1.0"):
        build_scheme("rope", CONFIG, {"partial_rotary_factor": 1.5})
    with pytest.raises(ConfigError, match=r"layout.*one of"):
        build_scheme("rope", CONFIG, {"layout": "gptj"})
    with pytest.raises(ConfigError, match="long_factor must have rotary_dim // 2 = 8 entries"):
        build_scheme("rope_longrope", CONFIG, {"short_factor": [1.0] * 8, "long_factor": [1.0] * 4})
    with pytest.raises(ConfigError, match="high_freq_factor > low_freq_factor"):
        build_scheme("rope_llama3", CONFIG, {"low_freq_factor": 4.0, "high_freq_factor": 2.0})
    with pytest.raises(ConfigError, match=r"factor.*must be >"):
        build_scheme("rope_yarn", CONFIG, {"factor": -1.0})
    with pytest.raises(ConfigError, match=r"only in table mode 'dynamic'|does not support table mode"):
        build_scheme("rope_dynamic", CONFIG, table_mode="precomputed")


@pytest.mark.parametrize("name", ["rope", "rerope", "rope_linear_attention"])
def test_positions_past_the_precomputed_table_or_of_float_dtype_raise(name: str) -> None:
    scheme = build_scheme(name, CONFIG, get_spec(name).cases["default"], "precomputed", max_positions=32)
    q, k = torch.randn(1, 4, 2, 16), torch.randn(1, 4, 2, 16)

    def call(positions: torch.Tensor) -> Any:
        if name == "rope":
            return scheme.rotate(q, k[:, :2], positions)
        return scheme.attend(q, k, k, positions, positions, True)

    call(torch.tensor([[30, 31]]))
    with pytest.raises(PositionError, match=r"position 32 is past the precomputed table of 32 rows.*'dynamic'") as info:
        call(torch.tensor([[31, 32]]))
    assert "max_positions > 32" in str(info.value)
    with pytest.raises(PositionError, match=">= 0"):
        call(torch.tensor([[-1, 0]]))
    with pytest.raises(ConfigError, match="integer tensor"):
        call(torch.tensor([[0.0, 1.0]]))


# --------------------------------------------------------------------------------------------------
# ReRoPE and Leaky ReRoPE: g(t) of Su Jianlin (2023), https://kexue.fm/archives/9708, per (i, j)
# --------------------------------------------------------------------------------------------------


def seed_g(t: int, window: int, t_max: float | None = None, t_max_new: float | None = None) -> float:
    """Su Jianlin 2023 (https://kexue.fm/archives/9708): g(t) = t for |t| <= w; sign(t) w (ReRoPE);
    sign(t)(w + (T_max - w)(|t| - w)/(T'_max - w)) (Leaky)."""
    if abs(t) <= window:
        return float(t)
    sign = 1.0 if t > 0 else -1.0
    if t_max is None:
        return sign * window
    return sign * (window + (t_max - window) * (abs(t) - window) / (t_max_new - window))


def naive_rerope_scores(
    q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, g, layout: str, rotary_dim: int
) -> torch.Tensor:
    """score_ij = q_iᵀ R_{-g(i - j)} k_j / sqrt(D): ⟨R_m q, R_n k⟩ = qᵀ R_{n-m} k with n - m replaced by -g(m - n)."""
    b_size, heads, sq, dim = q.shape
    theta = _theta(rotary_dim)
    out = torch.zeros(b_size, heads, sq, k.shape[2], dtype=torch.float64)
    for b in range(b_size):
        for i in range(sq):
            for j in range(k.shape[2]):
                shift = -g(int(q_pos[b, i]) - int(k_pos[b, j]))
                matrix = rotation_matrix([shift * t for t in theta], dim, layout)
                out[b, :, i, j] = (q[b, :, i] * (k[b, :, j] @ matrix.T)).sum(-1) / math.sqrt(dim)
    return out


RE_CASES = [
    # name, params, (T_max, T'_max) of the seed's Leaky formula: factor k = (T'_max - w) / (T_max - w)
    pytest.param("rerope", {"window": 6}, None, id="rerope-w6"),
    pytest.param("rerope", {"window": 4, "layout": "interleaved", "partial_rotary_factor": 0.5}, None,
                 id="rerope-interleaved-partial"),
    pytest.param("leaky_rerope", {"window": 6, "factor": 4.0}, (10, 22), id="leaky-w6-k4"),
    pytest.param("leaky_rerope", {"window": 3, "factor": 2.5, "layout": "interleaved"}, (7, 13),
                 id="leaky-interleaved"),
]  # fmt: skip


@covers("rerope", "leaky_rerope")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize(("name", "params", "lengths"), RE_CASES)
def test_rerope_scores_equal_naive_relative_rotation(
    name: str, params: dict, lengths: tuple[int, int] | None, causal: bool, mode: str
) -> None:
    window = params["window"]
    if lengths is not None:
        assert params["factor"] == pytest.approx((lengths[1] - window) / (lengths[0] - window))
    scheme = build_scheme(name, CONFIG, params, mode, table_dtype=torch.float64)
    r = _rotary_dim(params)

    def g(t: int) -> float:
        return seed_g(t, window, *(lengths or (None, None)))

    seq = 14  # distances up to 13 cover |t| < w, = w, > w and (Leaky) T'_max - 1
    q = torch.randn(2, 4, seq, 16, dtype=torch.float64)
    k = torch.randn(2, 4, seq, 16, dtype=torch.float64)
    k_pos = torch.arange(seq).unsqueeze(0).expand(2, seq)
    for q_pos, q_rows in ((k_pos, q), (k_pos[:, 10:], q[:, :, 10:])):  # prefill, and 4 decode queries
        got = scheme.scores(q_rows, k, q_pos, k_pos, causal)
        expected = naive_rerope_scores(q_rows, k, q_pos, k_pos, g, params.get("layout", "half"), r)
        allowed = (
            (k_pos.unsqueeze(1) <= q_pos.unsqueeze(2)).unsqueeze(1) if causal else torch.ones_like(got, dtype=bool)
        )
        allowed = allowed.expand_as(got)
        torch.testing.assert_close(got[allowed], expected[allowed], atol=1e-10, rtol=1e-10)
        out = scheme.attend(q_rows, k, k, q_pos, k_pos, causal)
        weights = torch.softmax(expected.masked_fill(~allowed, float("-inf")), dim=-1)
        torch.testing.assert_close(out, weights @ k, atol=1e-10, rtol=1e-10)


@covers("rerope", "leaky_rerope")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_rerope_honours_scale_soft_cap_and_sliding_window(causal: bool) -> None:
    config = dataclasses.replace(CONFIG, attn_scale=0.6, logit_softcap=2.0, sliding_window=5)
    scheme = build_scheme("leaky_rerope", config, {"window": 3, "factor": 2.5}, "dynamic", table_dtype=torch.float64)
    q, k, v = (torch.randn(2, 4, 12, 16, dtype=torch.float64) for _ in range(3))
    positions = torch.arange(12).expand(2, 12)

    def g(t: int) -> float:
        return seed_g(t, 3, 7, 13)  # k = (13 - 3) / (7 - 3) = 2.5

    scores = naive_rerope_scores(q, k, positions, positions, g, "half", 16) * math.sqrt(16) * 0.6
    scores = 2.0 * torch.tanh(scores / 2.0)
    i, j = torch.arange(12).view(-1, 1), torch.arange(12).view(1, -1)
    visible = ((j <= i) & (i - j < 5)) if causal else ((i - j).abs() < 5)
    expected = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v
    torch.testing.assert_close(scheme.attend(q, k, v, positions, positions, causal), expected, atol=1e-10, rtol=1e-10)


@covers("rerope", "leaky_rerope")
def test_rerope_inside_the_window_is_plain_rope_and_far_scores_are_shift_invariant() -> None:
    q = torch.randn(1, 4, 30, 16, dtype=torch.float64)
    k = torch.randn(1, 4, 30, 16, dtype=torch.float64)
    positions = torch.arange(30).unsqueeze(0)
    wide = build_scheme("rerope", CONFIG, {"window": 64}, table_dtype=torch.float64)
    rope = build_scheme("rope", AttentionConfig(hidden_size=64, num_heads=4, head_dim=16), table_dtype=torch.float64)
    qr, kr = rope.rotate(q, k, positions)
    torch.testing.assert_close(wide.scores(q, k, positions, positions, False), qr @ kr.transpose(-1, -2) / 4.0)
    # ReRoPE: every score beyond the window sees the same relative rotation g = w: with one q and one k
    # vector repeated, all far scores of a row are equal.
    narrow = build_scheme("rerope", CONFIG, {"window": 5}, table_dtype=torch.float64)
    same_q, same_k = q[:, :, :1].expand_as(q), k[:, :, :1].expand_as(k)
    scores = narrow.scores(same_q, same_k, positions, positions, True)
    far = scores[0, :, 29, :25]  # distances 29 .. 5 >= w
    torch.testing.assert_close(far, far[:, :1].expand_as(far))


@covers("rerope", "leaky_rerope")
@pytest.mark.parametrize("name", ["rerope", "leaky_rerope"])
def test_rerope_fp32_in_graph_angles_at_long_positions(name: str) -> None:
    """Dynamic float32 mode (exact angles + phase) against the float64 naive reference near position 100000."""
    params = {"window": 5, **({"factor": 8.0} if name == "leaky_rerope" else {})}
    scheme = build_scheme(name, CONFIG, params, "dynamic")
    positions = (100_000 + torch.arange(12)).unsqueeze(0)
    q, k = torch.randn(1, 4, 12, 16), torch.randn(1, 4, 12, 16)
    got = scheme.scores(q, k, positions, positions, False)

    def g(t: int) -> float:
        if name == "rerope":
            return seed_g(t, 5)
        return seed_g(t, 5, 6.0, 13.0)  # k = (13 - 5) / (6 - 5) = 8

    expected = naive_rerope_scores(q.double(), k.double(), positions, positions, g, "half", 16)
    torch.testing.assert_close(got.double(), expected, atol=2e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------------
# RoPE in linear attention, in the numerator only: Su Jianlin 2021, https://kexue.fm/archives/8265, section 线性场景
# --------------------------------------------------------------------------------------------------


def naive_linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool,
    layout: str, rotary_dim: int,
) -> torch.Tensor:  # fmt: skip
    """Σ_j [R_i φ(q_i)]ᵀ [R_j φ(k_j)] v_j / Σ_j φ(q_i)ᵀ φ(k_j), φ = elu + 1, per query i with explicit loops."""
    theta = _theta(rotary_dim)
    b_size, heads, sq, dim = q.shape
    out = torch.zeros(b_size, heads, sq, v.shape[-1], dtype=torch.float64)
    for b in range(b_size):
        for h in range(heads):
            for i in range(sq):
                phi_q = F.elu(q[b, h, i]) + 1
                rq = rotation_matrix([int(q_pos[b, i]) * t for t in theta], dim, layout) @ phi_q
                numerator = torch.zeros(v.shape[-1], dtype=torch.float64)
                denominator = 0.0
                for j in range(k.shape[2]):
                    if causal and k_pos[b, j] > q_pos[b, i]:
                        continue
                    phi_k = F.elu(k[b, h, j]) + 1
                    rk = rotation_matrix([int(k_pos[b, j]) * t for t in theta], dim, layout) @ phi_k
                    numerator += (rq @ rk) * v[b, h, j]
                    denominator += (phi_q @ phi_k).item()
                out[b, h, i] = numerator / denominator
    return out


@covers("rope_linear_attention")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("params", [{}, {"layout": "interleaved", "partial_rotary_factor": 0.5}], ids=["half", "il"])
def test_linear_attention_equals_eq_29_with_loops(params: dict, causal: bool, mode: str) -> None:
    scheme = build_scheme("rope_linear_attention", CONFIG, params, mode, table_dtype=torch.float64)
    q = torch.randn(1, 2, 7, 16, dtype=torch.float64)
    k = torch.randn(1, 2, 9, 16, dtype=torch.float64)
    v = torch.randn(1, 2, 9, 16, dtype=torch.float64)
    k_pos = torch.arange(9).unsqueeze(0)
    q_pos = k_pos[:, 2:]
    got = scheme.attend(q, k, v, q_pos, k_pos, causal)
    expected = naive_linear_attention(q, k, v, q_pos, k_pos, causal, params.get("layout", "half"), _rotary_dim(params))
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)


@covers("rope_linear_attention")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
def test_linear_attention_recurrent_form_equals_quadratic_form(mode: str) -> None:
    scheme = build_scheme("rope_linear_attention", CONFIG, {"layout": "interleaved"}, mode, table_dtype=torch.float64)
    q, k, v = (torch.randn(2, 4, 20, 16, dtype=torch.float64) for _ in range(3))
    positions = torch.arange(20).unsqueeze(0).expand(2, 20)
    torch.testing.assert_close(
        scheme.attend_recurrent(q, k, v, positions), scheme.attend(q, k, v, positions, positions, True)
    )
    fp32 = build_scheme("rope_linear_attention", CONFIG, {"layout": "interleaved"}, mode)
    torch.testing.assert_close(
        fp32.attend_recurrent(q.float(), k.float(), v.float(), positions).double(),
        scheme.attend(q, k, v, positions, positions, True),
        atol=1e-4,
        rtol=1e-4,
    )


@covers("rope_yarn")
def test_yarn_factor_none_is_context_ratio_like_hugging_face() -> None:
    """factor=None means max_position_embeddings / original_max_position_embeddings (transformers' rule)."""
    from posenc import build_scheme
    from tests.conftest import SMALL

    derived = build_scheme("rope_yarn", SMALL, {"factor": None, "original_max_position_embeddings": 16})
    explicit = build_scheme(
        "rope_yarn", SMALL, {"factor": SMALL.max_position_embeddings / 16, "original_max_position_embeddings": 16}
    )
    other = build_scheme("rope_yarn", SMALL, {"factor": 2.0, "original_max_position_embeddings": 16})
    pos = torch.arange(40)[None]
    torch.testing.assert_close(derived.cos_sin(pos), explicit.cos_sin(pos))
    assert not torch.allclose(derived.cos_sin(pos)[0], other.cos_sin(pos)[0])
