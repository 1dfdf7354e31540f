"""Pure tensor math of positional encodings: frequencies, tables, rotation, buckets, slopes.

This module is the contract the rest of posenc builds on: torch tensors in and out, no module state.
Frequencies and angles are computed in float64 and cast at the end, so tables stay accurate at
positions far beyond 2**17.

Shape legend: ``B`` batch, ``S`` sequence, ``H`` heads, ``D`` head dim, ``r`` rotary dim (even, <= D).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from posenc import rope_types
from posenc.dtypes import compute_dtype
from posenc.errors import ConfigError, PositionError, parameter_domain

__all__ = [
    "RANGE_REDUCTION_MAX_POSITION",
    "ROPE_LAYOUTS",
    "ROPE_PARAMETER_KEYS",  # noqa: F822 (module __getattr__: follows the rope_types registry)
    "ROPE_TYPES",  # noqa: F822
    "alibi_slopes",
    "apply_rope",
    "deberta_log_bucket",
    "exact_angles",
    "is_tracing",
    "position_guard",
    "rope_cos_sin",
    "rope_frequency_sets",
    "rope_inv_freq",
    "sinusoidal_inv_freq",
    "sinusoidal_table",
    "split_turns",
    "t5_relative_bucket",
    "write_cache",
]

ROPE_LAYOUTS: tuple[str, ...] = ("half", "interleaved")


def __getattr__(name: str) -> Any:
    """``ROPE_TYPES`` (valid ``rope_type`` values) and ``ROPE_PARAMETER_KEYS`` (valid ``rope_parameters`` keys)
    follow the :mod:`posenc.rope_types` registry, so they include types registered after import."""
    if name == "ROPE_TYPES":
        return tuple(rope_types.names())
    if name == "ROPE_PARAMETER_KEYS":
        return rope_types.parameter_keys()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Exact range reduction: positions are split at this power of two, frequencies into 12-bit pieces.
_POSITION_SPLIT = 4096
_MANTISSA_BITS = 11  # 12 significant bits: product of two 12-bit numbers is exact in float32
RANGE_REDUCTION_MAX_POSITION = _POSITION_SPLIT * _POSITION_SPLIT
"""Largest |position| for which :func:`exact_angles` is exact (2**24)."""


# --------------------------------------------------------------------------------------------------
# RoPE frequencies
# --------------------------------------------------------------------------------------------------


def _check_rotary_dim(rotary_dim: Any) -> int:
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
        raise ConfigError(f"rotary_dim must be an int, got {type(rotary_dim).__name__}.")
    if rotary_dim < 2 or rotary_dim % 2:
        raise ConfigError(
            f"rotary_dim must be an even integer >= 2 (RoPE rotates pairs of dimensions), got {rotary_dim}."
        )
    return rotary_dim


def _check_seq_len(seq_len: int | torch.Tensor | None) -> None:
    if isinstance(seq_len, torch.Tensor):
        if seq_len.dtype.is_floating_point or seq_len.dtype == torch.bool or seq_len.numel() != 1:
            raise ConfigError(
                f"a tensor seq_len must hold one integer (max position + 1), got {seq_len.dtype} {list(seq_len.shape)}."
            )
    elif seq_len is not None and (isinstance(seq_len, bool) or int(seq_len) < 1):
        raise ConfigError(f"seq_len must be a positive int (max position + 1), got {seq_len!r}.")


def rope_inv_freq(
    rotary_dim: int, params: Mapping[str, Any] | None = None, *, seq_len: int | torch.Tensor | None = None
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies of RoPE for a ``rope_type`` and its parameters.

    Checks the keys every type shares, then calls the type's function from the :mod:`posenc.rope_types` registry.

    Args:
        rotary_dim: number of rotated dimensions r (even). ``partial_rotary_factor`` is the caller's
            business: pass ``int(head_dim * partial_rotary_factor)``.
        params: Hugging Face ``rope_parameters`` / ``rope_scaling`` dict (``rope_type``, ``rope_theta``,
            ``factor``, ...). It may also carry ``max_position_embeddings`` (the model's context length).
            ``rope_type`` values (``ROPE_TYPES``): default, linear, ntk (static NTK-aware: base * factor**(r/(r-2))),
            dynamic, yarn, longrope, llama3, truncation (base truncation with ``truncation_a``,
            ``truncation_c``, ``truncation_beta``: θ_i kept if θ_i >= c, set to β if a < θ_i < c, 0 if θ_i <= a),
            and any type registered since.
        seq_len: current length (max position + 1) for the length-dependent types ``dynamic`` and ``longrope``:
            an int, or a 0-d integer tensor (inside a traced graph the result is then computed in the graph).

    Returns:
        ``(inv_freq, attention_factor)``: float64 ``[r // 2]`` and the float multiplied into cos and sin.

    Raises:
        ConfigError: unknown rope_type or key, odd rotary_dim, factor <= 0, missing required parameters.

    Example::

        inv_freq, scale = rope_inv_freq(128, {"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 8192})
    """
    rotary_dim = _check_rotary_dim(rotary_dim)
    params = dict(params or {})
    keys = rope_types.parameter_keys()
    unknown = sorted(set(params) - keys)
    if unknown:
        raise ConfigError(f"unknown RoPE parameter(s) {unknown}; valid keys are {sorted(keys)}.")
    entry = rope_types.get(rope_types.rope_type_name(params))
    theta = params.get("rope_theta")
    base = rope_types.positive(10000.0 if theta is None else theta, "rope_theta")
    _check_seq_len(seq_len)
    with parameter_domain(
        f"rope_type {entry.name!r} cannot compute frequencies from {params}",
        f"these values leave its domain (see `posenc show {entry.scheme}`).",
    ):
        inv_freq, factor = entry.inv_freq(rotary_dim, base, params, seq_len)
    if not is_tracing() and not (bool(torch.isfinite(inv_freq).all()) and math.isfinite(float(factor))):
        raise ConfigError(
            f"rope_type {entry.name!r} with {params} gives non-finite frequencies or attention factor; choose "
            f"parameters in its range (see `posenc show {entry.scheme}`)."
        )
    return inv_freq, factor


