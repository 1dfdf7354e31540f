"""Built-in ``rope_type`` functions that stretch one base: ``default``, ``linear``, ``ntk``, ``dynamic``, ``yarn``.

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
    at_least,
    context_ratio_factor,
    default_inv_freq,
    default_type_inv_freq,
    device_of,
    factor_param,
    finite,
    needs_wide_rotary,
    ntk_exponent,
    original_context,
    positive,
    positive_int,
    require,
    static_ntk,
)
from posenc.rope_types.registry import RopeType, register

__all__ = ["ROFORMER", "dynamic_ntk_base", "yarn_get_mscale"]

ROFORMER = Citation(
    "Su et al.",
    "RoFormer: Enhanced Transformer with Rotary Position Embedding",
    2021,
    "https://arxiv.org/abs/2104.09864",
)


# --------------------------------------------------------------------------------------------------
# default
# --------------------------------------------------------------------------------------------------


register(
    RopeType(
        name="default",
        inv_freq=default_type_inv_freq,
        scheme="rope",
        title="RoPE",
        summary="Rotary position embedding (rotate q and k).",
        citation=ROFORMER,
        cases={"interleaved_partial": {"layout": "interleaved", "partial_rotary_factor": 0.5}},
        reference=HF_REFERENCE,
    )
)


# --------------------------------------------------------------------------------------------------
# linear: position interpolation
# --------------------------------------------------------------------------------------------------


def _linear(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen) -> tuple[torch.Tensor, float]:
    return default_inv_freq(rotary_dim, base) / factor_param(params, "linear"), 1.0


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
        reference=HF_REFERENCE,
    )
)


# --------------------------------------------------------------------------------------------------
# ntk: static NTK-aware base
# --------------------------------------------------------------------------------------------------


_ntk = static_ntk("factor", "ntk")


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
    factor = factor_param(params, "dynamic")
    max_pos = positive_int(require(params, "max_position_embeddings", "dynamic"), "max_position_embeddings")
    needs_wide_rotary(rotary_dim, "dynamic NTK scaling")
    length: Any = max_pos if seq_len is None else seq_len
    length = length.to(torch.float64) if isinstance(length, torch.Tensor) else int(length)
    scaled = dynamic_ntk_base(base, factor, length, max_pos, rotary_dim)
    return default_inv_freq(rotary_dim, scaled, device_of(seq_len)), 1.0


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
        reference=HF_REFERENCE,
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
    original = original_context(params, "yarn", fallback="max_position_embeddings")
    factor = context_ratio_factor(params, "yarn", original)
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
                **POSITIVE_OPTIONAL,
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
            Param("attention_factor", "float", None, "cos/sin multiplier (default 0.1 ln s + 1)", **POSITIVE_OPTIONAL),
            Param("truncate", "bool", True, "floor/ceil the correction range (Hugging Face default)"),
        ),
        geometry_defaults=lambda p, r: {"original_max_position_embeddings": p["max_position_embeddings"]},
        cases={"deepseek_mscale": {"mscale": 0.707, "mscale_all_dim": 0.707, "factor": 40.0}},
        boundaries=lambda p: (original_context(p, "yarn", "max_position_embeddings"),),
        reference=HF_REFERENCE,
    )
)
