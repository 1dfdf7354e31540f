"""The built-in ``rope_type`` functions, each registered with its parameters, citation and scheme.

Each section is one type: a function ``(rotary_dim, base, params, seq_len) -> (inv_freq, attention_factor)``
that follows Hugging Face transformers' ``ROPE_INIT_FUNCTIONS`` (HunYuan's own rotary class for ``ntk_alpha``; the
cited formula for posenc's own ``ntk``, ``truncation`` and ``xpos``) and validates what it reads, then its
:func:`register` call.
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
    at_least,
    default_inv_freq,
    finite,
    ntk_exponent,
    positive,
    positive_int,
    require,
    switch_at,
)
from posenc.rope_types.registry import InvFreq, RopeType, register

__all__ = ["AXIAL_COLUMNS", "ROFORMER", "axial_slot_axes", "dynamic_ntk_base", "mrope_slot_axes", "yarn_get_mscale"]

ROFORMER = Citation(
    "Su et al.",
    "RoFormer: Enhanced Transformer with Rotary Position Embedding",
    2021,
    "https://arxiv.org/abs/2104.09864",
)
_HF = "Hugging Face transformers modeling_rope_utils (ROPE_INIT_FUNCTIONS), ONNX RotaryEmbedding-23"
SeqLen = int | torch.Tensor | None


def _device(seq_len: SeqLen) -> torch.device | None:
    return seq_len.device if isinstance(seq_len, torch.Tensor) else None


def _factor(params: Mapping[str, Any], rope_type: str) -> float:
    return positive(require(params, "factor", rope_type), "factor")


def _positive_or(params: Mapping[str, Any], key: str, default: float) -> float:
    """``params[key]`` as a finite float > 0, or ``default`` when it is absent or ``None``."""
    value = params.get(key)
    return default if value is None else positive(value, key)


def _needs_wide_rotary(rotary_dim: int, what: str) -> None:
    if rotary_dim <= 2:
        raise ConfigError(f"{what} needs rotary_dim > 2 (its exponent is r / (r - 2)).")


def _original(params: Mapping[str, Any], rope_type: str, fallback: str | None = None) -> int:
    """``original_max_position_embeddings`` (or, when absent, the ``fallback`` key), an int >= 1."""
    key = "original_max_position_embeddings"
    if params.get(key) is None and fallback is not None:
        key = fallback
    return positive_int(require(params, key, rope_type), key)


def _context_ratio_factor(params: Mapping[str, Any], rope_type: str, original: int) -> float:
    """``factor``, or ``max_position_embeddings / original_max_position_embeddings`` when it is absent."""
    factor = params.get("factor")
    if factor is None:
        max_pos = positive_int(require(params, "max_position_embeddings", rope_type), "max_position_embeddings")
        factor = max_pos / original
    return positive(factor, "factor")


# --------------------------------------------------------------------------------------------------
# default
# --------------------------------------------------------------------------------------------------


def _default(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen) -> tuple[torch.Tensor, float]:
    return default_inv_freq(rotary_dim, base), 1.0


register(
    RopeType(
        name="default",
        inv_freq=_default,
        scheme="rope",
        title="RoPE",
        summary="Rotary position embedding (rotate q and k).",
        citation=ROFORMER,
        cases={"interleaved_partial": {"layout": "interleaved", "partial_rotary_factor": 0.5}},
        reference=_HF,
    )
)


# --------------------------------------------------------------------------------------------------
# linear: position interpolation
# --------------------------------------------------------------------------------------------------


def _linear(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen) -> tuple[torch.Tensor, float]:
    return default_inv_freq(rotary_dim, base) / _factor(params, "linear"), 1.0


register(
    RopeType(
        name="linear",
        inv_freq=_linear,
        scheme="rope_linear",
        title="RoPE + linear position interpolation (PI)",
        summary="Positions are divided by the factor: inv_freq / factor.",
        citation=Citation(
            "Chen, Wong, Chen and Tian",
            "Extending Context Window of Large Language Models via Positional Interpolation",
            2023,
            "https://arxiv.org/abs/2306.15595",
        ),
        params=(
            Param("factor", "float", 4.0, "positions are divided by this factor", minimum=0, exclusive_minimum=True),
        ),
        reference=_HF,
    )
)


# --------------------------------------------------------------------------------------------------
# ntk: static NTK-aware base
# --------------------------------------------------------------------------------------------------


def _static_ntk(key: str, rope_type: str) -> InvFreq:
    """Static NTK-aware frequencies: the base becomes θ · s^(r/(r-2)) with the scale s read from ``key``."""

    def inv_freq(
        rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen
    ) -> tuple[torch.Tensor, float]:
        scale = positive(require(params, key, rope_type), key)
        _needs_wide_rotary(rotary_dim, f"{rope_type} scaling")
        return default_inv_freq(rotary_dim, base * scale ** ntk_exponent(rotary_dim)), 1.0

    return inv_freq


_ntk = _static_ntk("factor", "ntk")


register(
    RopeType(
        name="ntk",
        inv_freq=_ntk,
        scheme="rope_ntk",
        title="RoPE + static NTK-aware scaling",
        summary="The base grows to base * k^(r/(r-2)) so that the lowest frequency is interpolated by k.",
        citation=Citation(
            "bloc97",
            "NTK-Aware Scaled RoPE allows LLaMA models to have extended (8k+) context size without any fine-tuning "
            "and minimal perplexity degradation (r/LocalLLaMA)",
            2023,
            "https://www.reddit.com/r/LocalLLaMA/comments/14lz7j5/ntkaware_scaled_rope_allows_llama_models_to_have/",
        ),
        params=(
            Param(
                "factor", "float", 4.0, "context extension k; base *= k^(r/(r-2))", minimum=0, exclusive_minimum=True
            ),
        ),
        in_transformers=False,
        reference="the base θ·k^(r/(r-2)) computed by hand; transformers' dynamic NTK at length k·M (same base)",
    )
)


# --------------------------------------------------------------------------------------------------
# dynamic: dynamic NTK (length-dependent, continuous)
# --------------------------------------------------------------------------------------------------


def dynamic_ntk_base(base: Any, factor: Any, length: Any, max_position_embeddings: Any, rotary_dim: Any) -> Any:
    """Dynamic NTK's base at length L: ``θ · (factor · L̂ / M − (factor − 1)) ** (r / (r − 2))``, L̂ = max(L, M).

    The one definition of the formula: Python numbers (eager, float64), torch tensors (inside exported graphs,
    ``length`` a 0-d float64 tensor), or any values with torch's arithmetic operators and ``clamp(min=...)`` (the
    RoPE plugin's ONNX Runtime twin evaluates it on symbols that write ONNX nodes).
    """
    length = at_least(length, max_position_embeddings)
    return base * (factor * length / max_position_embeddings - (factor - 1)) ** ntk_exponent(rotary_dim)


def _dynamic(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen) -> tuple[torch.Tensor, float]:
    factor = _factor(params, "dynamic")
    max_pos = positive_int(require(params, "max_position_embeddings", "dynamic"), "max_position_embeddings")
    _needs_wide_rotary(rotary_dim, "dynamic NTK scaling")
    length: Any = max_pos if seq_len is None else seq_len
    length = length.to(torch.float64) if isinstance(length, torch.Tensor) else int(length)
    scaled = dynamic_ntk_base(base, factor, length, max_pos, rotary_dim)
    return default_inv_freq(rotary_dim, scaled, _device(seq_len)), 1.0


register(
    RopeType(
        name="dynamic",
        inv_freq=_dynamic,
        scheme="rope_dynamic",
        title="RoPE + dynamic NTK scaling (in-graph)",
        summary="The NTK-aware base is recomputed from the current length inside the graph.",
        citation=Citation(
            "emozilla",
            "Dynamically Scaled RoPE further increases performance of long context LLaMA with zero fine-tuning "
            "(r/LocalLLaMA)",
            2023,
            "https://www.reddit.com/r/LocalLLaMA/comments/14mrgpr/dynamically_scaled_rope_further_increases/",
        ),
        params=(Param("factor", "float", 2.0, "scaling factor of dynamic NTK", minimum=0, exclusive_minimum=True),),
        length_dependent=True,
        table_modes=frozenset({"dynamic"}),
        boundaries=lambda p: (positive_int(p["max_position_embeddings"], "max_position_embeddings"),),
        reference=_HF,
    )
)


# --------------------------------------------------------------------------------------------------
# yarn
# --------------------------------------------------------------------------------------------------


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude scale ``0.1 · mscale · ln s + 1`` for a factor s > 1, else 1 (transformers' ``get_mscale``,
    DeepSeek's ``yarn_get_mscale``)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_attention_factor(factor: float, params: Mapping[str, Any]) -> float:
    """``0.1 ln s + 1``, or DeepSeek's ratio of two such terms when ``mscale`` and ``mscale_all_dim`` are given."""
    get_mscale = yarn_get_mscale
    mscale = params.get("mscale")
    mscale_all_dim = params.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        numerator = get_mscale(factor, finite(mscale, "mscale"))
        denominator = get_mscale(factor, finite(mscale_all_dim, "mscale_all_dim"))
        if numerator <= 0 or denominator <= 0:
            raise ConfigError(
                f"yarn's attention factor (0.1·mscale·ln s + 1) / (0.1·mscale_all_dim·ln s + 1) needs both terms > 0, "
                f"got {numerator} / {denominator} (s={factor}); fix mscale/mscale_all_dim or give attention_factor."
            )
        return float(numerator / denominator)
    return get_mscale(factor)