def rope_frequency_sets(
    rotary_dim: int, params: Mapping[str, Any] | None = None
) -> tuple[tuple[int, ...], list[tuple[torch.Tensor, float]]]:
    """Every frequency set a ``rope_type`` uses, and the lengths at which it switches between them.

    Static types have one set. A type whose frequencies switch with the current length L (LongRoPE) has one set
    per interval: set 0 for L <= points[0], set i for points[i-1] < L <= points[i], the last for L > points[-1]
    (:func:`posenc.rope_types.switch_at` is the rule).

    Returns:
        ``(points, sets)``: ascending switch lengths (empty for static types) and ``len(points) + 1`` pairs
        ``(inv_freq float64 [r // 2], attention_factor)``, each from :func:`rope_inv_freq`.

    Raises:
        ConfigError: bad parameters, or a type that depends on L continuously (dynamic NTK): evaluate
            :func:`rope_inv_freq` with ``seq_len`` instead.
    """
    entry = rope_types.get(rope_types.rope_type_name(params))
    first = rope_inv_freq(rotary_dim, params)  # validates the parameters
    if not entry.length_dependent:
        return (), [first]
    if entry.switch_points is None:
        raise ConfigError(
            f"rope_type {entry.name!r} depends continuously on the current length, so it has no finite set of "
            f"frequencies; evaluate rope_inv_freq(..., seq_len=L) per length (a 0-d tensor inside a graph)."
        )
    points = tuple(sorted(entry.switch_points(dict(params or {}))))
    lengths = (points[0], *(point + 1 for point in points))
    return points, [rope_inv_freq(rotary_dim, params, seq_len=length) for length in lengths]


