"""posenc.functional against independent references.

References: Hugging Face transformers (``ROPE_INIT_FUNCTIONS``, T5 ``_relative_position_bucket``, DeBERTa-v2
``make_log_bucket_position``, BLOOM ``build_alibi_tensor``), the formulas and code of the papers and posts named
beside each test (explicit 2x2 rotation matrices, the complex-number form, ``rotate_half``, the T5 bucket table,
NTK's α), naive loops, and high-precision (mpmath) trigonometry.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from posenc import functional
from posenc.errors import ConfigError, PositionError
from tests.conftest import covers

# --------------------------------------------------------------------------------------------------
# Independent references shared with tests/schemes/test_rope.py
# --------------------------------------------------------------------------------------------------


def rotation_matrix(angles: list[float] | torch.Tensor, dim: int, layout: str) -> torch.Tensor:
    """Explicit float64 ``[dim, dim]`` RoPE matrix R with R @ x the rotated vector (the block-diagonal
    matrix of Su et al., RoFormer, 2021, arXiv:2104.09864).

    ``angles[i]`` rotates pair i: (2i, 2i+1) for ``interleaved``, (i, i + r/2) for ``half``; features past
    ``r = 2 * len(angles)`` are left alone (identity block).
    """
    angles = [float(a) for a in angles]
    half = len(angles)
    matrix = torch.eye(dim, dtype=torch.float64)
    for i, angle in enumerate(angles):
        a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + half)
        c, s = math.cos(angle), math.sin(angle)
        matrix[a, a], matrix[a, b] = c, -s
        matrix[b, a], matrix[b, b] = s, c
    return matrix


def hf_inv_freq(
    rope_type: str, head_dim: int, max_position_embeddings: int, params: dict[str, Any], seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """Hugging Face transformers' (inv_freq, attention_factor) for a LlamaConfig with these rope_parameters."""
    pytest.importorskip("transformers", reason="transformers is the upstream reference (pip install transformers)")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters={"rope_type": rope_type, **params},
    )
    if rope_type == "default":
        inv_freq, factor = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        inv_freq, factor = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)
    return inv_freq, float(factor)


