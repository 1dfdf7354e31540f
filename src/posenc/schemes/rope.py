"""Rotary schemes: RoPE with every scaling type, ReRoPE / Leaky ReRoPE, RoPE inside linear attention.

All of them share one cos/sin source (:class:`RotaryAngles` and its data-dependent variants): a
precomputed float64-exact table gathered by position ids, or angles computed from the positions with
float32-exact range reduction (:func:`posenc.functional.exact_angles`), exact up to position 2**24.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from posenc import functional as PF
from posenc.config import AttentionConfig
from posenc.errors import ConfigError
from posenc.schemes import register
from posenc.schemes.base import (
    Param,
    Placement,
    PositionalScheme,
    SchemeSpec,
    TableHolder,
    TableMode,
    Tolerance,
    causal_mask,
    soft_cap,
    softmax_attention,
)

_BOTH = frozenset({TableMode.PRECOMPUTED, TableMode.DYNAMIC})
ROFORMER = "Su et al., RoFormer: Enhanced Transformer with Rotary Position Embedding, arXiv:2104.09864 (2021)"


# --------------------------------------------------------------------------------------------------
# cos/sin sources
# --------------------------------------------------------------------------------------------------


class RotaryAngles(TableHolder):
    """cos/sin of ``angle(p) = p * inv_freq + phase`` (times ``attention_factor``) for integer positions p.

    ``precomputed``: tables ``[max_positions, r/2]`` computed in float64, stored in ``table_dtype``.
    ``dynamic``: float32-exact angles from the positions (float64 angles when ``table_dtype`` is float64).
    """

    def __init__(
        self,
        inv_freq: torch.Tensor,
        attention_factor: float,
        table_mode: TableMode,
        max_positions: int,
        table_dtype: torch.dtype,
        phase: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        inv_freq = inv_freq.to(torch.float64)
        phase = torch.zeros_like(inv_freq) if phase is None else phase.to(torch.float64)
        self.table_mode = table_mode
        self.table_dtype = table_dtype
        self.attention_factor = float(attention_factor)
        self.has_phase = bool(phase.abs().max() > 0) if phase.numel() else False
        if table_mode is TableMode.PRECOMPUTED:
            positions = torch.arange(max_positions, dtype=torch.float64).unsqueeze(-1)
            angles = positions * inv_freq + phase
            self.register_table("cos_table", (torch.cos(angles) * self.attention_factor).to(table_dtype))
            self.register_table("sin_table", (torch.sin(angles) * self.attention_factor).to(table_dtype))
        elif table_dtype == torch.float64:
            self.register_table("inv_freq", inv_freq)
            self.register_table("phase", phase)
        else:
            self.register_table("turns", PF.split_turns(inv_freq))
            self.register_table("phase", torch.remainder(phase, 2 * math.pi).to(torch.float32))

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``position_ids [...]`` int64 -> ``(cos, sin)`` each ``[..., r/2]`` in ``table_dtype``."""
        if self.table_mode is TableMode.PRECOMPUTED:
            return F.embedding(position_ids, self.cos_table), F.embedding(position_ids, self.sin_table)
        if self.table_dtype == torch.float64:
            angles = position_ids.to(torch.float64).unsqueeze(-1) * self.inv_freq + self.phase
        else:
            angles = PF.exact_angles(position_ids, self.turns)
            if self.has_phase:
                angles = angles + self.phase
        cos, sin = torch.cos(angles), torch.sin(angles)
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(self.table_dtype), sin.to(self.table_dtype)


class LongRopeAngles(TableHolder):
    """LongRoPE: short factors while ``max(position) + 1 <= original_max_position_embeddings``, long after.

    The switch is computed in the graph from the positions of the call (Hugging Face semantics: one
    choice for the whole batch), so an exported graph switches factor sets by itself.
    """

    def __init__(self, short: RotaryAngles, long: RotaryAngles, original_max_position_embeddings: int) -> None:
        super().__init__()
        self.short = short
        self.long = long
        self.original = int(original_max_position_embeddings)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        use_long = (position_ids.max() + 1) > self.original
        cos_s, sin_s = self.short(position_ids)
        cos_l, sin_l = self.long(position_ids)
        return torch.where(use_long, cos_l, cos_s), torch.where(use_long, sin_l, sin_s)


