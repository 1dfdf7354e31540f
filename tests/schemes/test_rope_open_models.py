"""The rope types of today's open models: proportional RoPE (Gemma 4), NTK-α (HunYuan) and xPos.

References: transformers' ``_compute_proportional_rope_parameters`` and ``Gemma4TextRotaryEmbedding``,
``HunYuanDenseV1RotaryEmbedding`` (its ``compute_ntk_alpha_rope_parameters``), each reached through
``posenc.from_hf_config`` of the model's own config class; for xPos (not in transformers) the scaled rotation of
Sun et al. 2022, "A Length-Extrapolatable Transformer" (arXiv:2212.10554), written out per position and pair, and
torchscale's ``XPOS`` scale ``(arange(0, d, 2) + 0.4 d) / (1.4 d)``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from posenc import (
    AttentionConfig,
    ConfigError,
    PositionError,
    build_scheme,
    from_hf_config,
    functional,
    get_spec,
    rope_types,
)
from tests.conftest import covers
from tests.test_functional import hf_inv_freq, rotation_matrix

LONG = torch.tensor([[0, 1, 4095, 65537, 131000, 131071]])  # up to the 128K context of both models


def _fp32_angle_bound(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """|cos/sin error| of angles computed as float32(position) * float32(inv_freq) (transformers' rotary modules):
    a few float32 roundings of the angle p·f, bounded by p·f·2^-22, plus float32 cos/sin themselves."""
    return positions.double().unsqueeze(-1) * inv_freq.double() * 2.0**-22 + 1e-6


def _check_against_module(
    imported: Any, hf_cos_sin: Any, mode: str, inv_freq_hf: torch.Tensor, layout_slots: torch.Tensor
) -> None:
    """posenc's cos/sin for an imported config against a transformers rotary module ``hf_cos_sin(x, positions)``.

    Short positions: equal to the module (float32 angles are exact enough there). Long positions: posenc's float32
    tables equal its float64 ones (exact angles), and the module is within its own float32-angle error of them.
    ``layout_slots`` picks posenc's r/2 slots out of the module's cat(freqs, freqs) width.
    """
    fp32 = build_scheme(imported.scheme, imported.config, imported.params, mode, max_positions=131072)
    fp64 = build_scheme(imported.scheme, imported.config, imported.params, "dynamic", table_dtype=torch.float64)
    short = torch.arange(64).unsqueeze(0).expand(2, 64)
    for positions, is_short in ((short, True), (LONG, False)):
        hf_cos, hf_sin = hf_cos_sin(torch.zeros(1, dtype=torch.float32), positions)
        ours, exact = fp32.cos_sin(positions), fp64.cos_sin(positions)
        for got, want, theirs in zip(ours, exact, (hf_cos, hf_sin), strict=True):
            assert theirs.shape[-1] == 2 * got.shape[-1]
            torch.testing.assert_close(theirs[..., : got.shape[-1]], theirs[..., got.shape[-1] :])  # cat(f, f)
            theirs = theirs[..., : got.shape[-1]].double()
            if is_short:
                torch.testing.assert_close(got.double(), theirs, atol=3e-5, rtol=0)
            else:
                assert (got.double() - want).abs().max() < 2e-6
                assert ((theirs - want).abs() <= _fp32_angle_bound(positions, inv_freq_hf)[..., layout_slots]).all()


# --------------------------------------------------------------------------------------------------
# Proportional RoPE (Gemma 4)
# --------------------------------------------------------------------------------------------------


@covers("rope_proportional")
@pytest.mark.parametrize(
    ("head_dim", "params"),
    [
        (512, {"rope_theta": 1e6, "partial_rotary_factor": 0.25}),  # Gemma 4's full-attention layers
        (256, {"rope_theta": 1e6, "partial_rotary_factor": 0.25, "factor": 8.0}),
        (10, {"rope_theta": 1e4, "partial_rotary_factor": 0.3}),  # int(0.3 * 10 // 2) = 1 pair of 5
        (64, {"rope_theta": 1e4}),  # p = 1: every pair rotates
    ],
)
def test_proportional_inv_freq_matches_transformers(head_dim: int, params: dict[str, Any]) -> None:
    expected, expected_factor = hf_inv_freq("proportional", head_dim, 4096, params)
    got, factor = functional.rope_inv_freq(head_dim, {"rope_type": "proportional", **params})
    assert got.shape == expected.shape == (head_dim // 2,)
    torch.testing.assert_close(got, expected.double(), rtol=1e-6, atol=0)
    assert torch.equal(got == 0, expected == 0)  # the same pairs are left unrotated
    assert factor == expected_factor == 1.0


def _gemma4_text_config() -> Any:
    transformers = pytest.importorskip("transformers", reason="transformers' Gemma 4 is the reference")
    return transformers.Gemma4TextConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        num_hidden_layers=2,
        max_position_embeddings=131072,
    )


@covers("rope_proportional")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
def test_gemma4_config_imports_as_proportional_rope_with_the_cos_sin_of_transformers(mode: str) -> None:
    """A Gemma 4 text config: the full-attention layers (their own head dim 32) import as rope_proportional,
    the sliding ones as rope; cos/sin equal Gemma4TextRotaryEmbedding's, zero-frequency slots exactly 1 and 0."""
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding

    config = _gemma4_text_config()
    data = config.to_dict()
    sliding = from_hf_config(data, layer_type="sliding_attention")
    assert (sliding.scheme, sliding.config.head_dim, sliding.params) == ("rope", 16, {"rope_theta": 1e4})
    full = from_hf_config(data, layer_type="full_attention")
    assert full.scheme == "rope_proportional"
    assert full.params == {"rope_theta": 1e6, "partial_rotary_factor": 0.25}
    assert (full.config.head_dim, full.config.num_heads, full.config.num_kv_heads) == (32, 4, 2)
    module = Gemma4TextRotaryEmbedding(config)
    inv_freq_hf = module.full_attention_inv_freq
    assert int((inv_freq_hf != 0).sum()) == 4  # int(0.25 * 32 // 2) of 16 pairs rotate

    def hf_cos_sin(x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return module(x, positions, "full_attention")

    _check_against_module(full, hf_cos_sin, mode, inv_freq_hf, torch.arange(16))
    scheme = build_scheme(full.scheme, full.config, full.params, mode, max_positions=64)
    cos, sin = scheme.cos_sin(torch.arange(64).unsqueeze(0))
    assert scheme.rotary_dim == 32
    assert torch.equal(cos[..., 4:], torch.ones_like(cos[..., 4:]))
    assert torch.equal(sin[..., 4:], torch.zeros_like(sin[..., 4:]))


@covers("rope_proportional")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_proportional_rotation_in_low_precision_like_gemma4(dtype: torch.dtype) -> None:
    """Gemma 4 rotates q in the activation dtype with cos/sin cast to it; posenc rotates in float32 and casts.
    Both are within the dtype's tolerance of the float64 rotation."""
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding, apply_rotary_pos_emb

    config = _gemma4_text_config()
    full = from_hf_config(config.to_dict(), layer_type="full_attention")
    scheme = build_scheme(full.scheme, full.config, full.params, "dynamic")
    exact = build_scheme(full.scheme, full.config, full.params, "dynamic", table_dtype=torch.float64)
    positions = torch.tensor([[0, 5, 77, 1000, 30000]])
    q = torch.randn(1, 5, 4, 32)  # Gemma 4 rotates [B, S, H, D]
    hf_cos, hf_sin = Gemma4TextRotaryEmbedding(config)(q.to(dtype), positions, "full_attention")
    theirs = apply_rotary_pos_emb(q.to(dtype), hf_cos, hf_sin, unsqueeze_dim=2).transpose(1, 2)
    q_heads = q.transpose(1, 2)
    ours, _ = scheme.rotate(q_heads.to(dtype), q_heads[:, :2].to(dtype), positions)
    reference, _ = exact.rotate(q_heads.to(dtype).double(), q_heads[:, :2].to(dtype).double(), positions)
    tol = get_spec(full.scheme).tolerance(dtype)
    assert ours.dtype == theirs.dtype == dtype
    for got in (ours, theirs):
        torch.testing.assert_close(got.double(), reference, atol=tol.atol, rtol=tol.rtol)


@covers("rope_proportional")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
@pytest.mark.parametrize(("layout", "proportion", "factor"), [("half", 0.25, 1.0), ("interleaved", 0.5, 3.0)])
def test_proportional_rotation_equals_explicit_matrices(mode: str, layout: str, proportion: float, factor: float):
    """Pair i < int(p·D // 2) rotates by n·θ^(-2i/D)/factor, every other pair of the head dim stays (identity)."""
    config = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=64)
    params = {"layout": layout, "partial_rotary_factor": proportion, "factor": factor}
    scheme = build_scheme("rope_proportional", config, params, mode, table_dtype=torch.float64)
    rotated = int(proportion * 16 // 2)
    positions = torch.tensor([[0, 1, 7, 63], [40, 41, 2, 3]])
    q, k = torch.randn(2, 4, 4, 16, dtype=torch.float64), torch.randn(2, 2, 4, 16, dtype=torch.float64)
    qr, kr = scheme.rotate(q, k, positions)
    for b in range(2):
        for s in range(4):
            n = positions[b, s].item()
            angles = [n * 10000.0 ** (-2 * i / 16) / factor if i < rotated else 0.0 for i in range(8)]
            matrix = rotation_matrix(angles, 16, layout)
            torch.testing.assert_close(qr[b, :, s], q[b, :, s] @ matrix.T, atol=1e-12, rtol=1e-12)
            torch.testing.assert_close(kr[b, :, s], k[b, :, s] @ matrix.T, atol=1e-12, rtol=1e-12)


def test_proportional_bad_values_raise() -> None:
    config = AttentionConfig(hidden_size=64, num_heads=4, max_position_embeddings=64)
    with pytest.raises(ConfigError, match=r"rotates int\(0.1 \* 16 // 2\) = 0 pairs"):
        build_scheme("rope_proportional", config, {"partial_rotary_factor": 0.1})
    with pytest.raises(ConfigError, match=r"factor.*must be >"):
        build_scheme("rope_proportional", config, {"factor": 0.0})
    with pytest.raises(ConfigError, match="partial_rotary_factor <= 1"):
        functional.rope_inv_freq(16, {"rope_type": "proportional", "partial_rotary_factor": 1.5})


# --------------------------------------------------------------------------------------------------
# NTK-α (HunYuan)
# --------------------------------------------------------------------------------------------------


def _hunyuan(head_dim: int, theta: float, alpha: float, **rope: Any) -> tuple[Any, Any]:
    transformers = pytest.importorskip("transformers", reason="transformers' HunYuan is the reference")
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import HunYuanDenseV1RotaryEmbedding

    config = transformers.HunYuanDenseV1Config(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=131072,
        # HunYuan's checkpoints label NTK-α "dynamic" and carry YaRN-style keys beside alpha
        rope_parameters={"rope_type": "dynamic", "alpha": alpha, "rope_theta": theta, "factor": 1.0, **rope},
    )
    return config, HunYuanDenseV1RotaryEmbedding(config)


@covers("rope_ntk_alpha")
@pytest.mark.parametrize(("head_dim", "theta", "alpha"), [(128, 1e4, 1000.0), (16, 1e4, 50.0), (64, 5e5, 1.5)])
def test_ntk_alpha_inv_freq_matches_hunyuan(head_dim: int, theta: float, alpha: float) -> None:
    _, module = _hunyuan(head_dim, theta, alpha)
    assert module.rope_type == "ntk_alpha"
    for labelled in ({"rope_type": "ntk_alpha"}, {"rope_type": "dynamic", "factor": 1.0}, {"type": "dynamic"}):
        got, factor = functional.rope_inv_freq(head_dim, {**labelled, "alpha": alpha, "rope_theta": theta})
        torch.testing.assert_close(got, module.inv_freq.double(), rtol=2e-6, atol=0)  # HF's float32 pow
        assert factor == module.attention_scaling == 1.0
    stretched = theta * alpha ** (head_dim / (head_dim - 2))  # the base θ·α^(d/(d-2)), d = head_dim = rotary dim
    expected = torch.tensor([stretched ** (-2 * i / head_dim) for i in range(head_dim // 2)], dtype=torch.float64)
    torch.testing.assert_close(got, expected, rtol=1e-13, atol=0)
    assert rope_types.rope_type_name({"rope_type": "dynamic", "alpha": 0.0, "factor": 2.0}) == "dynamic"  # no alpha


@covers("rope_ntk_alpha")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
def test_hunyuan_config_imports_as_ntk_alpha_with_the_cos_sin_of_transformers(mode: str) -> None:
    config, module = _hunyuan(16, 1e4, 1000.0, factor=1.0, beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0)
    imported = from_hf_config(config.to_dict())
    assert imported.scheme == "rope_ntk_alpha"
    assert imported.params == {"rope_theta": 1e4, "alpha": 1000.0}  # the YaRN-style keys are not NTK-α's
    assert (imported.config.head_dim, imported.config.num_kv_heads) == (16, 2)
    legacy = from_hf_config(
        {**config.to_dict(), "rope_parameters": None, "rope_scaling": {"type": "dynamic", "alpha": 1000.0}}
    )
    assert (legacy.scheme, legacy.params) == ("rope_ntk_alpha", {"rope_theta": 1e4, "alpha": 1000.0})
    _check_against_module(imported, module, mode, module.inv_freq, torch.arange(8))


@covers("rope_ntk_alpha")
def test_ntk_alpha_rotation_in_bf16_like_hunyuan() -> None:
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import apply_rotary_pos_emb

    config, module = _hunyuan(16, 1e4, 1000.0)
    imported = from_hf_config(config.to_dict())
    scheme = build_scheme(imported.scheme, imported.config, imported.params, "dynamic")
    exact = build_scheme(imported.scheme, imported.config, imported.params, "dynamic", table_dtype=torch.float64)
    positions = torch.tensor([[0, 3, 500, 9000, 120000]])
    q, k = torch.randn(1, 4, 5, 16).bfloat16(), torch.randn(1, 2, 5, 16).bfloat16()
    cos, sin = module(q, positions)
    theirs = apply_rotary_pos_emb(q, k, cos, sin)
    ours = scheme.rotate(q, k, positions)
    reference = exact.rotate(q.double(), k.double(), positions)
    tol = get_spec("rope_ntk_alpha").tolerance("bfloat16")
    for got in (*ours, *theirs):
        assert got.dtype == torch.bfloat16
    for got, want in zip((*ours, *theirs), (*reference, *reference), strict=True):
        torch.testing.assert_close(got.double(), want, atol=tol.atol, rtol=tol.rtol)


def test_ntk_alpha_bad_values_raise() -> None:
    with pytest.raises(ConfigError, match=r"alpha.*must be >"):
        build_scheme("rope_ntk_alpha", AttentionConfig(hidden_size=64, num_heads=4), {"alpha": -2.0})
    with pytest.raises(ConfigError, match="needs 'alpha'"):
        functional.rope_inv_freq(16, {"rope_type": "ntk_alpha"})
    with pytest.raises(ConfigError, match="rotary_dim > 2"):
        functional.rope_inv_freq(2, {"rope_type": "ntk_alpha", "alpha": 4.0})


# --------------------------------------------------------------------------------------------------
# xPos (Sun et al. 2022)
# --------------------------------------------------------------------------------------------------

XPOS_CONFIG = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=64)


def xpos_naive(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, layout: str, params: dict[str, Any],
               sign: int) -> torch.Tensor:  # fmt: skip
    """The paper's f_q (sign +1) / f_k (sign -1) element by element: pair i of the row at position n rotated by
    n·θ_i, θ_i = 10000^(-2i/r), and scaled by ζ_i^(sign·n/γ), ζ_i = (2i/r + γ')/(1 + γ')."""
    gamma_base, gamma = params.get("scale_base", 512.0), params.get("scale_gamma", 0.4)
    out = x.clone()
    batch, heads, seq, _ = x.shape
    half = rotary_dim // 2
    for b in range(batch):
        for s in range(seq):
            n = int(positions[b, s])
            for i in range(half):
                zeta = (2 * i / rotary_dim + gamma) / (1 + gamma)
                scale = zeta ** (sign * n / gamma_base)
                angle = n * 10000.0 ** (-2 * i / rotary_dim)
                first, second = (i, i + half) if layout == "half" else (2 * i, 2 * i + 1)
                for h in range(heads):
                    a, c = float(x[b, h, s, first]), float(x[b, h, s, second])
                    out[b, h, s, first] = scale * (a * math.cos(angle) - c * math.sin(angle))
                    out[b, h, s, second] = scale * (c * math.cos(angle) + a * math.sin(angle))
    return out


@covers("rope_xpos")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
@pytest.mark.parametrize(
    "params",
    [{}, {"layout": "interleaved", "scale_base": 16.0}, {"partial_rotary_factor": 0.5, "scale_gamma": 0.1}],
    ids=["default", "interleaved", "partial"],
)
def test_xpos_equals_the_paper_formula_per_position_and_pair(mode: str, params: dict[str, Any]) -> None:
    scheme = build_scheme("rope_xpos", XPOS_CONFIG, params, mode, table_dtype=torch.float64)
    resolved = get_spec("rope_xpos").resolve(params)
    r = int(16 * resolved["partial_rotary_factor"])
    positions = torch.tensor([[0, 1, 5, 63], [40, 41, 2, 30]])
    q, k = torch.randn(2, 4, 4, 16, dtype=torch.float64), torch.randn(2, 2, 4, 16, dtype=torch.float64)
    qr, kr = scheme.rotate(q, k, positions)
    torch.testing.assert_close(qr, xpos_naive(q, positions, r, resolved["layout"], params, +1), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(kr, xpos_naive(k, positions, r, resolved["layout"], params, -1), atol=1e-12, rtol=1e-12)


@covers("rope_xpos")
def test_xpos_scale_is_torchscales() -> None:
    """torchscale's XPOS: ``scale = (torch.arange(0, head_dim, 2) + 0.4 * head_dim) / (1.4 * head_dim)``, applied as
    ``scale ** (position / scale_base)`` (scale_base 512)."""
    head_dim = 64
    torchscale = (torch.arange(0, head_dim, 2, dtype=torch.float64) + 0.4 * head_dim) / (1.4 * head_dim)
    rate = rope_types.get("xpos").scale_rate(head_dim, {})
    torch.testing.assert_close(torch.exp(rate * 1000), torchscale ** (1000 / 512), rtol=1e-13, atol=0)


@covers("rope_xpos")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
def test_xpos_scores_depend_only_on_distance_and_decay_with_it(mode: str) -> None:
    """The same q and k at every position: q_m·k_n is a function of m - n (Toeplitz scores), and equals RoPE's score
    with pair i's contribution weighted by ζ_i^((m-n)/γ), which shrinks as m - n grows."""
    scale_base = 32.0
    xpos = build_scheme("rope_xpos", XPOS_CONFIG, {"scale_base": scale_base}, mode, max_positions=4200,
                        table_dtype=torch.float64)  # fmt: skip
    rope = build_scheme("rope", XPOS_CONFIG, {}, mode, max_positions=4200, table_dtype=torch.float64)
    zeta = torch.tensor([(2 * i / 16 + 0.4) / 1.4 for i in range(8)], dtype=torch.float64)
    q = torch.randn(1, 4, 1, 16, dtype=torch.float64).expand(1, 4, 40, 16)
    k = torch.randn(1, 2, 1, 16, dtype=torch.float64).expand(1, 2, 40, 16)
    distance = torch.arange(40).unsqueeze(1) - torch.arange(40)  # m - n
    for start in (0, 4100):
        positions = torch.arange(start, start + 40).unsqueeze(0)
        qx, kx = xpos.rotate(q, k, positions)
        scores = qx[:, :2] @ kx.transpose(-1, -2)
        torch.testing.assert_close(scores[..., 1:, 1:], scores[..., :-1, :-1], atol=1e-10, rtol=1e-10)
        qr, kr = rope.rotate(q, k, positions)
        pair_scores = (qr[:, :2, :, None, :] * kr[:, :, None, :, :]).view(1, 2, 40, 40, 2, 8).sum(-2)
        weights = zeta ** (distance.double().unsqueeze(-1) / scale_base)
        torch.testing.assert_close(scores, (pair_scores * weights).sum(-1), atol=1e-10, rtol=1e-10)
    norms = qx[..., :8].pow(2) + qx[..., 8:].pow(2)  # per pair |q'_i(n)|^2 = ζ_i^(2n/γ) |q_i|^2: shrinks with n
    assert (norms[..., 1:, :] < norms[..., :-1, :]).all()


@covers("rope_xpos")
def test_xpos_fp32_tables_stay_accurate_up_to_their_position_limit() -> None:
    """In-graph float32 tables against float64 at long positions; the limit is where exp(±λn) leaves float32."""
    config = AttentionConfig(hidden_size=256, num_heads=2, head_dim=128, max_position_embeddings=4096)
    fp32 = build_scheme("rope_xpos", config, table_mode="dynamic")
    fp64 = build_scheme("rope_xpos", config, table_mode="dynamic", table_dtype=torch.float64)
    zeta0 = 0.4 / 1.4
    limit = int(-math.log(torch.finfo(torch.float32).tiny) * 512 / -math.log(zeta0)) + 1
    assert fp32.scale_limit == fp32.position_limit == limit == 35695
    positions = torch.tensor([[0, 1, 4095, 20000, 35000, limit - 1]])
    for ours, exact in ((fp32.cos_sin, fp64.cos_sin), (fp32.key_cos_sin, fp64.key_cos_sin)):
        want_cos, want_sin = exact(positions)
        scale = torch.hypot(want_cos, want_sin)  # ζ^(±n/γ): from 1e-38 to 1e38 over these positions
        for got, want in zip(ours(positions), (want_cos, want_sin), strict=True):
            assert torch.isfinite(got).all()
            assert ((got.double() - want).abs() <= 1e-5 * scale).all()  # relative to the scale at each n
    with pytest.raises(PositionError, match=f"position {limit} is past {limit - 1}.*raise scale_base"):
        fp32.cos_sin(torch.tensor([[limit]]))
    with pytest.raises(ConfigError, match=f"use max_positions <= {limit}"):
        build_scheme("rope_xpos", config, table_mode="precomputed", max_positions=131072)
    wide = build_scheme("rope_xpos", config, {"scale_base": 2048.0}, table_mode="precomputed", max_positions=131072)
    assert wide.position_limit == 131072


def test_xpos_bad_values_raise() -> None:
    with pytest.raises(ConfigError, match=r"scale_base.*must be >"):
        build_scheme("rope_xpos", XPOS_CONFIG, {"scale_base": 0.0})
    with pytest.raises(ConfigError, match=r"scale_gamma.*must be >"):
        build_scheme("rope_xpos", XPOS_CONFIG, {"scale_gamma": -0.5})
    with pytest.raises(ConfigError, match="scale_gamma must be a finite number > 0"):
        functional.rope_inv_freq(16, {"rope_type": "xpos", "scale_gamma": 0.0})


def test_xpos_is_not_a_transformers_type_and_the_kernel_declines_it() -> None:
    from posenc.plugins.rope import freq_inputs

    assert "xpos" not in rope_types.transformers_schemes()
    with pytest.raises(ConfigError, match="different cos/sin"):
        freq_inputs(16, {"rope_type": "xpos"})
