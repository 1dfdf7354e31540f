"""What one RoPE kernel instance computes: angle source, positions, layout, rotary width, scaling constants.

Pure Python (no triton, no tensorrt): the launcher, the PTX compiler, the TensorRT plugin, the ONNX Runtime
twin and the graph pass all describe a kernel with a :class:`RopeKernelSpec` and validate it here once.

Plugin kinds (one TensorRT plugin per input signature, all in namespace ``posenc``):

=================  =====================================  ==========================================
plugin (op_type)   inputs                                 cos/sin come from
=================  =====================================  ==========================================
PosencRope         q, k, cos_table, sin_table, positions  tables ``[max_pos, r/2]`` gathered by position
PosencRopeCache    q, k, cos, sin                         per-token caches ``[B, S, r/2]``
PosencRopeFreq     q, k, turns, positions                 in-kernel from split frequencies (any static type)
PosencRopeNtk      q, k, positions                        in-kernel dynamic NTK from each row's length
=================  =====================================  ==========================================

Outputs are always ``(q_rotated, k_rotated)`` with the shapes and dtypes of q and k.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import struct
from collections.abc import Mapping
from typing import Any

from posenc import rope_types
from posenc.errors import ConfigError
from posenc.functional import RANGE_REDUCTION_MAX_POSITION, ROPE_LAYOUTS, rope_inv_freq

__all__ = [
    "ACTIVATION_DTYPES",
    "MAX_HEAD_DIM",
    "NTK_ROPE_TYPE",
    "PLUGIN_NAMESPACE",
    "PLUGIN_VERSION",
    "TABLE_DTYPES",
    "TACTICS",
    "AngleSource",
    "PositionMode",
    "QKFormat",
    "RopeKernelSpec",
    "check_dtype",
    "next_power_of_2",
]

PLUGIN_NAMESPACE = "posenc"
PLUGIN_VERSION = "1"
MAX_HEAD_DIM = 1024
"""Largest head dim one program holds in registers (a head row is one block)."""

ACTIVATION_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
TABLE_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")

NTK_ROPE_TYPE = "dynamic"
"""The ``rope_type`` whose frequencies ``AngleSource.NTK`` computes in the kernel (from each row's length)."""

TACTICS: Mapping[int, tuple[int, int]] = {1: (2, 1), 2: (4, 1), 3: (8, 2), 4: (16, 4), 5: (32, 8)}
"""TensorRT tactic id -> (heads per program ``BLOCK_H``, warps). TensorRT times them and keeps the fastest."""


class AngleSource(str, enum.Enum):
    """Where a kernel gets cos/sin."""

    TABLE = "table"
    """cos/sin tables ``[max_pos, r/2]`` (any float dtype) gathered by position."""
    CACHE = "cache"
    """cos/sin already per token, ``[B, S, r/2]`` (what ``RotaryEmbedding`` takes without position ids)."""
    FREQ = "freq"
    """Computed in the kernel from :func:`posenc.functional.split_turns` pieces ``[3, r/2]`` float32 (or
    ``[2, 3, r/2]``: LongRoPE short and long sets) and ``attention_factor``: every static scaling type."""
    NTK = "ntk"
    """Dynamic NTK computed in the kernel (float64) from each sequence's length; no tensor input."""

    @property
    def plugin_name(self) -> str:
        return _PLUGIN_NAMES[self]

    @property
    def inputs(self) -> tuple[str, ...]:
        """Names of the plugin's tensor inputs, in order (the outputs are ``q_out, k_out``)."""
        return _PLUGIN_INPUTS[self]

    @property
    def uses_positions(self) -> bool:
        return self is not AngleSource.CACHE


class PositionMode(str, enum.Enum):
    """How positions are given."""

    IDS = "ids"
    """Position ids ``[B, S]`` (or ``[1, S]``, shared by the batch), int64 or int32."""
    OFFSET = "offset"
    """One start offset per sequence ``[B]`` (or ``[1]``): position = offset + s (decode with a past length)."""


class QKFormat(str, enum.Enum):
    """Axis order of q and k."""

    BHSD = "bhsd"
    """``[B, H, S, D]``: posenc's module convention and TensorRT's native rotary layer."""
    BSHD = "bshd"
    """``[B, S, H, D]``: the projection output before the head transpose (``[B, S, H*D]`` reshaped)."""


_PLUGIN_NAMES = {
    AngleSource.TABLE: "PosencRope",
    AngleSource.CACHE: "PosencRopeCache",
    AngleSource.FREQ: "PosencRopeFreq",
    AngleSource.NTK: "PosencRopeNtk",
}
_PLUGIN_INPUTS = {
    AngleSource.TABLE: ("q", "k", "cos_table", "sin_table", "positions"),
    AngleSource.CACHE: ("q", "k", "cos", "sin"),
    AngleSource.FREQ: ("q", "k", "turns", "positions"),
    AngleSource.NTK: ("q", "k", "positions"),
}


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (>= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def check_dtype(dtype_name: str, allowed: tuple[str, ...], what: str) -> str:
    """Return ``dtype_name`` if allowed, else raise :class:`ConfigError` naming the allowed dtypes."""
    if dtype_name not in allowed:
        raise ConfigError(
            f"the posenc RoPE kernel does not support {what} of dtype {dtype_name}; supported: {list(allowed)}. "
            f"Cast {what} to one of them (math runs in float32 either way)."
        )
    return dtype_name


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite_positive(value: Any, name: str, why: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number ({why}), got {value!r}.") from None
    if not math.isfinite(number) or number <= 0:
        raise ConfigError(f"{name} must be a finite number > 0 ({why}), got {value!r}.")
    return number


@dataclasses.dataclass(frozen=True)
class RopeKernelSpec:
    """One configuration of the fused q/k RoPE kernel.

    Args:
        angles: where cos/sin come from (:class:`AngleSource`).
        rotary_dim: rotated width r (even, 2 <= r <= head_dim); features past r are copied through.
        head_dim: D, the last axis of q and k.
        layout: ``"half"`` (pairs (i, i + r/2), GPT-NeoX/Llama) or ``"interleaved"`` (pairs (2i, 2i+1), GPT-J).
        positions: :class:`PositionMode` (ignored for ``CACHE``).
        attention_factor: ``FREQ`` only: multiplied into cos and sin (YaRN, LongRoPE).
        longrope_original: ``FREQ`` only: if > 0, ``turns`` holds two sets ``[2, 3, r/2]`` and a row whose
            length (max position + 1) exceeds this uses the second (long) set.
        rope_theta, factor, max_position_embeddings: ``NTK`` only: Hugging Face's dynamic NTK parameters.
        rotary_offset: first rotated feature of q's heads (MLA's decoupled RoPE: the rope part follows
            ``qk_nope_head_dim`` position-free features, which are copied); k rotates from feature 0.
        key_head_dim: k's head dim (default ``head_dim``; MLA's shared key slice is only the rope part).
        mrope_section: multi-axis positions ``[A, B|1, S]`` (position ids, TABLE or FREQ): the frequency slots of
            each axis, summing to r/2 — M-RoPE's ``(t, h, w)`` or axial RoPE's ``(rows, columns)``; empty: one axis.
        mrope_interleaved: the slots interleave t,h,w,t,h,w,... (Qwen3-VL) instead of following in chunks.
    """

    angles: AngleSource
    rotary_dim: int
    head_dim: int
    layout: str = "half"
    positions: PositionMode = PositionMode.IDS
    attention_factor: float = 1.0
    longrope_original: int = 0
    rope_theta: float = 10000.0
    factor: float = 1.0
    max_position_embeddings: int = 0
    rotary_offset: int = 0
    key_head_dim: int | None = None
    mrope_section: tuple[int, ...] = ()
    mrope_interleaved: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "angles", _parse_enum(AngleSource, self.angles, "angle source"))
        object.__setattr__(self, "positions", _parse_enum(PositionMode, self.positions, "position mode"))
        if self.layout not in ROPE_LAYOUTS:
            raise ConfigError(f"unknown RoPE layout {self.layout!r}; the kernel supports {list(ROPE_LAYOUTS)}.")
        if not _is_int(self.head_dim) or not 2 <= self.head_dim <= MAX_HEAD_DIM:
            raise ConfigError(
                f"head_dim must be an int in [2, {MAX_HEAD_DIM}] for the posenc RoPE kernel, got {self.head_dim!r}."
            )
        if not _is_int(self.rotary_dim) or self.rotary_dim < 2 or self.rotary_dim % 2:
            raise ConfigError(
                f"rotary_dim must be an even int >= 2 (RoPE rotates pairs), got {self.rotary_dim!r}; "
                f"use int(head_dim * partial_rotary_factor) rounded to an even number."
            )
        if self.rotary_dim > self.head_dim:
            raise ConfigError(
                f"rotary_dim {self.rotary_dim} exceeds head_dim {self.head_dim}; use rotary_dim <= head_dim."
            )
        if self.angles is AngleSource.FREQ:
            _finite_positive(self.attention_factor, "attention_factor", "multiplied into cos and sin")
            if not _is_int(self.longrope_original) or self.longrope_original < 0:
                raise ConfigError(
                    f"longrope_original must be an int >= 0 (0 = one frequency set), got {self.longrope_original!r}."
                )
        if self.angles is AngleSource.NTK:
            rope_inv_freq(self.rotary_dim, self.rope_parameters())  # the rope_type's own validation
        self._check_slice()
        self._check_sections()

    def _check_slice(self) -> None:
        offset = self.rotary_offset
        if not _is_int(offset) or offset < 0 or offset + self.rotary_dim > self.head_dim:
            raise ConfigError(
                f"rotary_offset must be an int >= 0 with rotary_offset + rotary_dim <= head_dim "
                f"({self.rotary_dim} + offset <= {self.head_dim}), got {offset!r}."
            )
        key = self.head_dim if self.key_head_dim is None else self.key_head_dim
        if not _is_int(key) or not self.rotary_dim <= key <= MAX_HEAD_DIM:
            raise ConfigError(
                f"key_head_dim must be an int in [rotary_dim, {MAX_HEAD_DIM}] = [{self.rotary_dim}, {MAX_HEAD_DIM}], "
                f"got {key!r}."
            )
        object.__setattr__(self, "key_head_dim", int(key))

    def _check_sections(self) -> None:
        sections = tuple(self.mrope_section)
        object.__setattr__(self, "mrope_section", sections)
        if not sections:
            if self.mrope_interleaved:
                raise ConfigError("mrope_interleaved needs mrope_section (the slots of each axis).")
            return
        if not 2 <= len(sections) <= 3 or not all(_is_int(n) and n >= 0 for n in sections):
            raise ConfigError(f"mrope_section must be 2 or 3 slot counts >= 0, got {sections!r}.")
        if sum(sections) != self.half:
            raise ConfigError(f"mrope_section {list(sections)} must sum to r/2 = {self.half}.")
        if self.angles not in (AngleSource.TABLE, AngleSource.FREQ) or self.positions is not PositionMode.IDS:
            raise ConfigError(
                "multi-axis positions (mrope_section) take position ids with a table or in-kernel frequencies; "
                "pass per-token cos/sin (AngleSource.CACHE) for anything else."
            )
        if self.longrope_original:
            raise ConfigError("multi-axis positions need one frequency set (no LongRoPE switch).")
        counts = [self.slot_axes().count(axis) for axis in range(len(sections))]
        if counts != list(sections):
            raise ConfigError(
                f"mrope_section {list(sections)} cannot be interleaved over {self.half} slots (t, h, w, t, h, w, ...); "
                f"use sections like Qwen3-VL's [24, 20, 20] or chunks (mrope_interleaved=False)."
            )

    @property
    def axes(self) -> int:
        """Axes of the position ids (1, or the number of ``mrope_section`` entries)."""
        return len(self.mrope_section) or 1

    def slot_axes(self) -> list[int]:
        """The position axis of each of the r/2 slots (what the kernel's ``_slot_axis`` computes)."""
        t, h, w = (*self.mrope_section, 0, 0, 0)[:3]
        if self.mrope_interleaved:
            return [1 if i % 3 == 1 and i < 3 * h else 2 if i % 3 == 2 and i < 3 * w else 0 for i in range(self.half)]
        return [int(i >= t) + int(i >= t + h) for i in range(self.half)]

    # ------------------------------------------------------------------------------------------------
    # derived sizes
    # ------------------------------------------------------------------------------------------------

    @property
    def half(self) -> int:
        return self.rotary_dim // 2

    @property
    def tail(self) -> int:
        """q's features copied through unchanged after the rotated ones (partial rotary)."""
        return self.head_dim - self.rotary_offset - self.rotary_dim

    @property
    def plugin_name(self) -> str:
        return self.angles.plugin_name

    def rope_parameters(self) -> dict[str, Any]:
        """``NTK``: the Hugging Face ``rope_parameters`` of the ``rope_type`` the kernel computes in-kernel."""
        return {
            "rope_type": NTK_ROPE_TYPE,
            "rope_theta": self.rope_theta,
            "factor": self.factor,
            "max_position_embeddings": self.max_position_embeddings,
        }

    @property
    def max_exact_position(self) -> int:
        """Largest position whose in-kernel angle is float32-exact (FREQ); tables have their own length."""
        return RANGE_REDUCTION_MAX_POSITION - 1

    def constexprs(self, block_h: int, *, copy_tail: bool = True) -> dict[str, Any]:
        """Compile-time constants of the Triton kernel for this spec.

        Float constants that the kernel uses in float64 (dynamic NTK) are passed as exact float32 hi/lo pairs,
        because Triton materializes Python floats as float32. The dynamic-NTK constants are those of
        :func:`posenc.rope_types.dynamic_ntk_base`: θ, factor, M and the exponent ``ntk_exponent(r)``.
        """
        if not _is_int(block_h) or block_h < 1 or block_h & (block_h - 1):
            raise ConfigError(f"block_h must be a power of two >= 1, got {block_h!r}.")
        log2_theta = math.log2(self.rope_theta) if self.angles is AngleSource.NTK else 0.0
        power = rope_types.ntk_exponent(self.rotary_dim) if self.rotary_dim > 2 else 0.0
        key_tail = int(self.key_head_dim or self.head_dim) - self.rotary_dim
        sections = (*self.mrope_section, 0, 0, 0)[:3]
        consts: dict[str, Any] = {
            "ANGLES": _ANGLE_CODES[self.angles],
            "POSITIONS": _POSITION_CODES[self.positions],
            "INTERLEAVED": self.layout == "interleaved",
            "ROT": self.rotary_dim,
            "HEAD_DIM": self.head_dim,
            "BLOCK_HALF": next_power_of_2(self.half),
            "BLOCK_TAIL": next_power_of_2(max(self.tail, key_tail, 1)),
            "BLOCK_H": block_h,
            "COPY_TAIL": bool(copy_tail and (self.tail > 0 or key_tail > 0 or self.rotary_offset > 0)),
            "ROT_OFFSET": int(self.rotary_offset),
            "HEAD_DIM_K": int(self.key_head_dim or self.head_dim),
            "BLOCK_HEAD": next_power_of_2(max(self.rotary_offset, 1)),
            "AXES": self.axes,
            "SEC_T": sections[0],
            "SEC_H": sections[1],
            "SEC_W": sections[2],
            "SEC_INTERLEAVED": bool(self.mrope_interleaved),
            "ATTN_FACTOR": float(self.attention_factor) if self.angles is AngleSource.FREQ else 1.0,
            "LONGROPE_ORIGINAL": int(self.longrope_original),
            "NTK_MAX_POS": int(self.max_position_embeddings),
            "BLOCK_S": 128,
        }
        for name, value in (("LOG2_THETA", log2_theta), ("NTK_FACTOR", float(self.factor)), ("POWER", power)):
            hi, lo = split_float64(value)
            consts[f"{name}_HI"] = hi
            consts[f"{name}_LO"] = lo
        return consts

    # ------------------------------------------------------------------------------------------------
    # plugin attributes (ONNX node attributes == TensorRT plugin fields)
    # ------------------------------------------------------------------------------------------------

    def plugin_attributes(self, qk_format: QKFormat | str = QKFormat.BHSD) -> dict[str, int | float]:
        """The plugin node's attributes for this spec (the ONNX attribute names are the plugin field names)."""
        fmt = parse_qk_format(qk_format)
        attrs: dict[str, int | float] = {
            "interleaved": int(self.layout == "interleaved"),
            "rotary_dim": self.rotary_dim,
            "qk_format": _FORMAT_CODES[fmt],
        }
        if self.angles.uses_positions:
            attrs["position_mode"] = _POSITION_CODES[self.positions]
        if self.angles is AngleSource.FREQ:
            attrs["attention_factor"] = float(self.attention_factor)
            attrs["longrope_original"] = int(self.longrope_original)
        if self.angles is AngleSource.NTK:
            attrs["rope_theta"] = float(self.rope_theta)
            attrs["factor"] = float(self.factor)
            attrs["max_position_embeddings"] = int(self.max_position_embeddings)
        if self.rotary_offset:
            attrs["rotary_offset"] = int(self.rotary_offset)
        if self.mrope_section:
            attrs["mrope_axes"] = self.axes
            for name, count in zip(SECTION_ATTRIBUTES, (*self.mrope_section, 0, 0)[:3], strict=True):
                attrs[name] = int(count)
            attrs["mrope_interleaved"] = int(self.mrope_interleaved)
        return attrs

    @classmethod
    def from_plugin_attributes(
        cls, angles: AngleSource | str, attrs: Mapping[str, Any], head_dim: int, key_head_dim: int | None = None
    ) -> tuple[RopeKernelSpec, QKFormat]:
        """Inverse of :meth:`plugin_attributes` (the head dims come from q's and k's shapes)."""
        source = _parse_enum(AngleSource, angles, "angle source")
        fmt_code = int(attrs.get("qk_format", 0))
        formats = {code: fmt for fmt, code in _FORMAT_CODES.items()}
        if fmt_code not in formats:
            raise ConfigError(f"qk_format must be 0 (BHSD) or 1 (BSHD), got {fmt_code}.")
        pos_code = int(attrs.get("position_mode", 0))
        modes = {code: mode for mode, code in _POSITION_CODES.items()}
        if pos_code not in modes:
            raise ConfigError(f"position_mode must be 0 (position ids) or 1 (start offsets), got {pos_code}.")
        interleaved = int(attrs.get("interleaved", 0))
        if interleaved not in (0, 1):
            raise ConfigError(f"interleaved must be 0 (half) or 1 (interleaved), got {interleaved}.")
        spec = cls(
            angles=source,
            rotary_dim=int(attrs.get("rotary_dim", 0)),
            head_dim=int(head_dim),
            layout="interleaved" if interleaved else "half",
            positions=modes[pos_code],
            attention_factor=float(attrs.get("attention_factor", 1.0)),
            longrope_original=int(attrs.get("longrope_original", 0)),
            rope_theta=float(attrs.get("rope_theta", 10000.0)),
            factor=float(attrs.get("factor", 1.0)),
            max_position_embeddings=int(attrs.get("max_position_embeddings", 0)),
            rotary_offset=int(attrs.get("rotary_offset", 0)),
            key_head_dim=None if key_head_dim is None else int(key_head_dim),
            mrope_section=_sections(attrs),
            mrope_interleaved=bool(int(attrs.get("mrope_interleaved", 0))),
        )
        return spec, formats[fmt_code]


SECTION_ATTRIBUTES: tuple[str, str, str] = ("mrope_section_t", "mrope_section_h", "mrope_section_w")
"""Node attributes carrying ``mrope_section`` (one int each; the plugin fields are scalars)."""


def _sections(attrs: Mapping[str, Any]) -> tuple[int, ...]:
    """``mrope_section`` from node attributes: ``mrope_axes`` counts (2 for axial, 3 for M-RoPE; 0: one axis)."""
    axes = int(attrs.get("mrope_axes", 0))
    return tuple(int(attrs.get(name, 0)) for name in SECTION_ATTRIBUTES[:axes])


_ANGLE_CODES = {AngleSource.TABLE: 0, AngleSource.CACHE: 1, AngleSource.FREQ: 2, AngleSource.NTK: 3}
_POSITION_CODES = {PositionMode.IDS: 0, PositionMode.OFFSET: 1}
_FORMAT_CODES = {QKFormat.BHSD: 0, QKFormat.BSHD: 1}


def _parse_enum(cls: type[enum.Enum], value: Any, what: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        valid = [m.value for m in cls]
        raise ConfigError(f"unknown {what} {value!r}; use one of {valid}.") from None


def parse_qk_format(value: QKFormat | str) -> QKFormat:
    """``"bhsd"`` / ``"bshd"`` (or the enum) as :class:`QKFormat`; anything else is a :class:`ConfigError`."""
    return _parse_enum(QKFormat, value, "q/k format")


def split_float64(value: float) -> tuple[float, float]:
    """``value`` as two float32-representable numbers whose float64 sum is ``value`` to ~2**-48 relative."""

    def to_f32(x: float) -> float:
        return struct.unpack("<f", struct.pack("<f", x))[0] if math.isfinite(x) and abs(x) < 3e38 else x

    hi = to_f32(value)
    return hi, to_f32(value - hi)