def _yarn(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen) -> tuple[torch.Tensor, float]:
    original = _original(params, "yarn", fallback="max_position_embeddings")
    factor = _context_ratio_factor(params, "yarn", original)
    given = params.get("attention_factor")
    attention_factor = _yarn_attention_factor(factor, params) if given is None else positive(given, "attention_factor")
    beta_fast = positive(params.get("beta_fast") or 32, "beta_fast")
    beta_slow = positive(params.get("beta_slow") or 1, "beta_slow")
    truncate = params.get("truncate", True)
    if base <= 1:
        raise ConfigError(
            f"yarn needs rope_theta > 1 (its correction range divides by ln(rope_theta)), got {base}; "
            f"use the model's rope_theta."
        )

    def correction_dim(num_rotations: float) -> float:
        return (rotary_dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # the reference implementation's guard against a zero-width ramp
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_weight) + (1.0 / pos_freqs) * extrapolation_weight
    return inv_freq, float(attention_factor)


_POSITIVE_OPTIONAL: dict[str, Any] = {"optional": True, "minimum": 0, "exclusive_minimum": True}

register(
    RopeType(
        name="yarn",
        inv_freq=_yarn,
        scheme="rope_yarn",
        title="RoPE + YaRN",
        summary="NTK-by-parts interpolation (a ramp between extrapolated and interpolated frequencies) and a "
        "temperature 0.1 ln s + 1 on cos and sin.",
        citation=Citation(
            "Peng, Quesnelle, Fan and Shippole",
            "YaRN: Efficient Context Window Extension of Large Language Models",
            2023,
            "https://arxiv.org/abs/2309.00071",
        ),
        params=(
            Param(
                "factor",
                "float",
                4.0,
                "context extension factor s (None: max_position_embeddings / original_max_position_embeddings)",
                **_POSITIVE_OPTIONAL,
            ),
            Param(
                "original_max_position_embeddings",
                "int",
                None,
                "pretraining context (default: the config's max_position_embeddings)",
                minimum=1,
                optional=True,
            ),
            Param(
                "beta_fast", "float", 32.0, "rotations above which dims extrapolate", minimum=0, exclusive_minimum=True
            ),
            Param(
                "beta_slow", "float", 1.0, "rotations below which dims interpolate", minimum=0, exclusive_minimum=True
            ),
            Param("mscale", "float", None, "DeepSeek mscale (numerator of attention_factor)", optional=True),
            Param("mscale_all_dim", "float", None, "DeepSeek mscale_all_dim (denominator)", optional=True),
            Param("attention_factor", "float", None, "cos/sin multiplier (default 0.1 ln s + 1)", **_POSITIVE_OPTIONAL),
            Param("truncate", "bool", True, "floor/ceil the correction range (Hugging Face default)"),
        ),
        geometry_defaults=lambda p, r: {"original_max_position_embeddings": p["max_position_embeddings"]},
        cases={"deepseek_mscale": {"mscale": 0.707, "mscale_all_dim": 0.707, "factor": 40.0}},
        boundaries=lambda p: (_original(p, "yarn", "max_position_embeddings"),),
        reference=_HF,
    )
)


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
    original = _original(params, "longrope")
    short = _longrope_factors(params, "short_factor", rotary_dim)
    long = _longrope_factors(params, "long_factor", rotary_dim)
    factor = _context_ratio_factor(params, "longrope", original)
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
    device = _device(seq_len)
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
                **_POSITIVE_OPTIONAL,
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
                **_POSITIVE_OPTIONAL,
            ),
        ),
        length_dependent=True,
        switch_points=lambda p: (_original(p, "longrope"),),
        geometry_defaults=_longrope_defaults,
        boundaries=lambda p: (_original(p, "longrope"),),
        reference=_HF,
    )
)