def mp_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of position * inv_freq (float64 inv_freq taken as exact) with 40-digit mpmath arithmetic."""
    mpmath = pytest.importorskip("mpmath", reason="mpmath (ships with sympy) is the high-precision reference")
    mpmath.mp.dps = 40
    freqs = [mpmath.mpf(float(f)) for f in inv_freq]
    cos, sin = [], []
    for p in positions.tolist():
        angles = [mpmath.mpf(int(p)) * f for f in freqs]
        cos.append([float(mpmath.cos(a)) for a in angles])
        sin.append([float(mpmath.sin(a)) for a in angles])
    return torch.tensor(cos, dtype=torch.float64), torch.tensor(sin, dtype=torch.float64)


# --------------------------------------------------------------------------------------------------
# rope_inv_freq vs Hugging Face transformers
# --------------------------------------------------------------------------------------------------

_LONG = [1.0 + 0.25 * i for i in range(16)]  # 16 = head_dim 32 // 2
_SHORT = [1.0 + 0.01 * i for i in range(16)]

HF_CASES = [
    pytest.param("default", 64, 2048, {"rope_theta": 10000.0}, None, id="default"),
    pytest.param("linear", 64, 2048, {"rope_theta": 10000.0, "factor": 4.0}, None, id="linear"),
    pytest.param("linear", 128, 4096, {"rope_theta": 5e5, "factor": 2.5, "partial_rotary_factor": 0.5}, None,
                 id="linear-partial"),
    pytest.param("dynamic", 64, 1024, {"rope_theta": 10000.0, "factor": 2.0}, None, id="dynamic-init"),
    pytest.param("dynamic", 64, 1024, {"rope_theta": 10000.0, "factor": 2.0}, 300, id="dynamic-below-max"),
    pytest.param("dynamic", 64, 1024, {"rope_theta": 10000.0, "factor": 2.0}, 1024, id="dynamic-at-max"),
    pytest.param("dynamic", 64, 1024, {"rope_theta": 10000.0, "factor": 2.0}, 3079, id="dynamic-above-max"),
    pytest.param("dynamic", 80, 512, {"rope_theta": 1e6, "factor": 4.0, "partial_rotary_factor": 0.25}, 5000,
                 id="dynamic-partial-above-max"),
    pytest.param("yarn", 64, 4096, {"rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 1024},
                 None, id="yarn-defaults"),
    pytest.param("yarn", 128, 131072,
                 {"rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768}, None,
                 id="yarn-qwen2"),
    pytest.param("yarn", 64, 4096,
                 {"rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 1024, "truncate": False},
                 None, id="yarn-truncate-false"),
    pytest.param("yarn", 64, 163840,
                 {"rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
                  "mscale_all_dim": 0.8}, None, id="yarn-mscale"),
    pytest.param("yarn", 64, 4096,
                 {"rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 1024,
                  "attention_factor": 0.8, "beta_fast": 16.0, "beta_slow": 2.0}, None,
                 id="yarn-attention-factor-betas"),
    pytest.param("yarn", 64, 8192,
                 {"rope_theta": 10000.0, "factor": None, "original_max_position_embeddings": 2048}, None,
                 id="yarn-factor-derived"),
    pytest.param("yarn", 96, 8192,
                 {"rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 1024,
                  "partial_rotary_factor": 0.5}, None, id="yarn-partial"),
    pytest.param("longrope", 32, 8192,
                 {"rope_theta": 10000.0, "short_factor": _SHORT, "long_factor": _LONG,
                  "original_max_position_embeddings": 1024}, None, id="longrope-short-init"),
    pytest.param("longrope", 32, 8192,
                 {"rope_theta": 10000.0, "short_factor": _SHORT, "long_factor": _LONG,
                  "original_max_position_embeddings": 1024}, 1024, id="longrope-short-at-switch"),
    pytest.param("longrope", 32, 8192,
                 {"rope_theta": 10000.0, "short_factor": _SHORT, "long_factor": _LONG,
                  "original_max_position_embeddings": 1024}, 1025, id="longrope-long"),
    pytest.param("longrope", 32, 8192,
                 {"rope_theta": 10000.0, "short_factor": _SHORT, "long_factor": _LONG, "factor": 2.0,
                  "original_max_position_embeddings": 1024}, 5000, id="longrope-explicit-factor"),
    pytest.param("longrope", 32, 8192,
                 {"rope_theta": 10000.0, "short_factor": _SHORT, "long_factor": _LONG, "attention_factor": 1.3,
                  "original_max_position_embeddings": 1024}, 5000, id="longrope-explicit-attention-factor"),
    pytest.param("longrope", 64, 8192,
                 {"rope_theta": 10000.0, "short_factor": _SHORT, "long_factor": _LONG,
                  "original_max_position_embeddings": 1024, "partial_rotary_factor": 0.5}, 4000,
                 id="longrope-partial"),
    pytest.param("llama3", 128, 131072,
                 {"rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}, None, id="llama3.1"),
    pytest.param("llama3", 64, 8192,
                 {"rope_theta": 10000.0, "factor": 32.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
                  "original_max_position_embeddings": 512, "partial_rotary_factor": 0.5}, None,
                 id="llama3-partial"),
]  # fmt: skip


@covers("rope", "rope_linear", "rope_dynamic", "rope_yarn", "rope_longrope", "rope_llama3")
@pytest.mark.parametrize(("rope_type", "head_dim", "max_pos", "params", "seq_len"), HF_CASES)
def test_rope_inv_freq_matches_hugging_face(
    rope_type: str, head_dim: int, max_pos: int, params: dict[str, Any], seq_len: int | None
) -> None:
    expected, expected_factor = hf_inv_freq(rope_type, head_dim, max_pos, params, seq_len)
    rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    ours = {"rope_type": rope_type, "max_position_embeddings": max_pos, **params}
    got, factor = functional.rope_inv_freq(rotary_dim, ours, seq_len=seq_len)
    assert got.dtype == torch.float64
    assert got.shape == expected.shape == (rotary_dim // 2,)
    torch.testing.assert_close(got, expected.double(), rtol=1e-6, atol=0)  # HF computes in float32
    assert factor == pytest.approx(expected_factor, rel=1e-12)


@covers("rope_yarn")
def test_yarn_with_deepseek_mscales_and_no_truncation_matches_hugging_face() -> None:
    """DeepSeek-style mscale / mscale_all_dim with truncate=False (fractional correction range).

    transformers computes the ramp weights in float32 (error ~1e-7 each); with factor 40 a weight error moves a
    blended frequency by up to ~1e-7 of its extrapolated value, so the bound is 1e-6 of that value.
    """
    params = {"rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 0.707,
              "mscale_all_dim": 1.0, "truncate": False, "beta_fast": 24.0, "beta_slow": 2.0}  # fmt: skip
    expected, expected_factor = hf_inv_freq("yarn", 64, 163840, params)
    got, factor = functional.rope_inv_freq(64, {"rope_type": "yarn", "max_position_embeddings": 163840, **params})
    extrapolated, _ = functional.rope_inv_freq(64, {"rope_theta": 10000.0})
    assert ((got - expected.double()).abs() <= 1e-6 * extrapolated).all()
    assert factor == pytest.approx(expected_factor, rel=1e-12)
    assert factor == pytest.approx((0.1 * 0.707 * math.log(40.0) + 1) / (0.1 * math.log(40.0) + 1), rel=1e-12)
    truncated, _ = functional.rope_inv_freq(64, {"rope_type": "yarn", "max_position_embeddings": 163840, **params,
                                         "truncate": True})  # fmt: skip
    assert not torch.allclose(got, truncated, rtol=1e-6, atol=0)


_LENGTH_DEPENDENT = {
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 16, "partial_rotary_factor": 0.5},
    "longrope": {"rope_type": "longrope", "original_max_position_embeddings": 16, "factor": 4.0,
                 "short_factor": _SHORT[:8], "long_factor": _LONG[:8]},
}  # fmt: skip


@covers("rope_dynamic", "rope_longrope")
@pytest.mark.parametrize("name", list(_LENGTH_DEPENDENT))
def test_length_dependent_types_take_a_tensor_length_inside_an_exported_program(name: str) -> None:
    """One definition: the eager int path and the traced tensor path agree at lengths the trace never saw."""
    params = _LENGTH_DEPENDENT[name]

    class Frequencies(torch.nn.Module):
        def forward(self, positions: torch.Tensor) -> torch.Tensor:
            return functional.rope_inv_freq(16, params, seq_len=positions.max() + 1)[0]

    sample = torch.arange(5).unsqueeze(0)
    program = torch.export.export(Frequencies(), (sample,), dynamic_shapes=({1: torch.export.Dim("seq")},))
    for length in (5, 16, 17, 100, 4000):
        got = program.module()(torch.arange(length).unsqueeze(0))
        expected, _ = functional.rope_inv_freq(16, params, seq_len=length)
        torch.testing.assert_close(got, expected, rtol=1e-14, atol=0)
        eager, _ = functional.rope_inv_freq(16, params, seq_len=torch.tensor(length))
        torch.testing.assert_close(eager, expected, rtol=1e-14, atol=0)
    with pytest.raises(ConfigError, match="tensor seq_len must hold one integer"):
        functional.rope_inv_freq(16, params, seq_len=torch.tensor(5.0))


@covers("rope_llama3")
def test_llama3_bands_meet_at_their_edges() -> None:
    """Llama 3.1's rule per frequency (wavelength < L/high kept, > L/low divided by the factor, a linear blend in
    1/wavelength between), with both band edges placed exactly on wavelengths of the spectrum: the blend equals
    the neighbouring band there (continuity), and every other frequency follows its band."""
    r, theta, factor = 64, 10000.0, 8.0
    default, _ = functional.rope_inv_freq(r, {"rope_theta": theta})
    wavelength = [2 * math.pi / f for f in default.tolist()]
    original = wavelength[20]  # low_freq_factor 1: the low edge L / low is wavelength 20 exactly
    high = original / wavelength[10]  # the high edge L / high is wavelength 10 (to the last bit or so)
    params = {"rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": 1.0,
              "high_freq_factor": high, "original_max_position_embeddings": original}  # fmt: skip
    got, scale = functional.rope_inv_freq(r, params)
    assert scale == 1.0
    assert got[20].item() == pytest.approx(default[20].item() / factor, rel=1e-12)
    assert got[10].item() == pytest.approx(default[10].item(), rel=1e-12)
    for i, (freq, wave) in enumerate(zip(default.tolist(), wavelength, strict=True)):
        if i < 10:
            assert got[i].item() == freq, i
        elif i > 20:
            assert got[i].item() == pytest.approx(freq / factor, rel=1e-14), i
        else:
            smooth = (original / wave - 1.0) / (high - 1.0)
            assert got[i].item() == pytest.approx((1 - smooth) * freq / factor + smooth * freq, rel=1e-12), i
            assert freq / factor - 1e-18 <= got[i].item() <= freq + 1e-18


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"rope_type": "yarn", "rope_theta": 1.0, "factor": 4.0, "original_max_position_embeddings": 64},
         r"rope_theta > 1"),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": -1.0},
         "beta_fast must be"),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0},
         "original_max_position_embeddings must be"),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "attention_factor": 0.0},
         "attention_factor must be"),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale": 1.0,
          "mscale_all_dim": -10.0}, "both terms > 0"),
        ({"rope_type": "longrope", "original_max_position_embeddings": 1, "factor": 4.0, "short_factor": [1.0] * 4,
          "long_factor": [2.0] * 4}, r"ln\(1\) = 0"),
        ({"rope_type": "longrope", "original_max_position_embeddings": 8, "factor": 4.0, "short_factor": "1,2,3,4",
          "long_factor": [2.0] * 4}, "short_factor must be a list"),
        ({"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 0}, "max_position_embeddings must be"),
        ({"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 10.5}, "must be an int >= 1"),
        ({"rope_type": "truncation", "truncation_a": "x", "truncation_c": 0.1, "truncation_beta": 0.05},
         "truncation_a must be a number"),
        ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": -1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}, "low_freq_factor must be"),
    ],
    ids=["yarn-theta-1", "yarn-beta", "yarn-original-0", "yarn-attention-0", "yarn-mscale", "longrope-original-1",
         "longrope-string", "dynamic-max-0", "dynamic-max-fraction", "truncation-string", "llama3-low"],
)  # fmt: skip
def test_degenerate_parameters_raise_config_errors(params: dict[str, Any], message: str) -> None:
    """Values whose formulas divide by zero or take log of <= 0 upstream (ZeroDivisionError, math domain error)."""
    with pytest.raises(ConfigError, match=message):
        functional.rope_inv_freq(8, params)


def test_dynamic_changes_frequencies_only_above_max_position_embeddings() -> None:
    params = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 1024}
    base, _ = functional.rope_inv_freq(64)
    below, _ = functional.rope_inv_freq(64, params, seq_len=1000)
    above, _ = functional.rope_inv_freq(64, params, seq_len=1025)
    torch.testing.assert_close(below, base, rtol=1e-15, atol=0)
    assert (above[1:] < base[1:]).all()


@covers("rope_ntk")
@pytest.mark.parametrize(("rotary_dim", "factor", "theta"), [(128, 8.0, 10000.0), (64, 4.0, 5e5), (16, 2.5, 1e4)])
def test_static_ntk_lowest_frequency_equals_interpolation(rotary_dim: int, factor: float, theta: float) -> None:
    """NTK-aware scaling (bloc97, r/LocalLLaMA, 2023; Su Jianlin, https://kexue.fm/archives/9675): α = k^(d/(d-2))
    makes n / (αβ)^(d/2-1) equal (n/k) / β^(d/2-1); the highest frequency stays."""
    default, _ = functional.rope_inv_freq(rotary_dim, {"rope_theta": theta})
    ntk, scale = functional.rope_inv_freq(rotary_dim, {"rope_type": "ntk", "rope_theta": theta, "factor": factor})
    assert scale == 1.0
    assert ntk[-1].item() == pytest.approx(default[-1].item() / factor, rel=1e-12)
    assert ntk[0].item() == default[0].item() == 1.0
    assert (ntk[1:] < default[1:]).all()
    assert (ntk[1:-1] > default[1:-1] / factor).all()
    # bloc97's code (NTK-Aware Scaled RoPE, r/LocalLLaMA, 2023): base * k**(dim / (dim - 2)), then the default
    # frequencies of that base.
    seed_base = theta * factor ** (rotary_dim / (rotary_dim - 2))
    seed = [1.0 / seed_base ** (2 * i / rotary_dim) for i in range(rotary_dim // 2)]
    torch.testing.assert_close(ntk, torch.tensor(seed, dtype=torch.float64), rtol=1e-13, atol=0)


@covers("rope_ntk")
def test_static_ntk_equals_hugging_face_dynamic_at_k_times_the_context() -> None:
    """HF dynamic NTK with factor 1 at length k * M uses base * k**(d/(d-2)): static NTK with factor k."""
    expected, _ = hf_inv_freq("dynamic", 64, 512, {"rope_theta": 10000.0, "factor": 1.0}, seq_len=4 * 512)
    got, _ = functional.rope_inv_freq(64, {"rope_type": "ntk", "factor": 4.0})
    torch.testing.assert_close(got, expected.double(), rtol=1e-6, atol=0)


@covers("rope_truncation")
def test_base_truncation_follows_the_a_c_beta_rule() -> None:
    """Base truncation (Pal et al., Giraffe, 2023, arXiv:2308.10882; in Zhao et al.'s book 大语言模型, 2024,
    https://llmbook-zh.github.io, §5.4): h(i) = θ_i if θ_i >= c; β if a < θ_i < c; 0 if θ_i <= a."""
    r, theta, a, c, beta = 64, 10000.0, 2e-3, 0.05, 0.02  # no θ_i falls exactly on a or c
    params = {"rope_type": "truncation", "rope_theta": theta, "truncation_a": a, "truncation_c": c,
              "truncation_beta": beta}  # fmt: skip
    got, scale = functional.rope_inv_freq(r, params)
    expected = []
    for i in range(r // 2):
        t = theta ** (-2 * i / r)
        expected.append(t if t >= c else beta if t > a else 0.0)
    assert scale == 1.0
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-14, atol=0)
    assert {0.0, beta} <= set(got.tolist())
    assert got[0] == 1.0


# --------------------------------------------------------------------------------------------------
# Tables and angles: accuracy at long positions
# --------------------------------------------------------------------------------------------------

LONG_POSITIONS = torch.tensor(
    [
        0,
        1,
        2,
        4095,
        4096,
        4097,
        65535,
        65536,
        100003,
        131071,
        131072,
        1 << 20,
        3000017,
        2**24 - 2,
        2**24 - 1,
        *torch.randint(0, 2**24, (40,), generator=torch.Generator().manual_seed(7)).tolist(),
    ]
)


@pytest.mark.parametrize(("rotary_dim", "theta"), [(128, 10000.0), (128, 5e5), (96, 1e6)])
def test_tables_and_exact_angles_are_accurate_at_long_positions(rotary_dim: int, theta: float) -> None:
    inv_freq, _ = functional.rope_inv_freq(rotary_dim, {"rope_theta": theta})
    ref_cos, ref_sin = mp_cos_sin(LONG_POSITIONS, inv_freq)

    cos, sin = functional.rope_cos_sin(LONG_POSITIONS, inv_freq)
    assert cos.dtype == torch.float32
    assert cos.shape == (len(LONG_POSITIONS), rotary_dim // 2)
    assert (cos.double() - ref_cos).abs().max() < 2e-6
    assert (sin.double() - ref_sin).abs().max() < 2e-6
    cos64, sin64 = functional.rope_cos_sin(LONG_POSITIONS, inv_freq, dtype=torch.float64)
    assert (cos64 - ref_cos).abs().max() < 1e-8
    assert (sin64 - ref_sin).abs().max() < 1e-8

    angles = functional.exact_angles(LONG_POSITIONS, functional.split_turns(inv_freq))
    assert angles.dtype == torch.float32
    assert (angles.cos().double() - ref_cos).abs().max() < 2e-6
    assert (angles.sin().double() - ref_sin).abs().max() < 2e-6

    # The reference can tell: naive float32 angles are far off already at 131072.
    upto = LONG_POSITIONS <= 131072
    naive = LONG_POSITIONS[upto].float().unsqueeze(-1) * inv_freq.float()
    assert (naive.cos().double() - ref_cos[upto]).abs().max() > 1e-4


def test_exact_angles_worst_case_over_many_positions() -> None:
    """Float64 reference with an exact 26-bit split (p * hi is exact for p < 2**27); 40k positions."""
    inv_freq, _ = functional.rope_inv_freq(128, {"rope_theta": 10000.0})
    positions = torch.randint(0, 2**24, (40_000,), generator=torch.Generator().manual_seed(3))
    turns = inv_freq / (2 * math.pi)
    hi = torch.round(turns * 2**26) / 2**26
    p = positions.double().unsqueeze(-1)
    reference = 2 * math.pi * torch.frac(torch.frac(p * hi) + p * (turns - hi))
    angles = functional.exact_angles(positions, functional.split_turns(inv_freq))
    # Measured 8.3e-7; sums of fractions in [0, 2) instead of [-0.5, 0.5] reach 1.9e-6 here.
    assert (angles.cos().double() - reference.cos()).abs().max() < 1.5e-6
    assert (angles.sin().double() - reference.sin()).abs().max() < 1.5e-6


def test_rope_cos_sin_shape_and_attention_factor() -> None:
    inv_freq, _ = functional.rope_inv_freq(16)
    positions = torch.arange(12).view(2, 6)
    cos, sin = functional.rope_cos_sin(positions, inv_freq, attention_factor=1.25, dtype=torch.float64)
    assert cos.shape == sin.shape == (2, 6, 8)
    angles = positions.double().unsqueeze(-1) * inv_freq
    torch.testing.assert_close(cos, 1.25 * angles.cos())
    torch.testing.assert_close(sin, 1.25 * angles.sin())


# --------------------------------------------------------------------------------------------------
# apply_rope: rotation matrices, complex form, rotate_half, relative property
# --------------------------------------------------------------------------------------------------


def _llama_post_theta(dim: int, base: float = 10000.0) -> torch.Tensor:
    # "Llama旋转位置编码代码实现及详解" (https://blog.csdn.net/weixin_40732165/article/details/143635503):
    # theta = 1/(base ** (torch.arange(0, dim/2).float() / (dim / 2))), here in float64
    return 1.0 / (base ** (torch.arange(0, dim // 2, dtype=torch.float64) / (dim / 2)))


@covers("rope")
@pytest.mark.parametrize(
    ("layout", "dim", "rotary_dim"), [("interleaved", 8, 8), ("half", 8, 8), ("interleaved", 12, 8), ("half", 12, 4)]
)
def test_apply_rope_equals_explicit_rotation_matrices(layout: str, dim: int, rotary_dim: int) -> None:
    """RoFormer's block-diagonal 2x2 rotations (arXiv:2104.09864) for each position, features past r untouched."""
    x = torch.randn(3, 5, dim, dtype=torch.float64)
    positions = torch.tensor([0, 1, 7, 100, 4099])
    inv_freq, _ = functional.rope_inv_freq(rotary_dim)
    cos, sin = functional.rope_cos_sin(positions, inv_freq, dtype=torch.float64)
    got = functional.apply_rope(x, cos, sin, layout, rotary_dim)
    for s, p in enumerate(positions.tolist()):
        matrix = rotation_matrix(p * inv_freq, dim, layout)
        torch.testing.assert_close(got[:, s], x[:, s] @ matrix.T, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(got[..., rotary_dim:], x[..., rotary_dim:], atol=0, rtol=0)


@covers("rope")
def test_interleaved_equals_elementwise_form_of_eq_23() -> None:
    """RoFormer's efficient form (arXiv:2104.09864): q ⊗ [cos θ0, cos θ0, ...] + [-q1, q0, -q3, q2, ...] ⊗ [sin θ0,
    sin θ0, ...]."""
    q = torch.randn(2, 7, 16, dtype=torch.float64)
    positions = torch.arange(7) * 13
    inv_freq, _ = functional.rope_inv_freq(16)
    cos, sin = functional.rope_cos_sin(positions, inv_freq, dtype=torch.float64)
    cos_pos = torch.stack([cos, cos], dim=-1).reshape(7, 16)
    sin_pos = torch.stack([sin, sin], dim=-1).reshape(7, 16)
    rotated_pairs = torch.stack([-q[..., 1::2], q[..., ::2]], dim=-1).reshape_as(q)
    torch.testing.assert_close(functional.apply_rope(q, cos, sin, "interleaved"), q * cos_pos + rotated_pairs * sin_pos)


@covers("rope")
def test_half_equals_llama_rotate_half() -> None:
    """Hugging Face transformers' Llama code (apply_rotary_pos_emb): q * cos + rotate_half(q) * sin with
    cos = cat(freqs, freqs).cos()."""

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    q = torch.randn(2, 3, 9, 32, dtype=torch.float64)
    positions = torch.arange(9) * 7
    inv_freq, _ = functional.rope_inv_freq(32)
    freqs = torch.outer(positions.double(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = functional.rope_cos_sin(positions, inv_freq, dtype=torch.float64)
    torch.testing.assert_close(functional.apply_rope(q, cos, sin, "half"), q * emb.cos() + rotate_half(q) * emb.sin())


@covers("rope")
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_apply_rope_equals_complex_multiplication(layout: str) -> None:
    """Seeds 000/002: view the pairs as complex numbers and multiply by polar(1, m θ)."""
    dim, seq = 6, 3
    x = torch.randn(seq, dim, dtype=torch.float64)
    theta = _llama_post_theta(dim)
    all_theta = torch.outer(torch.arange(seq, dtype=torch.float64), theta)
    rotor = torch.polar(torch.ones_like(all_theta), all_theta)
    if layout == "interleaved":
        z = torch.view_as_complex(x.reshape(seq, -1, 2).contiguous())
        expected = torch.view_as_real(z * rotor).reshape(seq, dim)
    else:
        z = torch.complex(x[:, : dim // 2], x[:, dim // 2 :])
        w = z * rotor
        expected = torch.cat((w.real, w.imag), dim=-1)
    got = functional.apply_rope(x, all_theta.cos(), all_theta.sin(), layout)
    torch.testing.assert_close(got, expected)
    # The seed's printed example row 1 (token_embeddings[1] rotated by 1, 0.0464, 0.0022 rad).
    seed_x = torch.tensor([[2.0363, -0.1143, -1.5050, -0.9562, -0.1079, 0.4749]], dtype=torch.float64)
    seed_out = functional.apply_rope(seed_x, all_theta[1:2].cos(), all_theta[1:2].sin(), "interleaved")
    seed_expected = torch.tensor([[1.1964, 1.6518, -1.4590, -1.0250, -0.1089, 0.4746]], dtype=torch.float64)
    torch.testing.assert_close(seed_out, seed_expected, atol=1e-4, rtol=0)


@covers("rope", "rope_linear", "rope_ntk", "rope_yarn", "rope_llama3", "rope_truncation")
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize(
    ("rotary_dim", "params"),
    [
        (32, {}),
        (16, {}),
        (32, {"rope_type": "linear", "factor": 3.0}),
        (32, {"rope_type": "ntk", "factor": 4.0}),
        (32, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
        (32, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}),
        (32, {"rope_type": "truncation", "truncation_a": 1e-3, "truncation_c": 0.1, "truncation_beta": 0.02}),
    ],
)  # fmt: skip
def test_inner_product_depends_only_on_relative_position(layout: str, rotary_dim: int, params: dict) -> None:
    """⟨R_m q, R_n k⟩ = qᵀ R_{n-m} k (RoFormer, arXiv:2104.09864) and norms are preserved."""
    dim = 32
    inv_freq, scale = functional.rope_inv_freq(rotary_dim, params)
    q, k = torch.randn(2, dim, dtype=torch.float64)

    def rot(x: torch.Tensor, p: int) -> torch.Tensor:
        cos, sin = functional.rope_cos_sin(torch.tensor(p), inv_freq, 1.0, dtype=torch.float64)
        return functional.apply_rope(x, cos, sin, layout, rotary_dim)

    for m, n in [(0, 0), (5, 2), (2, 5), (1000, 37), (70000, 70123)]:
        score = rot(q, m) @ rot(k, n)
        for shift in (1, 17, 4096):
            assert (rot(q, m + shift) @ rot(k, n + shift)).item() == pytest.approx(score.item(), rel=1e-9, abs=1e-9)
        assert (q @ rot(k, n - m)).item() == pytest.approx(score.item(), rel=1e-9, abs=1e-9)
        torch.testing.assert_close(rot(q, m).norm(), q.norm())
    assert scale == pytest.approx(1.0 if params.get("rope_type") != "yarn" else 0.1 * math.log(4.0) + 1.0)


def test_apply_rope_keeps_dtype_and_shape() -> None:
    inv_freq, _ = functional.rope_inv_freq(8)
    cos, sin = functional.rope_cos_sin(torch.arange(4), inv_freq)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        x = torch.randn(2, 3, 4, 12).to(dtype)
        out = functional.apply_rope(x, cos, sin, "half", 8)
        assert out.dtype == dtype
        assert out.shape == x.shape
        assert torch.equal(out[..., 8:], x[..., 8:])


# --------------------------------------------------------------------------------------------------
# Sinusoidal table
# --------------------------------------------------------------------------------------------------


def test_sinusoidal_interleaved_equals_seed_numpy_code() -> None:
    """Vaswani et al. 2017 (arXiv:1706.03762, §3.5): pos / 10000**(2*(j//2)/d); sin on even columns, cos on odd."""
    max_position, hidden = 50, 16
    position_enc = np.array(
        [[pos / np.power(10000, 2 * (j // 2) / hidden) for j in range(hidden)] for pos in range(max_position)]
    )
    expected = np.zeros((max_position, hidden))
    expected[:, 0::2] = np.sin(position_enc[:, 0::2])
    expected[:, 1::2] = np.cos(position_enc[:, 1::2])
    got = functional.sinusoidal_table(max_position, hidden, "interleaved", dtype=torch.float64)
    torch.testing.assert_close(got, torch.from_numpy(expected), atol=1e-12, rtol=1e-12)


def test_sinusoidal_concat_equals_naive_loops() -> None:
    """tensor2tensor / Transformer-XL order: [sin(t ω_0), ..., sin(t ω_{d/2-1}), cos(t ω_0), ...]."""
    positions, dim, base = 33, 10, 500.0
    got = functional.sinusoidal_table(positions, dim, "concat", base=base, dtype=torch.float64)
    for t in range(positions):
        for i in range(dim // 2):
            w = 1.0 / base ** (2 * i / dim)
            assert got[t, i].item() == pytest.approx(math.sin(t * w), abs=1e-12)
            assert got[t, dim // 2 + i].item() == pytest.approx(math.cos(t * w), abs=1e-12)


def test_sinusoidal_position_t_plus_k_is_linear_in_position_t() -> None:
    """Vaswani et al. 2017 §3.5 (PE(t+k) is linear in PE(t)): PE(t+k, 2i) = PE(t, 2i) PE(k, 2i+1) + PE(t, 2i+1)
    PE(k, 2i), and the cos identity."""
    pe = functional.sinusoidal_table(80, 12, "interleaved", dtype=torch.float64)
    t, k = torch.arange(0, 40).unsqueeze(-1), torch.tensor([3, 11, 39]).view(1, -1)
    sin_t, cos_t = pe[t, 0::2], pe[t, 1::2]  # [40, 1, 6]
    sin_k, cos_k = pe[k, 0::2], pe[k, 1::2]  # [1, 3, 6]
    torch.testing.assert_close(pe[t + k, 0::2], sin_t * cos_k + cos_t * sin_k)
    torch.testing.assert_close(pe[t + k, 1::2], cos_t * cos_k - sin_t * sin_k)


# --------------------------------------------------------------------------------------------------
# ALiBi slopes, T5 and DeBERTa buckets
# --------------------------------------------------------------------------------------------------


@covers("alibi")
@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32, 64])
def test_alibi_slopes_for_powers_of_two(n: int) -> None:
    expected = torch.tensor([2.0 ** (-8 * i / n) for i in range(1, n + 1)], dtype=torch.float64)
    torch.testing.assert_close(functional.alibi_slopes(n, dtype=torch.float64), expected, rtol=1e-14, atol=0)
    if n == 8:
        assert functional.alibi_slopes(8).tolist() == [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]


@covers("alibi")
def test_alibi_slopes_match_bloom_for_every_head_count() -> None:
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom", reason="BLOOM is the reference")
    for n in range(1, 70):
        alibi = bloom.build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), n, torch.float32)  # [n, 1, 2]
        slopes = alibi[:, 0, 1]  # the bias at position 1 is the slope itself
        torch.testing.assert_close(functional.alibi_slopes(n), slopes, rtol=1e-6, atol=0)


def test_t5_buckets_reproduce_the_published_table() -> None:
    """The table of Su Jianlin (2021, https://kexue.fm/archives/8130, section T5式): i - j = 0..30 -> 0..7,
    then 8,8,8,8, 9,9,9,9, 10 (x7), 11 (x8); relative_position = j - i."""
    table = list(range(8)) + [8] * 4 + [9] * 4 + [10] * 7 + [11] * 8
    distance = torch.arange(len(table))
    assert functional.t5_relative_bucket(-distance).tolist() == table


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 64), (8, 20), (64, 256), (5, 3), (4, 8)])
def test_t5_buckets_match_hugging_face(bidirectional: bool, num_buckets: int, max_distance: int) -> None:
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5", reason="T5 is the reference")
    relative = torch.arange(-600, 601).view(1, -1)
    expected = t5.T5Attention._relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    got = functional.t5_relative_bucket(relative, bidirectional, num_buckets, max_distance)
    assert torch.equal(got, expected)


@pytest.mark.parametrize(("bucket_size", "max_position"), [(256, 512), (64, 128), (32, 512), (8, 30)])
def test_deberta_log_buckets_match_hugging_face(bucket_size: int, max_position: int) -> None:
    deberta = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2", reason="DeBERTa reference")
    relative = torch.arange(-2000, 2001)
    expected = deberta.make_log_bucket_position(relative, bucket_size, max_position)
    got = functional.deberta_log_bucket(relative, bucket_size, max_position)
    assert torch.equal(got, expected.to(torch.int64))


# --------------------------------------------------------------------------------------------------
# Bad input: a ConfigError that says what to do
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rotary_dim", [7, 0, 1, -4, 8.0, True])
def test_rotary_dim_must_be_a_positive_even_int(rotary_dim: Any) -> None:
    with pytest.raises(ConfigError, match="rotary_dim must be"):
        functional.rope_inv_freq(rotary_dim)


def test_apply_rope_rejects_too_large_or_mismatched_rotary_dim_and_bad_layout() -> None:
    inv_freq, _ = functional.rope_inv_freq(16)
    cos, sin = functional.rope_cos_sin(torch.arange(3), inv_freq)
    with pytest.raises(ConfigError, match="exceeds the head dim"):
        functional.apply_rope(torch.randn(3, 8), cos, sin)
    with pytest.raises(ConfigError, match="does not match"):
        functional.apply_rope(torch.randn(3, 32), cos, sin, rotary_dim=15)
    with pytest.raises(ConfigError, match=r"half.*interleaved"):
        functional.apply_rope(torch.randn(3, 32), cos, sin, layout="neox")


@pytest.mark.parametrize("rope_type", ["linear", "ntk", "dynamic", "yarn", "llama3"])
@pytest.mark.parametrize("factor", [0, -2.0, float("nan"), "four"])
def test_factor_must_be_positive(rope_type: str, factor: Any) -> None:
    params = {"rope_type": rope_type, "factor": factor, "max_position_embeddings": 64,
              "original_max_position_embeddings": 32, "low_freq_factor": 1.0, "high_freq_factor": 4.0}  # fmt: skip
    with pytest.raises(ConfigError, match="factor must be"):
        functional.rope_inv_freq(16, params)


def test_unknown_rope_type_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="valid rope_type values") as info:
        functional.rope_inv_freq(16, {"rope_type": "su"})
    for name in ("default", "linear", "ntk", "dynamic", "yarn", "longrope", "llama3", "truncation"):
        assert name in str(info.value)


def test_unknown_rope_parameter_key_names_the_valid_keys() -> None:
    with pytest.raises(ConfigError, match=r"unknown RoPE parameter.*'scaling_factor'.*valid keys") as info:
        functional.rope_inv_freq(16, {"rope_type": "linear", "scaling_factor": 2.0})
    assert "factor" in str(info.value)


def test_missing_required_parameters_say_which_to_add() -> None:
    with pytest.raises(ConfigError, match="needs 'factor'"):
        functional.rope_inv_freq(16, {"rope_type": "linear"})
    with pytest.raises(ConfigError, match="needs 'max_position_embeddings'"):
        functional.rope_inv_freq(16, {"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ConfigError, match="needs 'short_factor'"):
        functional.rope_inv_freq(16, {"rope_type": "longrope", "original_max_position_embeddings": 8})


def test_longrope_factor_lists_must_have_rotary_dim_half_entries() -> None:
    params = {"rope_type": "longrope", "original_max_position_embeddings": 64, "factor": 4.0,
              "short_factor": [1.0] * 8, "long_factor": [2.0] * 7}  # fmt: skip
    with pytest.raises(ConfigError, match="long_factor must have rotary_dim // 2 = 8 entries, got 7"):
        functional.rope_inv_freq(16, params)
    with pytest.raises(ConfigError, match="short_factor must have rotary_dim // 2 = 4 entries"):
        functional.rope_inv_freq(8, params)


def test_llama3_needs_high_freq_factor_above_low_freq_factor() -> None:
    params = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}  # fmt: skip
    with pytest.raises(ConfigError, match="high_freq_factor > low_freq_factor"):
        functional.rope_inv_freq(16, params)


def test_truncation_thresholds_must_be_ordered() -> None:
    with pytest.raises(ConfigError, match="truncation_a < truncation_c"):
        functional.rope_inv_freq(16, {"rope_type": "truncation", "truncation_a": 0.2, "truncation_c": 0.1,
                              "truncation_beta": 0.15})  # fmt: skip


def test_bucket_and_slope_arguments_are_validated() -> None:
    relative = torch.arange(-3, 4)
    with pytest.raises(ConfigError, match="num_buckets must be an int >= 2"):
        functional.t5_relative_bucket(relative, num_buckets=1)
    with pytest.raises(ConfigError, match="max_distance must be"):
        functional.t5_relative_bucket(relative, max_distance=0)
    with pytest.raises(ConfigError, match="Use num_buckets >= 4"):  # one bucket per direction: log(0) upstream
        functional.t5_relative_bucket(relative, bidirectional=True, num_buckets=3)
    with pytest.raises(ConfigError, match="use max_distance > 8"):  # upstream divides by log(1) = 0
        functional.t5_relative_bucket(relative, bidirectional=True, num_buckets=32, max_distance=8)
    assert functional.t5_relative_bucket(relative, bidirectional=False, num_buckets=2, max_distance=2).tolist() == [
        1, 1, 1, 0, 0, 0, 0
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="bucket_size"):
        functional.deberta_log_bucket(relative, bucket_size=2)
    with pytest.raises(ConfigError, match="num_heads must be a positive int"):
        functional.alibi_slopes(0)
    with pytest.raises(ConfigError, match="positive int"):
        functional.sinusoidal_table(10, 0)
    with pytest.raises(ConfigError, match="'interleaved' or 'concat'"):
        functional.sinusoidal_table(10, 8, layout="half")


def test_exact_angles_rejects_float_position_ids() -> None:
    turns = functional.split_turns(functional.rope_inv_freq(8)[0])
    with pytest.raises(ConfigError, match="integer tensor"):
        functional.exact_angles(torch.tensor([0.0, 1.5]), turns)


def test_exact_angles_refuse_positions_past_the_exact_range() -> None:
    """Past 2**24 the split is no longer exact (errors reach 0.8 rad), so eager calls raise instead."""
    turns = functional.split_turns(functional.rope_inv_freq(8)[0])
    functional.exact_angles(torch.tensor([2**24 - 1, -(2**24) + 1]), turns)
    for far in (2**24, -(2**24), 2**26 + 5):
        with pytest.raises(PositionError, match=r"past 2\*\*24 = 16777216.*table_dtype=torch.float64"):
            functional.exact_angles(torch.tensor([0, far]), turns)


def test_rope_parameters_reject_zero_theta_and_nan_factors() -> None:
    with pytest.raises(ConfigError, match="rope_theta must be a finite number > 0, got 0"):
        functional.rope_inv_freq(8, {"rope_theta": 0})
    params = {"rope_type": "longrope", "original_max_position_embeddings": 16, "max_position_embeddings": 64,
              "short_factor": [1.0, float("nan")], "long_factor": [1.0, 2.0]}  # fmt: skip
    with pytest.raises(ConfigError, match="short_factor entries must be finite numbers > 0"):
        functional.rope_inv_freq(4, params)