def sinusoidal_inv_freq(dim: int, base: float = 10000.0) -> torch.Tensor:
    """Frequencies ``1 / base**(2i/dim)`` of the sinusoidal encoding, float64 ``[ceil(dim / 2)]``.

    An odd ``dim`` has one more sine than cosines, so it gets ``(dim + 1) / 2`` frequencies (the exponent keeps
    the odd ``dim`` as its denominator, as Marian's and XLM's tables do).
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ConfigError(f"sinusoidal dim must be a positive int, got {dim!r}.")
    return rope_types.default_inv_freq(dim, rope_types.positive(base, "base"))


# --------------------------------------------------------------------------------------------------
# Angles, cos/sin, rotation
# --------------------------------------------------------------------------------------------------


def rope_cos_sin(
    position_ids: torch.Tensor,
    inv_freq: torch.Tensor,
    attention_factor: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``position * inv_freq`` (angles in float64), times ``attention_factor``.

    Args:
        position_ids: integer tensor of any shape, e.g. ``[B, S]``.
        inv_freq: ``[r // 2]``.
        attention_factor: multiplied into cos and sin (YaRN, LongRoPE).
        dtype: dtype of the returned tables.

    Returns:
        ``(cos, sin)``, each ``[*position_ids.shape, r // 2]``.

    Raises:
        ConfigError: floating-point position ids (outside a traced graph).
    """
    if not is_tracing() and (position_ids.is_floating_point() or position_ids.is_complex()):
        raise ConfigError(
            f"position_ids must be an integer tensor (positions are token indices), got {position_ids.dtype}; "
            f"pass e.g. torch.arange(S) or ids cast with .long()."
        )
    angles = position_ids.to(torch.float64).unsqueeze(-1) * inv_freq.to(torch.float64)
    return (
        (torch.cos(angles) * attention_factor).to(dtype),
        (torch.sin(angles) * attention_factor).to(dtype),
    )


def split_turns(inv_freq: torch.Tensor) -> torch.Tensor:
    """Split frequencies (in turns, ``inv_freq / 2π``) into three float32 pieces for :func:`exact_angles`.

    The first two pieces carry 12 significant bits each, so their products with 12-bit position pieces are
    exact in float32; the third carries the rest. Works on float64 input inside exported graphs too.

    Args:
        inv_freq: ``[..., r // 2]`` frequencies (float64 recommended).

    Returns:
        float32 ``[3, ..., r // 2]``.
    """
    turns = inv_freq.to(torch.float64) / (2 * math.pi)
    pieces = []
    rest = turns
    for _ in range(2):
        safe = torch.where(rest == 0, torch.ones_like(rest), rest.abs())
        scale = torch.exp2(_MANTISSA_BITS - torch.floor(torch.log2(safe)))
        piece = torch.where(rest == 0, torch.zeros_like(rest), torch.round(rest * scale) / scale)
        pieces.append(piece)
        rest = rest - piece
    pieces.append(rest)
    return torch.stack(pieces).to(torch.float32)


def is_tracing() -> bool:
    """True while torch traces, exports or compiles (eager-only checks must step aside then)."""
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        return True
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    if is_exporting is not None and is_exporting():
        return True
    return bool(torch.onnx.is_in_onnx_export())