# --------------------------------------------------------------------------------------------------
# llama3: frequency bands
# --------------------------------------------------------------------------------------------------


def _llama3(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen) -> tuple[torch.Tensor, float]:
    factor = _factor(params, "llama3")
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
    original = _original(params, "llama3")
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
        reference=_HF,
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
    factor = _positive_or(params, "factor", 1.0)
    proportion = _positive_or(params, "partial_rotary_factor", 1.0)
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
        inv_freq=_static_ntk("alpha", "ntk_alpha"),
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
    scale_base = _positive_or(params, "scale_base", 512.0)
    gamma = _positive_or(params, "scale_gamma", 0.4)
    zeta = (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim + gamma) / (1.0 + gamma)
    return torch.log(zeta) / scale_base


def _xpos(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen) -> tuple[torch.Tensor, float]:
    xpos_scale_rate(rotary_dim, params)  # the scale's parameters are validated with the frequencies
    return _default(rotary_dim, base, params, seq_len)  # RoPE's own frequencies


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


# --------------------------------------------------------------------------------------------------
# mrope (Qwen2-VL / Qwen2.5-VL / Qwen3-VL): frequency slots split between temporal, height and width ids
# --------------------------------------------------------------------------------------------------


def _mrope_sections(rotary_dim: int, params: Mapping[str, Any]) -> tuple[int, int, int]:
    """``mrope_section`` (three slot counts t, h, w summing to r/2), or the Qwen split of r/2 when absent."""
    half = rotary_dim // 2
    given = params.get("mrope_section")
    if given is None:
        if params.get("mrope_interleaved"):
            h = (5 * half) // 16  # Qwen3-VL: [24, 20, 20] of 64
            return half - 2 * h, h, h
        t = half // 4  # Qwen2-VL: [16, 24, 24] of 64
        h = (half - t) // 2
        return t, h, half - t - h
    if isinstance(given, (str, bytes)) or not hasattr(given, "__len__") or len(given) != 3:
        raise ConfigError(f"mrope_section must be three slot counts [t, h, w] (e.g. [16, 24, 24]), got {given!r}.")
    try:
        counts = [int(value) for value in given if not isinstance(value, bool) and float(value).is_integer()]
    except (TypeError, ValueError):
        counts = []
    if len(counts) != 3 or min(counts) < 0:
        raise ConfigError(f"mrope_section entries must be ints >= 0, got {given!r}.")
    if sum(counts) != half:
        raise ConfigError(
            f"mrope_section {counts} sums to {sum(counts)}, but the rotary dim {rotary_dim} has {half} frequency "
            f"slots; the sections must cover them exactly (Qwen2-VL: [16, 24, 24] for head_dim 128)."
        )
    return counts[0], counts[1], counts[2]