class DynamicNtkAngles(TableHolder):
    """Dynamic NTK: the base grows with the current length ``L = max(position) + 1`` (in the graph).

    ``base' = base * (factor * L / M - (factor - 1)) ** (r / (r - 2))`` with ``L = max(L, M)``, M the
    model's ``max_position_embeddings``. Frequencies are computed in float64 and split for exact float32
    angles. Stateless: equals Hugging Face's cached update whenever the length only grows (prefill, decode).
    """

    def __init__(
        self,
        rotary_dim: int,
        base: float,
        factor: float,
        max_position_embeddings: int,
        table_dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.table_dtype = table_dtype
        self.base = float(base)
        self.factor = float(factor)
        self.max_len = int(max_position_embeddings)
        self.power = rotary_dim / (rotary_dim - 2)
        self.register_table("exponents", torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)

    def inv_freq(self, position_ids: torch.Tensor) -> torch.Tensor:
        """float64 ``[r/2]`` frequencies for the length these positions imply."""
        length = (position_ids.max() + 1).to(torch.float64).clamp(min=self.max_len)
        scaled = self.base * (self.factor * length / self.max_len - (self.factor - 1)) ** self.power
        return 1.0 / torch.pow(scaled, self.exponents)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = self.inv_freq(position_ids)
        if self.table_dtype == torch.float64:
            angles = position_ids.to(torch.float64).unsqueeze(-1) * inv_freq
        else:
            angles = PF.exact_angles(position_ids, PF.split_turns(inv_freq))
        return torch.cos(angles).to(self.table_dtype), torch.sin(angles).to(self.table_dtype)


# --------------------------------------------------------------------------------------------------
# Parameters shared by the RoPE family
# --------------------------------------------------------------------------------------------------

_COMMON = (
    Param(
        "rope_theta",
        "float",
        10000.0,
        "RoPE base θ (frequencies θ^(-2i/r))",
        minimum=0,
        exclusive_minimum=True,
    ),
    Param(
        "layout",
        "str",
        "half",
        "pairing: half = GPT-NeoX/Llama rotate_half, interleaved = GPT-J/RoFormer",
        choices=PF.ROPE_LAYOUTS,
    ),
    Param(
        "partial_rotary_factor",
        "float",
        1.0,
        "fraction of head_dim that is rotated (rest passes through)",
        minimum=0,
        exclusive_minimum=True,
        maximum=1.0,
    ),
)


def rotary_dim_of(head_dim: int, partial_rotary_factor: float) -> int:
    """Rotated width r = int(head_dim * partial_rotary_factor); must be even and >= 2."""
    r = int(head_dim * partial_rotary_factor)
    if r < 2 or r % 2:
        raise ConfigError(
            f"head_dim {head_dim} x partial_rotary_factor {partial_rotary_factor} gives rotary_dim {r}; RoPE "
            f"needs an even rotary_dim >= 2. Choose a factor that makes head_dim * factor even."
        )
    return r


def _rope_params(rope_type: str, params: Mapping[str, Any], config: AttentionConfig) -> dict[str, Any]:
    """Hugging Face style rope_parameters for :func:`posenc.functional.rope_inv_freq`, defaults filled."""
    r = rotary_dim_of(config.head_dim, params["partial_rotary_factor"])
    out: dict[str, Any] = {
        "rope_type": rope_type,
        "rope_theta": params["rope_theta"],
        "max_position_embeddings": config.max_position_embeddings,
    }
    for key, value in params.items():
        if key in PF.ROPE_PARAMETER_KEYS and key not in ("partial_rotary_factor", "rope_theta") and value is not None:
            out[key] = value
    if rope_type in ("yarn", "llama3") and out.get("original_max_position_embeddings") is None:
        out["original_max_position_embeddings"] = config.max_position_embeddings
    if rope_type == "longrope":
        if out.get("original_max_position_embeddings") is None:
            out["original_max_position_embeddings"] = max(1, config.max_position_embeddings // 4)
        factor = out.get("factor") or config.max_position_embeddings / out["original_max_position_embeddings"]
        half = r // 2
        if out.get("short_factor") is None:
            out["short_factor"] = [1.0] * half
        if out.get("long_factor") is None:
            out["long_factor"] = [max(factor, 1.0) ** (i / max(half - 1, 1)) for i in range(half)]
        out["short_factor"] = list(out["short_factor"])
        out["long_factor"] = list(out["long_factor"])
    return out


def _validate_rope(rope_type: str) -> Callable[[dict[str, Any], AttentionConfig], None]:
    def check(params: dict[str, Any], config: AttentionConfig) -> None:
        r = rotary_dim_of(config.head_dim, params["partial_rotary_factor"])
        hf = _rope_params(rope_type, params, config)
        PF.rope_inv_freq(r, hf, seq_len=config.max_position_embeddings)

    return check


def build_rope_angles(
    rope_type: str,
    params: Mapping[str, Any],
    config: AttentionConfig,
    table_mode: TableMode,
    max_positions: int,
    table_dtype: torch.dtype,
) -> TableHolder:
    """The cos/sin source for a RoPE scaling type (static, LongRoPE switching or dynamic NTK)."""
    r = rotary_dim_of(config.head_dim, params["partial_rotary_factor"])
    hf = _rope_params(rope_type, params, config)
    if rope_type == "dynamic":
        if table_mode is not TableMode.DYNAMIC:
            raise ConfigError("dynamic NTK depends on the current length; it exists only in table mode 'dynamic'.")
        return DynamicNtkAngles(r, hf["rope_theta"], hf["factor"], config.max_position_embeddings, table_dtype)
    if rope_type == "longrope":
        original = int(hf["original_max_position_embeddings"])
        short_f, short_af = PF.rope_inv_freq(r, hf, seq_len=None)
        long_f, long_af = PF.rope_inv_freq(r, hf, seq_len=original + 1)
        return LongRopeAngles(
            RotaryAngles(short_f, short_af, table_mode, max_positions, table_dtype),
            RotaryAngles(long_f, long_af, table_mode, max_positions, table_dtype),
            original,
        )
    inv_freq, attention_factor = PF.rope_inv_freq(r, hf)
    return RotaryAngles(inv_freq, attention_factor, table_mode, max_positions, table_dtype)


# --------------------------------------------------------------------------------------------------
# RoPE (qk placement)
# --------------------------------------------------------------------------------------------------


class Rotary(PositionalScheme):
    """RoPE: rotate q and k by position-dependent angles so that ⟨R_m q, R_n k⟩ depends on m - n only.

    Shapes: q ``[B, H, S, D]``, k ``[B, Hkv, S, D]``, position_ids ``[B, S]``; cos/sin ``[B, S, r/2]``.
    """

    rope_type = "default"

    def build(self) -> None:
        self.layout = self.params["layout"]
        self.rotary_dim = rotary_dim_of(self.config.head_dim, self.params["partial_rotary_factor"])
        self.angles = build_rope_angles(
            self.rope_type, self.params, self.config, self.table_mode, self.max_positions, self.table_dtype
        )

    def cos_sin(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``position_ids [B, S]`` -> cos, sin ``[B, S, r/2]`` (attention factor included)."""
        self.check_positions(position_ids)
        return self.angles(position_ids)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin(position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return (
            PF.apply_rope(q, cos, sin, self.layout, self.rotary_dim),
            PF.apply_rope(k, cos, sin, self.layout, self.rotary_dim),
        )


_ROPE_CASES = {
    "default": {},
    "interleaved": {"layout": "interleaved"},
    "partial": {"partial_rotary_factor": 0.5},
    "interleaved_partial": {"layout": "interleaved", "partial_rotary_factor": 0.5},
}

_SCALINGS: tuple[tuple[str, str, str, tuple[Param, ...], frozenset[TableMode], str, dict[str, Any]], ...] = (
    (
        "default",
        "rope",
        "RoPE",
        (),
        _BOTH,
        "Rotary position embedding; the standard of Llama, GPT-NeoX, GPT-J, Qwen, Mistral.",
        {},
    ),
    (
        "linear",
        "rope_linear",
        "RoPE + linear position interpolation (PI)",
        (
            Param(
                "factor",
                "float",
                4.0,
                "positions are divided by this factor",
                minimum=0,
                exclusive_minimum=True,
            ),
        ),
        _BOTH,
        "Chen et al. (2023) position interpolation: inv_freq / factor.",
        {},
    ),
    (
        "ntk",
        "rope_ntk",
        "RoPE + static NTK-aware scaling",
        (
            Param(
                "factor",
                "float",
                4.0,
                "context extension k; base *= k^(r/(r-2))",
                minimum=0,
                exclusive_minimum=True,
            ),
        ),
        _BOTH,
        "NTK-aware scaled RoPE (bloc97, 2023): the base grows so the lowest frequency is interpolated by k.",
        {},
    ),
    (
        "dynamic",
        "rope_dynamic",
        "RoPE + dynamic NTK scaling (in-graph)",
        (Param("factor", "float", 2.0, "scaling factor of dynamic NTK", minimum=0, exclusive_minimum=True),),
        frozenset({TableMode.DYNAMIC}),
        "Dynamic NTK (emozilla, 2023): the base is recomputed from the current length inside the graph.",
        {},
    ),
    (
        "yarn",
        "rope_yarn",
        "RoPE + YaRN",
        (
            Param(
                "factor",
                "float",
                4.0,
                "context extension factor s (None: max_position_embeddings / original_max_position_embeddings)",
                minimum=0,
                exclusive_minimum=True,
                optional=True,
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
                "beta_fast",
                "float",
                32.0,
                "rotations above which dims extrapolate",
                minimum=0,
                exclusive_minimum=True,
            ),
            Param(
                "beta_slow",
                "float",
                1.0,
                "rotations below which dims interpolate",
                minimum=0,
                exclusive_minimum=True,
            ),
            Param("mscale", "float", None, "DeepSeek mscale (numerator of attention_factor)", optional=True),
            Param("mscale_all_dim", "float", None, "DeepSeek mscale_all_dim (denominator)", optional=True),
            Param(
                "attention_factor",
                "float",
                None,
                "cos/sin multiplier (default 0.1 ln s + 1)",
                optional=True,
                minimum=0,
                exclusive_minimum=True,
            ),
            Param("truncate", "bool", True, "floor/ceil the correction range (Hugging Face default)"),
        ),
        _BOTH,
        "Peng et al., YaRN: Efficient Context Window Extension of Large Language Models, arXiv:2309.00071.",
        {"deepseek_mscale": {"mscale": 0.707, "mscale_all_dim": 0.707, "factor": 40.0}},
    ),
    (
        "longrope",
        "rope_longrope",
        "RoPE + LongRoPE (short/long factors switched in-graph)",
        (
            Param(
                "factor",
                "float",
                None,
                "scaling factor (default max_position_embeddings / original)",
                optional=True,
                minimum=0,
                exclusive_minimum=True,
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
                "short_factor",
                "floats",
                None,
                "r/2 per-frequency divisors below the switch (default 1)",
                optional=True,
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
                optional=True,
                minimum=0,
                exclusive_minimum=True,
            ),
        ),
        _BOTH,
        "Ding et al., LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens, arXiv:2402.13753.",
        {},
    ),
    (
        "llama3",
        "rope_llama3",
        "RoPE + Llama-3 frequency bands",
        (
            Param("factor", "float", 8.0, "divisor of low frequencies", minimum=0, exclusive_minimum=True),
            Param("low_freq_factor", "float", 1.0, "low-frequency band edge", minimum=0, exclusive_minimum=True),
            Param(
                "high_freq_factor",
                "float",
                4.0,
                "high-frequency band edge",
                minimum=0,
                exclusive_minimum=True,
            ),
            Param(
                "original_max_position_embeddings",
                "int",
                None,
                "pretraining context (default: the config's max_position_embeddings)",
                optional=True,
                minimum=1,
            ),
        ),
        _BOTH,
        "Meta Llama 3.1 RoPE scaling (Dubey et al., The Llama 3 Herd of Models, arXiv:2407.21783).",
        {"short_context": {"original_max_position_embeddings": 64}},
    ),
    (
        "truncation",
        "rope_truncation",
        "RoPE + base truncation",
        (
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
        _BOTH,
        "Base truncation (Pal et al., Giraffe, arXiv:2308.10882; RUC LLM survey §5.4).",
        {},
    ),
)


def _rope_tolerances() -> dict[str, Tolerance]:
    return {
        "float32": Tolerance(atol=3e-5, rtol=1e-4),
        "float16": Tolerance(atol=4e-3, rtol=4e-3),
        "bfloat16": Tolerance(atol=3e-2, rtol=3e-2),
    }


for _rope_type, _name, _title, _extra, _modes, _cite, _cases in _SCALINGS:
    _cls = type(f"Rotary_{_rope_type}", (Rotary,), {"rope_type": _rope_type, "__doc__": Rotary.__doc__})
    globals()[_cls.__name__] = _cls  # a module-level name, so built schemes and blocks pickle (torch.save)
    _spec = SchemeSpec(
        name=_name,
        title=_title,
        family="rope",
        placement=Placement.QK,
        params=(*_COMMON, *_extra),
        table_modes=_modes,
        citation=f"{ROFORMER}; {_cite}" if _rope_type != "default" else ROFORMER,
        summary=_cite if _rope_type != "default" else "Rotary position embedding (rotate q and k).",
        tolerances=_rope_tolerances(),
        cases={**_ROPE_CASES, **_cases}
        if _rope_type == "default"
        else {
            "default": {},
            "partial": {"partial_rotary_factor": 0.5},
            "interleaved": {"layout": "interleaved"},
            **_cases,
        },
        validate=_validate_rope(_rope_type),
        length_dependent=_rope_type in ("dynamic", "longrope"),
        verified_against="Hugging Face transformers modeling_rope_utils (ROPE_INIT_FUNCTIONS), ONNX RotaryEmbedding-23",
    )
    _cls.spec = _spec
    register(_spec, _cls)


# --------------------------------------------------------------------------------------------------
# ReRoPE and Leaky ReRoPE (attention placement: two score matrices)
# --------------------------------------------------------------------------------------------------


class ReRope(PositionalScheme):
    """ReRoPE / Leaky ReRoPE: relative position t kept within the window w, compressed beyond it.

    ``g(t) = t`` for ``|t| < w``; ``sign(t) * (w + (|t| - w) / k)`` beyond (Leaky ReRoPE with factor k;
    ReRoPE is k = ∞, i.e. ``sign(t) * w``). Implemented with two score matrices (three when
    bidirectional): normal RoPE inside the window, and q rotated at ``i/k ± w(1 - 1/k)`` against k rotated
    at ``j/k`` outside, selected per (i, j). Shapes: q, k, v ``[B, H, S, D]``; positions ``[B, S]``.
    """

    leaky = False

    def build(self) -> None:
        self.layout = self.params["layout"]
        self.window = int(self.params["window"])
        self.rotary_dim = rotary_dim_of(self.config.head_dim, self.params["partial_rotary_factor"])
        inv_freq, _ = PF.rope_inv_freq(self.rotary_dim, {"rope_theta": self.params["rope_theta"]})
        inverse_k = 1.0 / self.params["factor"] if self.leaky else 0.0
        shift = inv_freq * (self.window * (1.0 - inverse_k))

        def angles(freq: torch.Tensor, phase: torch.Tensor | None = None) -> RotaryAngles:
            return RotaryAngles(freq, 1.0, self.table_mode, self.max_positions, self.table_dtype, phase=phase)

        self.near = angles(inv_freq)
        self.far_q = angles(inv_freq * inverse_k, shift)
        self.far_q_neg = angles(inv_freq * inverse_k, -shift)
        self.far_k = angles(inv_freq * inverse_k)

    def _rot(self, x: torch.Tensor, source: RotaryAngles, pos: torch.Tensor) -> torch.Tensor:
        cos, sin = source(pos)
        return PF.apply_rope(x, cos.unsqueeze(1), sin.unsqueeze(1), self.layout, self.rotary_dim)

    def scores(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool
    ) -> torch.Tensor:
        """Scaled scores ``[B, H, Sq, Sk]`` (before masking), computed in float32 (float64 for float64)."""
        self.check_positions(q_pos)
        self.check_positions(k_pos)
        compute = torch.float64 if q.dtype == torch.float64 else torch.float32
        q, k = q.to(compute), k.to(compute)
        near = self._rot(q, self.near, q_pos) @ self._rot(k, self.near, k_pos).transpose(-1, -2)
        k_far = self._rot(k, self.far_k, k_pos).transpose(-1, -2)
        far = self._rot(q, self.far_q, q_pos) @ k_far
        distance = (q_pos.unsqueeze(2) - k_pos.unsqueeze(1)).unsqueeze(1)  # i - j, [B, 1, Sq, Sk]
        scores = torch.where(distance >= self.window, far, near)
        if not causal:
            far_neg = self._rot(q, self.far_q_neg, q_pos) @ k_far
            scores = torch.where(distance <= -self.window, far_neg, scores)
        return scores * self.score_scale()

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        causal: bool,
    ) -> torch.Tensor:
        scores = soft_cap(self.scores(q, k, q_pos, k_pos, causal), self.config.logit_softcap)
        mask = self.visible(q_pos, k_pos, causal)
        return softmax_attention(scores, v.to(scores.dtype), mask).to(v.dtype)


class LeakyReRope(ReRope):
    __doc__ = ReRope.__doc__
    leaky = True


_WINDOW = Param("window", "int", 512, "window w: exact relative positions for |i - j| < w", minimum=1)
_RE_CASES = {"default": {"window": 6}, "interleaved": {"window": 5, "layout": "interleaved"}}
_REROPE_CITE = (
    "Su, Transformer升级之路 12: 无限外推的ReRoPE? (kexue.fm/archives/9708, 2023); RUC LLM survey §5.4 "
    "(positional truncation)"
)

ReRope.spec = SchemeSpec(
    name="rerope",
    title="ReRoPE (window-truncated relative positions)",
    family="rope",
    placement=Placement.ATTENTION,
    params=(*_COMMON, _WINDOW),
    table_modes=_BOTH,
    citation=_REROPE_CITE,
    summary="RoPE whose relative position is clipped to the window w beyond it; two score matrices.",
    tolerances=_rope_tolerances(),
    cases=_RE_CASES,
    validate=lambda p, c: rotary_dim_of(c.head_dim, p["partial_rotary_factor"]) and None,
    verified_against="naive per-(i, j) rotation by g(i - j) (seed 001 formula)",
)
LeakyReRope.spec = SchemeSpec(
    name="leaky_rerope",
    title="Leaky ReRoPE",
    family="rope",
    placement=Placement.ATTENTION,
    params=(
        *_COMMON,
        _WINDOW,
        Param(
            "factor",
            "float",
            16.0,
            "k: beyond the window relative positions grow 1/k as fast; k = (T'_max - w) / (T_max - w)",
            minimum=1.0,
            exclusive_minimum=True,
        ),
    ),
    table_modes=_BOTH,
    citation=_REROPE_CITE,
    summary="ReRoPE that keeps growing beyond the window with slope 1/k (linear interpolation of far positions).",
    tolerances=_rope_tolerances(),
    cases={
        "default": {"window": 6, "factor": 4.0},
        "interleaved": {"window": 5, "factor": 3.0, "layout": "interleaved"},
    },
    validate=lambda p, c: rotary_dim_of(c.head_dim, p["partial_rotary_factor"]) and None,
    verified_against="naive per-(i, j) rotation by g(i - j) (seed 001 formula)",
)
register(ReRope.spec, ReRope)
register(LeakyReRope.spec, LeakyReRope)


# --------------------------------------------------------------------------------------------------
# RoPE inside linear attention (eq. 29 of seed 004)
# --------------------------------------------------------------------------------------------------


class RopeLinearAttention(PositionalScheme):
    """Linear attention with RoPE in the numerator only (Su, RoFormer eq. 29).

    ``out_i = Σ_j [R_i φ(q_i)]ᵀ [R_j φ(k_j)] v_j / Σ_j φ(q_i)ᵀ φ(k_j)`` with φ = elu + 1, the sums over
    j <= i when causal. Computed in the quadratic form (exact); :meth:`attend_recurrent` is the O(S)
    form. Shapes: q, k, v ``[B, H, S, D]``; positions ``[B, S]``.
    """

    def build(self) -> None:
        self.layout = self.params["layout"]
        self.rotary_dim = rotary_dim_of(self.config.head_dim, self.params["partial_rotary_factor"])
        inv_freq, _ = PF.rope_inv_freq(self.rotary_dim, {"rope_theta": self.params["rope_theta"]})
        self.angles = RotaryAngles(inv_freq, 1.0, self.table_mode, self.max_positions, self.table_dtype)

    @staticmethod
    def feature_map(x: torch.Tensor) -> torch.Tensor:
        """φ(x) = elu(x) + 1 (non-negative), Katharopoulos et al. 2020."""
        return F.elu(x) + 1.0

    def _rot(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cos, sin = self.angles(pos)
        return PF.apply_rope(x, cos.unsqueeze(1), sin.unsqueeze(1), self.layout, self.rotary_dim)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        causal: bool,
    ) -> torch.Tensor:
        self.check_positions(q_pos)
        self.check_positions(k_pos)
        compute = torch.float64 if q.dtype == torch.float64 else torch.float32
        qf, kf, vc = self.feature_map(q.to(compute)), self.feature_map(k.to(compute)), v.to(compute)
        numerator = self._rot(qf, q_pos) @ self._rot(kf, k_pos).transpose(-1, -2)
        denominator = qf @ kf.transpose(-1, -2)
        if causal:
            keep = causal_mask(q_pos, k_pos).to(compute)
            numerator, denominator = numerator * keep, denominator * keep
        out = (numerator @ vc) / denominator.sum(-1, keepdim=True)
        return out.to(v.dtype)

    def attend_recurrent(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Causal O(S) form: running sums of ``R_j φ(k_j) v_jᵀ`` and ``φ(k_j)`` (q, k, v share positions)."""
        compute = torch.float64 if q.dtype == torch.float64 else torch.float32
        qf, kf, vc = self.feature_map(q.to(compute)), self.feature_map(k.to(compute)), v.to(compute)
        qr, kr = self._rot(qf, position_ids), self._rot(kf, position_ids)
        state = torch.cumsum(kr.unsqueeze(-1) * vc.unsqueeze(-2), dim=2)  # [B, H, S, D, Dv]
        norm = torch.cumsum(kf, dim=2)  # [B, H, S, D]
        numerator = (qr.unsqueeze(-2) @ state).squeeze(-2)
        denominator = (qf * norm).sum(-1, keepdim=True)
        return (numerator / denominator).to(v.dtype)


def _validate_linear_attention(params: dict, config: AttentionConfig) -> None:
    rotary_dim_of(config.head_dim, params["partial_rotary_factor"])
    softmax_only = {
        name: getattr(config, name)
        for name in ("attn_scale", "logit_softcap", "sliding_window")
        if getattr(config, name)
    }
    if softmax_only:
        raise ConfigError(
            f"rope_linear_attention has no softmax scores for {sorted(softmax_only)} to act on (φ(q)·φ(k) is "
            f"normalised by its own sum); leave them unset, or use a softmax scheme such as 'rope'."
        )


RopeLinearAttention.spec = SchemeSpec(
    name="rope_linear_attention",
    title="RoPE in linear attention",
    family="rope",
    placement=Placement.ATTENTION,
    params=_COMMON,
    table_modes=_BOTH,
    citation=f"{ROFORMER}, eq. 29; Katharopoulos et al., Transformers are RNNs, ICML 2020 (φ = elu + 1)",
    summary="Linear attention with RoPE only in the numerator; the only relative scheme linear attention admits.",
    tolerances={
        "float32": Tolerance(atol=5e-5, rtol=2e-4),
        "float16": Tolerance(atol=6e-3, rtol=6e-3),
        "bfloat16": Tolerance(atol=4e-2, rtol=4e-2),
    },
    cases={"default": {}, "interleaved": {"layout": "interleaved"}},
    validate=_validate_linear_attention,
    verified_against="eq. 29 of seed 004 computed per query with explicit loops; the O(S) recurrent form",
)
register(RopeLinearAttention.spec, RopeLinearAttention)