def position_guard(position_ids: torch.Tensor, limit: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The in-graph guard of exported tables: safe indices, and a poison that is 0 or NaN per position.

    A position is valid when ``0 <= p < limit`` (``limit`` None: ``p >= 0``). The guard returns

    - ``safe``: the position ids with every invalid one replaced by 0, so that every table lookup stays in
      bounds on every runtime (TensorRT reads out-of-range gathers as zeros or worse);
    - ``poison`` ``[*position_ids.shape]`` float32: 0 where valid, NaN where not, read through a one-row
      tripwire table at row ``int(not valid)``: ONNX Runtime refuses the out-of-range row with an error
      ("indices element out of data bounds"), a runtime that cannot raise (TensorRT) yields the NaN.

    Callers add ``poison`` to what the positions produced (rotated q/k, embeddings, biases), so an invalid
    position can never give a finite, plausible number. Eager code checks positions with
    :class:`~posenc.errors.PositionError` instead; this is for graphs (it is traced, not run eagerly).

    Args:
        position_ids: int64 ``[...]``.
        limit: exclusive upper bound (rows of the precomputed table), or None.
    """
    valid = position_ids >= 0
    if limit is not None:
        valid = valid & (position_ids < limit)
    safe = torch.where(valid, position_ids, 0)  # scalar constants: no Shape/Expand nodes in the graph
    tripwire = torch.zeros(1, 1, dtype=torch.float32, device=position_ids.device)
    row = torch.where(valid, 0, 1)
    trip = torch.nn.functional.embedding(row, tripwire).squeeze(-1)
    poison = torch.where(valid, trip, float("nan"))
    return safe, poison


def exact_angles(position_ids: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """Angles ``position * inv_freq`` reduced to ``[0, 2π]`` with float32 arithmetic only, error ~1e-6 rad.

    Naive float32 angles lose ~1e-2 rad at position 131072; this splits positions at 4096 and frequencies
    into 12-bit pieces (:func:`split_turns`) so every large product is exact. Exported graphs use it for
    in-graph (``dynamic``) tables because TensorRT has no float64 arithmetic.

    Args:
        position_ids: int64 ``[...]`` with |position| < 2**24.
        turns: float32 ``[3, r // 2]`` from :func:`split_turns` (or ``[3, ..., r // 2]`` broadcastable).

    Returns:
        float32 ``[..., r // 2]``.

    Raises:
        ConfigError: floating-point position ids (they would be truncated silently).
        PositionError: |position| >= 2**24 in eager mode (the split is no longer exact; exported graphs
            are checked by the runtime helpers instead).
    """
    if position_ids.dtype.is_floating_point or position_ids.dtype == torch.bool:
        raise ConfigError(f"position ids must be an integer tensor (int64), got {position_ids.dtype}.")
    pos = position_ids.to(torch.int64)
    if not is_tracing() and pos.numel():
        far = int(pos.abs().max())
        if far >= RANGE_REDUCTION_MAX_POSITION:
            raise PositionError(
                f"position {far} is past 2**24 = {RANGE_REDUCTION_MAX_POSITION}, where float32 angles stop "
                f"being exact; keep positions below it, or compute tables in float64 (table_dtype=torch.float64, "
                f"eager PyTorch only)."
            )
    high_i = torch.div(pos, _POSITION_SPLIT, rounding_mode="floor") * _POSITION_SPLIT
    high = high_i.to(torch.float32).unsqueeze(-1)
    low = (pos - high_i).to(torch.float32).unsqueeze(-1)
    t1, t2, t3 = turns[0], turns[1], turns[2]

    def centered(x: torch.Tensor) -> torch.Tensor:
        # Fractional part in [-0.5, 0.5]: partial sums stay below 1 in magnitude, so each addition rounds
        # to half the error that sums in [0, 2) would (worst case ~1e-6 rad instead of ~2e-6 rad).
        return x - torch.round(x)

    total = centered(centered(high * t1) + centered(low * t1))
    total = centered(total + centered(high * t2))
    total = centered(total + centered(low * t2))
    total = centered(total + (high + low) * t3)
    return (total - torch.floor(total)) * (2 * math.pi)


def apply_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str = "half",
    rotary_dim: int | None = None,
) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` features of ``x`` by the angles whose cos/sin are given.

    ``half`` (GPT-NeoX / Llama ``rotate_half``) pairs features (i, i + r/2); ``interleaved``
    (GPT-J / RoFormer) pairs (2i, 2i + 1). Features past ``rotary_dim`` pass through unchanged.
    Math runs in float32 (float64 for float64 input); the result has ``x``'s dtype.

    Args:
        x: ``[..., D]``, e.g. ``[B, H, S, D]``.
        cos, sin: broadcastable to ``x[..., : r // 2]``, e.g. ``[B, 1, S, r // 2]``.
        layout: ``"half"`` or ``"interleaved"``.
        rotary_dim: r (even, <= D); defaults to ``2 * cos.shape[-1]``.

    Returns:
        Tensor of ``x``'s shape and dtype.
    """
    if layout not in ROPE_LAYOUTS:
        raise ConfigError(f"unknown RoPE layout {layout!r}; use one of {list(ROPE_LAYOUTS)}.")
    half = cos.shape[-1]
    r = 2 * half if rotary_dim is None else rotary_dim
    if r != 2 * half or r % 2:
        raise ConfigError(f"rotary_dim {r} does not match cos/sin of last dim {half} (need rotary_dim = 2*{half}).")
    if r > x.shape[-1]:
        raise ConfigError(f"rotary_dim {r} exceeds the head dim {x.shape[-1]}; use rotary_dim <= head dim.")
    if not is_tracing():
        try:
            torch.broadcast_shapes(cos.shape, sin.shape, (*x.shape[:-1], half))
        except RuntimeError:
            raise ConfigError(
                f"cos {list(cos.shape)} and sin {list(sin.shape)} do not broadcast to x[..., :{r // 2}] of x "
                f"{list(x.shape)}; give one cos/sin row per position of x (e.g. [B, 1, S, r/2] for x [B, H, S, D])."
            ) from None
    compute = compute_dtype(x)
    xr = x[..., :r].to(compute)
    c, s = cos.to(compute), sin.to(compute)
    if layout == "half":
        x1, x2 = xr[..., :half], xr[..., half:]
        rotated = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rotated = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    rotated = rotated.to(x.dtype)
    if r == x.shape[-1]:
        return rotated
    return torch.cat((rotated, x[..., r:]), dim=-1)


# --------------------------------------------------------------------------------------------------
# Absolute sinusoidal table
# --------------------------------------------------------------------------------------------------


def sinusoidal_table(
    num_positions: int,
    dim: int,
    layout: str = "interleaved",
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Sinusoidal position table of Vaswani et al.

    ``interleaved``: ``PE[t, 2i] = sin(t / base**(2i/dim))``, ``PE[t, 2i+1] = cos(...)`` (XLM's
    ``create_sinusoidal_embeddings``; an odd ``dim`` ends on a sine).
    ``concat``: ``PE[t] = [sin(t·ω_0..), cos(t·ω_0..)]`` (tensor2tensor / Transformer-XL order; Marian's
    ``MarianSinusoidalPositionalEmbedding``: an odd ``dim`` has ``(dim + 1) / 2`` sines, then ``(dim - 1) / 2``
    cosines). ``ω_i = base**(-2i/dim)``.

    Returns:
        ``[num_positions, dim]`` in ``dtype`` (angles in float64).
    """
    if layout not in ("interleaved", "concat"):
        raise ConfigError(f"unknown sinusoidal layout {layout!r}; use 'interleaved' or 'concat'.")
    if isinstance(num_positions, bool) or not isinstance(num_positions, int) or num_positions < 1:
        raise ConfigError(f"num_positions must be a positive int, got {num_positions!r}.")
    inv_freq = sinusoidal_inv_freq(dim, base)
    angles = torch.arange(num_positions, dtype=torch.float64).unsqueeze(-1) * inv_freq
    return sinusoidal_from_angles(angles, layout, dim).to(dtype)


def sinusoidal_from_angles(angles: torch.Tensor, layout: str, dim: int | None = None) -> torch.Tensor:
    """Arrange sin/cos of ``angles [..., ceil(dim / 2)]`` into ``[..., dim]`` in the given layout.

    ``dim`` defaults to twice the angles' width; an odd ``dim`` drops the last cosine.
    """
    sin, cos = torch.sin(angles), torch.cos(angles)
    odd = dim is not None and dim % 2 == 1
    if layout == "concat":
        return torch.cat((sin, cos[..., :-1] if odd else cos), dim=-1)
    pairs = torch.stack((sin, cos), dim=-1).flatten(-2)
    return pairs[..., :-1] if odd else pairs


# --------------------------------------------------------------------------------------------------
# Bias producers
# --------------------------------------------------------------------------------------------------


def alibi_slopes(num_heads: int, dtype: torch.dtype = torch.float32, *, bias_max: float = 8.0) -> torch.Tensor:
    """ALiBi head slopes: ``2**(-bias_max·i/n)``, ``i = 1..n``, for n a power of two (the paper's bias_max is 8).

    Other head counts take the slopes of the power of two ``c`` below n, then every other slope of ``2c``
    (``2**(-bias_max·j/(2c))`` for odd ``j``) until n: the ALiBi paper's code, BLOOM and Falcon. MPT's order
    (transformers' ``build_mpt_alibi_tensor``: the ``2c`` slopes at even positions, then those at odd ones, cut
    at n) is the same sequence, so one function serves all three; MPT's ``alibi_bias_max`` is ``bias_max``.

    Slopes are computed in float64 and cast to ``dtype``. Returns ``[num_heads]``.
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ConfigError(f"num_heads must be a positive int, got {num_heads!r}.")
    bias_max = rope_types.positive(bias_max, "bias_max")

    def powers(count: int, exponents: torch.Tensor) -> torch.Tensor:
        return 2.0 ** (-(bias_max / count) * exponents.to(torch.float64))

    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = powers(closest, torch.arange(1, closest + 1))
    if closest != num_heads:
        remaining = min(closest, num_heads - closest)
        slopes = torch.cat((slopes, powers(2 * closest, torch.arange(1, 1 + 2 * remaining, 2))))
    return slopes.to(dtype)


def t5_relative_bucket(
    relative_position: torch.Tensor,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> torch.Tensor:
    """T5 relative-position bucket (Mesh TensorFlow / Hugging Face ``_relative_position_bucket``).

    Half the buckets are exact distances, the rest log-spaced up to ``max_distance``; bidirectional
    mode gives keys after the query their own half of the buckets. The float32 log matches the original.

    Args:
        relative_position: int tensor ``key_pos - query_pos``.

    Returns:
        int64 tensor of the same shape, values in ``[0, num_buckets)``.
    """
    _check_buckets(num_buckets, max_distance, bidirectional)
    rel = relative_position.to(torch.int64)
    buckets = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (rel > 0).to(torch.int64) * num_buckets
        rel = rel.abs()
    else:
        rel = -torch.clamp(rel, max=0)
    max_exact = num_buckets // 2
    is_small = rel < max_exact
    # Clamp before the log so that log(0) never appears (those entries are "small" anyway).
    large = max_exact + (
        torch.log(rel.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.int64)
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(is_small, rel, large)


def _check_buckets(num_buckets: int, max_distance: int, bidirectional: bool = False) -> None:
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < 2:
        raise ConfigError(f"num_buckets must be an int >= 2, got {num_buckets!r}.")
    if isinstance(max_distance, bool) or not isinstance(max_distance, int) or max_distance < 1:
        raise ConfigError(f"max_distance must be a positive int, got {max_distance!r}.")
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    if per_direction < 2:
        raise ConfigError(
            f"bidirectional T5 buckets split num_buckets={num_buckets} into two directions of {per_direction}; "
            f"each needs >= 2 (exact and log buckets). Use num_buckets >= 4."
        )
    if max_distance <= per_direction // 2:
        raise ConfigError(
            f"max_distance={max_distance} must exceed the {per_direction // 2} exact-distance buckets "
            f"(num_buckets={num_buckets}, bidirectional={bidirectional}); use max_distance > {per_direction // 2}."
        )


def deberta_log_bucket(
    relative_position: torch.Tensor, bucket_size: int = 256, max_position: int = 512
) -> torch.Tensor:
    """DeBERTa-v2 log bucket (``make_log_bucket_position``): exact within ±bucket_size/2, log beyond.

    Args:
        relative_position: int tensor ``query_pos - key_pos``.

    Returns:
        int64 tensor of the same shape (signed bucket ids).
    """
    if isinstance(bucket_size, bool) or not isinstance(bucket_size, int) or bucket_size < 4:
        raise ConfigError(f"bucket_size must be an int >= 4, got {bucket_size!r}.")
    if isinstance(max_position, bool) or not isinstance(max_position, int) or max_position <= bucket_size // 2 + 1:
        raise ConfigError(f"max_position must be an int > bucket_size // 2 + 1, got {max_position!r}.")
    rel = relative_position.to(torch.int64)
    sign = torch.sign(rel)
    mid = bucket_size // 2
    abs_pos = torch.where((rel < mid) & (rel > -mid), torch.full_like(rel, mid - 1), rel.abs())
    log_pos = (
        torch.ceil(torch.log(abs_pos.float() / mid) / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1))
        + mid
    )
    return torch.where(abs_pos <= mid, rel.to(log_pos.dtype), log_pos * sign).to(torch.int64)


# --------------------------------------------------------------------------------------------------
# Preallocated KV cache
# --------------------------------------------------------------------------------------------------


@torch.library.custom_op("posenc::write_cache", mutates_args=())
def _write_cache(cache: torch.Tensor, new: torch.Tensor, past_length: torch.Tensor) -> torch.Tensor:
    index = past_length.to(torch.int64)[:, None] + torch.arange(new.shape[2], device=new.device)  # [B, S]
    return cache.clone().scatter_(2, index[:, None, :, None].expand(new.shape), new.to(cache.dtype))


@_write_cache.register_fake
def _write_cache_shape(cache: torch.Tensor, new: torch.Tensor, past_length: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(cache)


def write_cache(cache: torch.Tensor, new: torch.Tensor, past_length: torch.Tensor) -> torch.Tensor:
    """A preallocated cache with ``new`` written at slots ``past_length[b] .. past_length[b] + S - 1`` of each row.

    One torch operator (``posenc::write_cache``), so that an export keeps it whole: posenc's exporter writes it as
    ONNX ``TensorScatter`` (opset 24, ``axis=2``, linear mode), which runtimes execute in place when the output is
    bound to the input's buffer. The eager result is a new tensor (the input is not modified).

    Args:
        cache: ``[B, Hkv, C, D]``, ``C`` slots per row.
        new: ``[B, Hkv, S, D]`` (cast to the cache's dtype).
        past_length: int ``[B]``, the slots already filled in each row.

    Returns:
        ``[B, Hkv, C, D]``.

    Raises:
        ConfigError: shapes that do not fit, a non-integer ``past_length``, or (eager only) a write past the last
            slot or at a negative one.
    """
    if past_length.dtype.is_floating_point or past_length.dtype == torch.bool:
        raise ConfigError(f"past_length must be an integer tensor (int64), got {past_length.dtype}.")
    if cache.dim() != 4 or new.dim() != 4 or past_length.dim() != 1:
        raise ConfigError(
            f"write_cache takes cache [B, Hkv, C, D], new [B, Hkv, S, D] and past_length [B]; got shapes "
            f"{list(cache.shape)}, {list(new.shape)} and {list(past_length.shape)}."
        )
    if not is_tracing():
        b, hkv, slots, d = cache.shape
        if (new.shape[0], new.shape[1], new.shape[3]) != (b, hkv, d) or past_length.shape[0] != b:
            raise ConfigError(
                f"new {list(new.shape)} and past_length {list(past_length.shape)} do not fit the cache "
                f"{list(cache.shape)}: batch, kv heads and head dim must agree."
            )
        if past_length.numel() and (int(past_length.min()) < 0 or int(past_length.max()) + new.shape[2] > slots):
            raise ConfigError(
                f"past_length {past_length.tolist()} + {new.shape[2]} new tokens do not fit a cache of {slots} "
                f"slots; allocate a longer cache (past_length + S <= C)."
            )
    return _write_cache(cache, new, past_length)