def mrope_slot_axes(rotary_dim: int, params: Mapping[str, Any]) -> torch.Tensor:
    """Axis (0 temporal, 1 height, 2 width) of each of the r/2 slots.

    Chunked (Qwen2-VL's ``recomposition_frequencies``): the first t slots read the temporal ids, the next h the
    height ids, the last w the width ids. Interleaved (``mrope_interleaved``, Qwen3-VL): slot j reads height when
    ``j % 3 == 1`` and ``j < 3h``, width when ``j % 3 == 2`` and ``j < 3w``, temporal otherwise.
    """
    t, h, w = _mrope_sections(rotary_dim, params)
    half = rotary_dim // 2
    slots = torch.arange(half)
    if not params.get("mrope_interleaved"):
        return (slots >= t).to(torch.int64) + (slots >= t + h).to(torch.int64)
    axes = torch.zeros(half, dtype=torch.int64)
    axes[(slots % 3 == 1) & (slots < 3 * h)] = 1
    axes[(slots % 3 == 2) & (slots < 3 * w)] = 2
    if torch.bincount(axes, minlength=3).tolist() != [t, h, w]:
        raise ConfigError(
            f"mrope_section {[t, h, w]} cannot be interleaved over {half} slots (t, h, w, t, h, w, ...): the height "
            f"and width sections need 3·h - 2 and 3·w - 1 < {half}; use sections like Qwen3-VL's [24, 20, 20]."
        )
    return axes


def _mrope(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen) -> tuple[torch.Tensor, float]:
    mrope_slot_axes(rotary_dim, params)  # the sections are validated with the frequencies
    return _default(rotary_dim, base, params, seq_len)


