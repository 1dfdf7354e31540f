"""Built-in ``rope_type`` functions with a rule per frequency or per length: ``longrope``, ``llama3``, ``truncation``,
``proportional``, ``ntk_alpha``, ``xpos``.

Each section is one type: its function, then its :func:`register` call (the contract: :mod:`posenc.rope_types`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from posenc.citations import Citation
from posenc.errors import ConfigError
from posenc.params import Param
from posenc.rope_types.common import (
    HF_REFERENCE,
    POSITIVE_OPTIONAL,
    SeqLen,
    context_ratio_factor,
    default_inv_freq,
    default_type_inv_freq,
    device_of,
    factor_param,
    finite,
    original_context,
    positive,
    positive_or,
    require,
    static_ntk,
    switch_at,
)
from posenc.rope_types.registry import RopeType, register

__all__ = ["xpos_scale_rate"]

# --------------------------------------------------------------------------------------------------
# longrope (length-dependent, piecewise: short factors up to the original context, long factors beyond)
# --------------------------------------------------------------------------------------------------


def _longrope_factors(params: Mapping[str, Any], key: str, rotary_dim: int) -> list[float]:
    values = require(params, key, "longrope")
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ConfigError(f"longrope {key} must be a list of rotary_dim // 2 = {rotary_dim // 2} numbers.")
    if len(values) != rotary_dim // 2:
        raise ConfigError(f"longrope {key} must have rotary_dim // 2 = {rotary_dim // 2} entries, got {len(values)}.")
    try:
        numbers = [float(v) for v in values]
    except (TypeError, ValueError):
        numbers = [math.nan]
    if not all(math.isfinite(v) and v > 0 for v in numbers):
        raise ConfigError(f"longrope {key} entries must be finite numbers > 0.")
    return numbers


def _longrope(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen) -> tuple[torch.Tensor, float]:
    original = original_context(params, "longrope")
    short = _longrope_factors(params, "short_factor", rotary_dim)
    long = _longrope_factors(params, "long_factor", rotary_dim)
    factor = context_ratio_factor(params, "longrope", original)
    attention_factor = params.get("attention_factor")
    if attention_factor is not None:
        attention_factor = positive(attention_factor, "attention_factor")
    elif factor <= 1.0:
        attention_factor = 1.0
    elif original == 1:
        raise ConfigError(
            "longrope's default attention factor sqrt(1 + ln(factor) / ln(original_max_position_embeddings)) "
            "divides by ln(1) = 0; give original_max_position_embeddings >= 2 or an explicit attention_factor."
        )
    else:
        attention_factor = math.sqrt(1 + math.log(factor) / math.log(original))
    device = device_of(seq_len)
    scale = base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim)
    short_freq, long_freq = (1.0 / (torch.tensor(f, dtype=torch.float64, device=device) * scale) for f in (short, long))
    return switch_at(seq_len, original, short_freq, long_freq), float(attention_factor)


def _longrope_defaults(params: Mapping[str, Any], rotary_dim: int) -> dict[str, Any]:
    """A quarter of the context as the original one; short factors 1; long factors a ramp from 1 to the factor."""
    max_pos = params["max_position_embeddings"]
    original = params.get("original_max_position_embeddings") or max(1, max_pos // 4)
    factor = params.get("factor") or max_pos / original
    half = rotary_dim // 2
    return {
        "original_max_position_embeddings": original,
        "short_factor": [1.0] * half,
        "long_factor": [max(factor, 1.0) ** (i / max(half - 1, 1)) for i in range(half)],
    }


register(
    RopeType(
        name="longrope",
        inv_freq=_longrope,
        scheme="rope_longrope",
        title="RoPE + LongRoPE (short/long factors switched in-graph)",
        summary="Per-frequency divisors searched for the model: short factors up to the original context, long "
        "factors beyond it (switched by the current length), and a cos/sin multiplier.",
        citation=Citation(
            "Ding et al.",
            "LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens",
            2024,
            "https://arxiv.org/abs/2402.13753",
        ),
        params=(
            Param(
                "factor",
                "float",
                None,
                "scaling factor (default max_position_embeddings / original)",
                **POSITIVE_OPTIONAL,
            ),
            Param(
                "original_max_position_embeddings",
                "int",
                None,
                "switch point: long factors when max(position)+1 exceeds it (default max_pos // 4)",
                optional=True,
                minimum=1,
            ),
            Param(
                "short_factor", "floats", None, "r/2 per-frequency divisors below the switch (default 1)", optional=True
            ),
            Param(
                "long_factor",
                "floats",
                None,
                "r/2 per-frequency divisors above (default ramp 1..factor)",
                optional=True,
            ),
            Param(
                "attention_factor",
                "float",
                None,
                "cos/sin multiplier (default sqrt(1 + ln f / ln orig))",
                **POSITIVE_OPTIONAL,
            ),
        ),
        length_dependent=True,
        switch_points=lambda p: (original_context(p, "longrope"),),
        geometry_defaults=_longrope_defaults,
        boundaries=lambda p: (original_context(p, "longrope"),),
        reference=HF_REFERENCE,
    )
)


# --------------------------------------------------------------------------------------------------
# llama3: frequency bands
# --------------------------------------------------------------------------------------------------


def _llama3(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen) -> tuple[torch.Tensor, float]:
    factor = factor_param(params, "llama3")
    low = positive(require(params, "low_freq_factor", "llama3"), "low_freq_factor")
    high = positive(require(params, "high_freq_factor", "llama3"), "high_freq_factor")
    old_len = positive(
        require(params, "original_max_position_embeddings", "llama3"), "original_max_position_embeddings"
    )
    if high <= low:
        raise ConfigError(f"llama3 needs high_freq_factor > low_freq_factor, got {high} <= {low}.")
    inv_freq = default_inv_freq(rotary_dim, base)
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled), 1.0


def _llama3_boundaries(params: Mapping[str, Any]) -> tuple[int, ...]:
    """The pretraining context and the two band-edge wavelengths (original / low and / high freq factor)."""
    original = original_context(params, "llama3")
    edges = {original, int(original / params["low_freq_factor"]), int(original / params["high_freq_factor"])}
    return tuple(sorted(edge for edge in edges if edge >= 1))


register(
    RopeType(
        name="llama3",
        inv_freq=_llama3,
        scheme="rope_llama3",
        title="RoPE + Llama-3 frequency bands",
        summary="Low frequencies (wavelength > original / low_freq_factor) divided by the factor, high ones kept, "
        "a smooth blend between.",
        citation=Citation("Grattafiori et al.", "The Llama 3 Herd of Models", 2024, "https://arxiv.org/abs/2407.21783"),
        params=(
            Param("factor", "float", 8.0, "divisor of low frequencies", minimum=0, exclusive_minimum=True),
            Param("low_freq_factor", "float", 1.0, "low-frequency band edge", minimum=0, exclusive_minimum=True),
            Param("high_freq_factor", "float", 4.0, "high-frequency band edge", minimum=0, exclusive_minimum=True),
            Param(
                "original_max_position_embeddings",
                "int",
                None,
                "pretraining context (default: the config's max_position_embeddings)",
                optional=True,
                minimum=1,
            ),
        ),
        geometry_defaults=lambda p, r: {"original_max_position_embeddings": p["max_position_embeddings"]},
        cases={"short_context": {"original_max_position_embeddings": 64}},
        boundaries=_llama3_boundaries,
        reference=HF_REFERENCE,
    )
)


# --------------------------------------------------------------------------------------------------
# truncation: base truncation
# --------------------------------------------------------------------------------------------------


def _truncation(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen) -> tuple[torch.Tensor, float]:
    a = finite(require(params, "truncation_a", "truncation"), "truncation_a")
    c = finite(require(params, "truncation_c", "truncation"), "truncation_c")
    beta = finite(require(params, "truncation_beta", "truncation"), "truncation_beta")
    if not 0 <= a < c:
        raise ConfigError(f"base truncation needs 0 <= truncation_a < truncation_c, got a={a}, c={c}.")
    if not a < beta < c:
        raise ConfigError(f"base truncation needs truncation_a < truncation_beta < truncation_c, got {beta}.")
    theta = default_inv_freq(rotary_dim, base)
    middle = torch.full_like(theta, beta)
    return torch.where(theta >= c, theta, torch.where(theta > a, middle, torch.zeros_like(theta))), 1.0


register(
    RopeType(
        name="truncation",
        inv_freq=_truncation,
        scheme="rope_truncation",
        title="RoPE + base truncation",
        summary="Frequencies θ_i >= c kept, a < θ_i < c set to a fixed β, θ_i <= a set to 0.",
        citation=Citation(
            "Pal et al.",
            "Giraffe: Adventures in Expanding Context Lengths in LLMs",
            2023,
            "https://arxiv.org/abs/2308.10882",
        ),
        params=(
            Param("truncation_a", "float", 1e-3, "θ_i <= a are set to 0 (lowest frequencies)", minimum=0),
            Param(
                "truncation_c",
                "float",
                0.1,
                "θ_i >= c are kept (highest frequencies)",
                minimum=0,
                exclusive_minimum=True,
            ),
            Param(
                "truncation_beta",
                "float",
                0.01,
                "θ_i in (a, c) become this fixed small value β",
                minimum=0,
                exclusive_minimum=True,
            ),
        ),
        in_transformers=False,
        reference="the a/c/β rule of base truncation computed by hand",
    )
)


# --------------------------------------------------------------------------------------------------
# proportional (Gemma 4): frequencies over the whole head dim, the trailing pairs unrotated
# --------------------------------------------------------------------------------------------------


def _proportional(
    rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen
) -> tuple[torch.Tensor, float]:
    """``rotary_dim`` is the head dim D here (``partial_rotary="proportional"``): pair i < int(p·D // 2) gets
    θ^(-2i/D) / factor, the rest 0 (transformers' ``_compute_proportional_rope_parameters``)."""
    factor = positive_or(params, "factor", 1.0)
    proportion = positive_or(params, "partial_rotary_factor", 1.0)
    if proportion > 1.0:
        raise ConfigError(f"proportional RoPE needs partial_rotary_factor <= 1, got {proportion}.")
    rotated = int(proportion * rotary_dim // 2)
    if rotated < 1:
        raise ConfigError(
            f"proportional RoPE with partial_rotary_factor {proportion} rotates int({proportion} * {rotary_dim} // 2) "
            f"= 0 pairs of head_dim {rotary_dim}; use a larger factor (Gemma 4 uses 0.25), or the nope scheme."
        )
    inv_freq = default_inv_freq(rotary_dim, base)
    inv_freq[rotated:] = 0.0
    return inv_freq / factor, 1.0


register(
    RopeType(
        name="proportional",
        inv_freq=_proportional,
        scheme="rope_proportional",
        title="Proportional RoPE (Gemma 4 full-attention layers)",
        summary="p-RoPE: frequencies θ^(-2i/D) over the whole head dim D divided by the factor; only the first "
        "int(p·D // 2) pairs (the highest frequencies) rotate, the others get frequency 0 (unlike partial rotary, "
        "whose frequencies span the rotated slice).",
        citation=Citation(
            "Barbero, Vitvitskyi, Perivolaropoulos, Pascanu and Veličković",
            "Round and Round We Go! What makes Rotary Positional Encodings useful?",
            2024,
            "https://arxiv.org/abs/2410.06205",
        ),
        params=(Param("factor", "float", 1.0, "frequencies are divided by it", minimum=0, exclusive_minimum=True),),
        partial_rotary="proportional",
        cases={
            "default": {"partial_rotary_factor": 0.25},  # Gemma 4's full-attention layers
            "interleaved": {"layout": "interleaved", "partial_rotary_factor": 0.25, "factor": 2.0},
        },
        reference="transformers' _compute_proportional_rope_parameters and Gemma4TextRotaryEmbedding",
    )
)


# --------------------------------------------------------------------------------------------------
# ntk_alpha (HunYuan): static NTK-aware base stretched by a fixed α
# --------------------------------------------------------------------------------------------------


register(
    RopeType(
        name="ntk_alpha",
        inv_freq=static_ntk("alpha", "ntk_alpha"),
        scheme="rope_ntk_alpha",
        title="RoPE + NTK-α (HunYuan)",
        summary="A fixed α stretches the base to θ·α^(r/(r-2)) (static NTK-aware scaling); HunYuan's configs label it "
        "'dynamic' with an 'alpha', which imports as this type.",
        citation=Citation(
            "Sun et al.",
            "Hunyuan-Large: An Open-Source MoE Model with 52 Billion Activated Parameters by Tencent",
            2024,
            "https://arxiv.org/abs/2411.02265",
        ),
        params=(
            Param(
                "alpha",
                "float",
                1000.0,
                "α: base *= α^(r/(r-2)) (HunYuan-A13B: 1000)",
                minimum=0,
                exclusive_minimum=True,
            ),
        ),
        claims={"dynamic": "alpha"},
        reference="transformers' HunYuanDenseV1RotaryEmbedding.compute_ntk_alpha_rope_parameters",
    )
)


# --------------------------------------------------------------------------------------------------
# xpos: RoPE times an exponential per-position scale, q and k in opposite directions
# --------------------------------------------------------------------------------------------------


def xpos_scale_rate(rotary_dim: int, params: Mapping[str, Any]) -> torch.Tensor:
    """λ_i = ln ζ_i / γ with ζ_i = (2i/r + γ') / (1 + γ'): q's pair i at position n is scaled by ζ_i^(n/γ) =
    exp(λ_i n), k's by ζ_i^(-n/γ). γ = ``scale_base`` (default 512), γ' = ``scale_gamma`` (default 0.4)."""
    scale_base = positive_or(params, "scale_base", 512.0)
    gamma = positive_or(params, "scale_gamma", 0.4)
    zeta = (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim + gamma) / (1.0 + gamma)
    return torch.log(zeta) / scale_base


def _xpos(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen) -> tuple[torch.Tensor, float]:
    xpos_scale_rate(rotary_dim, params)  # the scale's parameters are validated with the frequencies
    return default_type_inv_freq(rotary_dim, base, params, seq_len)  # RoPE's own frequencies


register(
    RopeType(
        name="xpos",
        inv_freq=_xpos,
        scheme="rope_xpos",
        title="xPos (RoPE with an exponential decay)",
        summary="RoPE whose pair i is also scaled by ζ_i^(n/γ) on q and ζ_i^(-n/γ) on k, ζ_i = (2i/r + γ')/(1 + γ'), "
        "so q_m·k_n decays with m - n; q and k get different cos/sin. Positions end where the scales leave float32 "
        "(n < 87.3·γ / |ln ζ_0|: 35695 at the defaults; more with a larger γ).",
        citation=Citation(
            "Sun et al.", "A Length-Extrapolatable Transformer", 2022, "https://arxiv.org/abs/2212.10554"
        ),
        params=(
            Param(
                "scale_base", "float", 512.0, "γ: the scale is ζ^(n/γ) at position n", minimum=0, exclusive_minimum=True
            ),
            Param("scale_gamma", "float", 0.4, "γ' in ζ_i = (2i/r + γ')/(1 + γ')", minimum=0, exclusive_minimum=True),
        ),
        in_transformers=False,
        scale_rate=xpos_scale_rate,
        reference="the paper's scaled rotation written out per position and pair; q_m·k_n as a function of m - n",
    )
)