register(
    RopeType(
        name="mrope",
        inv_freq=_mrope,
        scheme="rope_mrope",
        title="M-RoPE (multimodal RoPE: temporal, height, width ids)",
        summary="RoPE whose frequency slots read three position ids [3, B, S] (temporal, height, width): in "
        "chunks of mrope_section (Qwen2-VL, Qwen2.5-VL) or interleaved t,h,w,t,h,w,... (Qwen3-VL); text tokens "
        "carry equal ids on the three axes, where it is plain RoPE. The causal mask follows token order.",
        citation=Citation(
            "Wang et al.",
            "Qwen2-VL: Enhancing Vision-Language Model's Perception of the World at Any Resolution",
            2024,
            "https://arxiv.org/abs/2409.12191",
        ),
        params=(
            Param(
                "mrope_section",
                "ints",
                None,
                "slots of the temporal, height and width ids, summing to r/2 (default: Qwen's split)",
                optional=True,
                minimum=0,
            ),
            Param("mrope_interleaved", "bool", False, "interleave t,h,w slots (Qwen3-VL) instead of chunks"),
        ),
        claims={"default": "mrope_section"},
        position_axes=3,
        slot_axes=mrope_slot_axes,
        cases={"qwen3_interleaved": {"mrope_interleaved": True}},
        reference="transformers' Qwen2VLTextRotaryEmbedding / Qwen3VLTextRotaryEmbedding and apply_rotary_pos_emb",
    )
)


# --------------------------------------------------------------------------------------------------
# axial (Qwen2-VL / Pixtral vision towers): rows and columns of image patches
# --------------------------------------------------------------------------------------------------

AXIAL_COLUMNS: tuple[str, ...] = ("same", "odd")
"""Column frequencies of axial RoPE: the rows' (Qwen2-VL vision) or the odd ones of the full set (Pixtral)."""


def _axial_columns(rotary_dim: int, params: Mapping[str, Any]) -> str:
    if rotary_dim % 4:
        raise ConfigError(
            f"axial RoPE splits the {rotary_dim // 2} frequency slots of rotary dim {rotary_dim} between rows and "
            f"columns; it needs a rotary dim divisible by 4."
        )
    columns = params.get("column_freqs", "same")
    if columns not in AXIAL_COLUMNS:
        raise ConfigError(f"axial column_freqs must be one of {list(AXIAL_COLUMNS)}, got {columns!r}.")
    return str(columns)


def axial_slot_axes(rotary_dim: int, params: Mapping[str, Any]) -> torch.Tensor:
    """Rows (axis 0) in the first r/4 slots, columns (axis 1) in the last r/4 (``cat(h, w)``, then the half layout's
    ``cat(hw, hw)``)."""
    _axial_columns(rotary_dim, params)
    quarter = rotary_dim // 4
    return torch.cat((torch.zeros(quarter, dtype=torch.int64), torch.ones(quarter, dtype=torch.int64)))


def _axial(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen) -> tuple[torch.Tensor, float]:
    """Slots ``cat(rows, columns)``: rows get θ^(-4j/r) (the even frequencies of r), columns the same
    (``same``: Qwen2-VL's ``VisionRotaryEmbedding`` over head_dim / 2) or θ^(-(4j+2)/r) (``odd``: Pixtral's
    ``cat(inv_freq[0::2], inv_freq[1::2])``)."""
    columns = _axial_columns(rotary_dim, params)
    full = default_inv_freq(rotary_dim, base)
    return torch.cat((full[0::2], full[0::2] if columns == "same" else full[1::2])), 1.0


register(
    RopeType(
        name="axial",
        inv_freq=_axial,
        scheme="rope_axial",
        title="Axial 2-D RoPE (image patches: rows and columns)",
        summary="RoPE for vision patches with position ids [2, B, S] (row, column): the first half of the "
        "frequency slots rotate by the row, the second by the column, recombined cat(h, w) then cat(hw, hw). "
        "Columns use the rows' frequencies (Qwen2-VL vision) or the odd ones (Pixtral). Vision configs label it "
        "'axial' but each model recombines its own way, so config.json import leaves it to you.",
        citation=Citation(
            "Heo, Park, Han and Yun",
            "Rotary Position Embedding for Vision Transformer",
            2024,
            "https://arxiv.org/abs/2403.13298",
        ),
        params=(
            Param(
                "column_freqs",
                "str",
                "same",
                "same: columns rotate with the rows' frequencies (Qwen2-VL vision); odd: with θ^(-(4j+2)/r) (Pixtral)",
                choices=AXIAL_COLUMNS,
            ),
        ),
        in_transformers=False,
        position_axes=2,
        slot_axes=axial_slot_axes,
        cases={"pixtral": {"column_freqs": "odd"}},
        reference="transformers' Qwen2VLVisionRotaryEmbedding and PixtralVisionRotaryEmbedding with rotate_half",
    )
)
