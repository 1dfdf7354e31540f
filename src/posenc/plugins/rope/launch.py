"""Run the fused RoPE kernel on torch tensors (CUDA, or CPU under ``TRITON_INTERPRET=1``).

:func:`rope_qk` validates shapes, dtypes and positions (positions past a table raise :class:`PositionError`
before anything is launched), picks a block size and launches one kernel for q and k. :func:`freq_inputs`
turns Hugging Face ``rope_parameters`` into the kernel's in-kernel frequency input.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import torch

from posenc import functional, rope_types
from posenc.errors import BackendUnavailable, ConfigError, PositionError
from posenc.plugins.rope.aot import launch_grid, load_kernel
from posenc.plugins.rope.spec import (
    ACTIVATION_DTYPES,
    NTK_ROPE_TYPE,
    TABLE_DTYPES,
    AngleSource,
    PositionMode,
    QKFormat,
    RopeKernelSpec,
    check_dtype,
    next_power_of_2,
    parse_qk_format,
)

__all__ = ["check_rope_positions", "default_block", "freq_inputs", "load_kernel", "rope_qk"]

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _dtype_name(t: torch.Tensor) -> str:
    return _DTYPE_NAMES.get(t.dtype, str(t.dtype).replace("torch.", ""))


def freq_inputs(rotary_dim: int, params: Mapping[str, Any] | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """In-kernel frequency input of a ``rope_type`` with a finite set of frequencies (every type but continuous
    length-dependent ones), from :func:`posenc.functional.rope_frequency_sets`.

    Args:
        rotary_dim: r.
        params: Hugging Face ``rope_parameters`` (see :func:`posenc.functional.rope_inv_freq`). ``dynamic`` depends
            on the length continuously: use ``AngleSource.NTK`` instead.

    Returns:
        ``(turns, spec_kwargs)``: float32 ``[3, r/2]`` (``[2, 3, r/2]`` for a type that switches sets at one length,
        LongRoPE: the set up to the switch, then the one beyond) and the :class:`RopeKernelSpec` keyword arguments
        ``attention_factor`` and ``longrope_original`` (the switch length, 0 for one set).

    Raises:
        ConfigError: bad parameters, a continuously length-dependent type, a type that scales q and k apart
            (xPos), more than one switch, or sets with different attention factors (the kernel takes one).
    """
    entry = rope_types.get(rope_types.rope_type_name(params))
    if entry.continuous:
        remedy = (
            "use AngleSource.NTK (rope_theta, factor, max_position_embeddings) instead of precomputed frequencies"
            if entry.name == NTK_ROPE_TYPE
            else "the kernel has no in-kernel form of it: pass cos/sin computed per call (AngleSource.CACHE)"
        )
        raise ConfigError(f"rope_type {entry.name!r} depends on each sequence's length; {remedy}.")
    if entry.scale_rate is not None:
        raise ConfigError(
            f"rope_type {entry.name!r} scales q and k per position in opposite directions, so they need different "
            f"cos/sin; the kernel applies one to both. Rotate them with two RotaryEmbedding ops instead "
            f"(`posenc optimize --rope fused`)."
        )
    points, sets = functional.rope_frequency_sets(rotary_dim, params)
    factors = {factor for _, factor in sets}
    if len(points) > 1 or len(factors) > 1:
        raise ConfigError(
            f"rope_type {entry.name!r} switches at {list(points)} with attention factors {sorted(factors)}; the "
            f"kernel takes at most one switch and one attention factor. Pass cos/sin per call (AngleSource.CACHE)."
        )
    turns = (
        torch.stack([functional.split_turns(inv_freq) for inv_freq, _ in sets])
        if points
        else functional.split_turns(sets[0][0])
    )
    return turns, {"attention_factor": sets[0][1], "longrope_original": points[0] if points else 0}


def default_block(num_q_heads: int, num_kv_heads: int, rotary_dim: int, num_tokens: int) -> tuple[int, int]:
    """``(BLOCK_H, num_warps)``: equal head blocks for q and k, >= 8 elements (16 bytes of bf16) per thread.

    The block is the largest power of two dividing both head counts (so q and k programs do equal work),
    capped at 16, or at 4 when there are few tokens (decode: more programs to fill the GPU).
    """
    common = math.gcd(num_q_heads, num_kv_heads)
    block_h = common & -common if common else 1
    if block_h < 4:
        block_h = min(next_power_of_2(max(num_q_heads, num_kv_heads)), 8)
    block_h = min(block_h, 16 if num_tokens >= 256 else 4)
    per_half = block_h * next_power_of_2(max(rotary_dim // 2, 1))
    num_warps = max(1, min(8, per_half // 256))
    return block_h, num_warps


def check_rope_positions(
    spec: RopeKernelSpec,
    positions: torch.Tensor | None,
    seq_len: int,
    table_rows: int | None = None,
) -> None:
    """Check positions against what the kernel can serve, before a launch (runtime guard).

    Args:
        spec: kernel configuration.
        positions: ids ``[B|1, S]`` or offsets ``[B|1]`` (``None`` for ``CACHE``).
        seq_len: S.
        table_rows: rows of the cos/sin table (``TABLE`` only).

    Raises:
        PositionError: a negative position, a position >= ``table_rows`` (tables), or one past the float32-exact
            range 2**24 (in-kernel angles).
    """
    if not spec.angles.uses_positions or positions is None or positions.numel() == 0:
        return
    low = int(positions.min())
    high = int(positions.max())
    if spec.positions is PositionMode.OFFSET:
        high += int(seq_len) - 1
    if low < 0:
        raise PositionError(
            f"position {low} is negative; RoPE positions (and start offsets) must be >= 0. Fix the position ids."
        )
    if spec.angles is AngleSource.TABLE:
        if table_rows is not None and high >= table_rows:
            raise PositionError(
                f"position {high} is past the cos/sin table ({table_rows} rows, positions 0..{table_rows - 1}); "
                f"rebuild the table with max_positions > {high} or use in-kernel angles (AngleSource.FREQ)."
            )
    elif high > spec.max_exact_position:
        raise PositionError(
            f"position {high} is past {spec.max_exact_position}, the largest position whose in-kernel angle is "
            f"float32-exact; split the sequence or use a float64 cos/sin table."
        )


def _check_qk(q: torch.Tensor, k: torch.Tensor, spec: RopeKernelSpec, fmt: QKFormat) -> tuple[int, int, int, int]:
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ConfigError(
                f"{name} must be a 4-D tensor ({fmt.value.upper()}), got {got}; reshape [B, S, H*D] to [B, S, H, D] "
                f"and pass qk_format='bshd'."
            )
        check_dtype(_dtype_name(t), ACTIVATION_DTYPES, name)
    if q.dtype != k.dtype or q.device != k.device:
        raise ConfigError(f"q and k must share dtype and device, got {q.dtype}/{q.device} and {k.dtype}/{k.device}.")
    h_axis, s_axis = (1, 2) if fmt is QKFormat.BHSD else (2, 1)
    B, S, D = q.shape[0], q.shape[s_axis], q.shape[3]
    if k.shape[0] != B or k.shape[s_axis] != S:
        raise ConfigError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch and sequence ({fmt.value}).")
    if spec.head_dim != D or spec.key_head_dim != k.shape[3]:
        raise ConfigError(
            f"q/k head dims {D}/{k.shape[3]} do not match the kernel's head_dim {spec.head_dim} and key_head_dim "
            f"{spec.key_head_dim}."
        )
    return B, S, q.shape[h_axis], k.shape[h_axis]


def _check_angle_inputs(
    spec: RopeKernelSpec,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    turns: torch.Tensor | None,
    B: int,
    S: int,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    half = spec.half
    if spec.angles in (AngleSource.TABLE, AngleSource.CACHE):
        if cos is None or sin is None:
            raise ConfigError(f"angle source {spec.angles.value!r} needs cos and sin tensors.")
        if cos.shape != sin.shape or cos.dtype != sin.dtype:
            raise ConfigError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must share shape and dtype.")
        check_dtype(_dtype_name(cos), TABLE_DTYPES, "cos/sin")
        want = "[max_positions, r/2]" if spec.angles is AngleSource.TABLE else "[B, S, r/2]"
        rank = 2 if spec.angles is AngleSource.TABLE else 3
        if cos.dim() != rank or cos.shape[-1] != half:
            raise ConfigError(f"cos/sin must be {want} with r/2 = {half}, got {tuple(cos.shape)}.")
        if spec.angles is AngleSource.CACHE:
            if cos.shape[0] not in (1, B) or cos.shape[1] != S:
                raise ConfigError(
                    f"cos/sin caches must be [B or 1, S, r/2] = [{B}, {S}, {half}], got {tuple(cos.shape)}."
                )
            cos, sin = cos.expand(B, S, half), sin.expand(B, S, half)
        if cos.stride(-1) != 1 or sin.stride() != cos.stride():
            cos, sin = cos.contiguous(), sin.contiguous()
        return cos, sin
    if spec.angles is AngleSource.FREQ:
        sets = 2 if spec.longrope_original > 0 else 1
        want_shape = (3, half) if sets == 1 else (2, 3, half)
        if turns is None or tuple(turns.shape) != want_shape or turns.dtype != torch.float32:
            got = None if turns is None else (tuple(turns.shape), turns.dtype)
            raise ConfigError(
                f"in-kernel angles need turns float32 {list(want_shape)} from posenc.functional.split_turns "
                f"(see freq_inputs), got {got}."
            )
        return turns.contiguous(), None
    return None, None


def _check_positions_tensor(spec: RopeKernelSpec, positions: torch.Tensor | None, B: int, S: int) -> torch.Tensor:
    if positions is None or positions.dtype not in (torch.int64, torch.int32):
        got = None if positions is None else positions.dtype
        raise ConfigError(f"angle source {spec.angles.value!r} needs int64 (or int32) positions, got {got}.")
    if spec.axes > 1:
        if positions.dim() != 3 or positions.shape[0] != spec.axes or positions.shape[1] not in (1, B):
            raise ConfigError(
                f"multi-axis position ids must be [{spec.axes}, B or 1, S] = [{spec.axes}, {B}, {S}], got "
                f"{tuple(positions.shape)}."
            )
        if positions.shape[2] != S:
            raise ConfigError(f"position ids must have S = {S} columns, got {tuple(positions.shape)}.")
        return positions.contiguous()  # the kernel steps between axes by rows · row stride
    if spec.positions is PositionMode.IDS:
        if positions.dim() != 2 or positions.shape[0] not in (1, B) or positions.shape[1] != S:
            raise ConfigError(f"position ids must be [B or 1, S] = [{B}, {S}], got {tuple(positions.shape)}.")
    elif positions.dim() != 1 or positions.shape[0] not in (1, B):
        raise ConfigError(f"start offsets must be [B] or [1] (B = {B}), got {tuple(positions.shape)}.")
    return positions


def rope_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    spec: RopeKernelSpec,
    *,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    turns: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    qk_format: QKFormat | str = QKFormat.BHSD,
    inplace: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_h: int | None = None,
    num_warps: int | None = None,
    check_positions: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k with one kernel launch.

    Args:
        q: ``[B, Hq, S, D]`` (``bhsd``) or ``[B, S, Hq, D]`` (``bshd``), any strides with a contiguous last axis;
            float32/float16/bfloat16.
        k: same layout with Hkv heads (Hkv may differ from Hq) and ``spec.key_head_dim`` features (MLA: the shared
            rope slice, while q's rotated features start at ``spec.rotary_offset``).
        spec: what to compute (:class:`RopeKernelSpec`).
        cos, sin: TABLE ``[max_positions, r/2]`` or CACHE ``[B|1, S, r/2]``, any float dtype above.
        turns: FREQ float32 ``[3, r/2]`` or ``[2, 3, r/2]`` (:func:`freq_inputs`).
        positions: ids ``[B|1, S]`` or offsets ``[B|1]`` (per ``spec.positions``), int64/int32; multi-axis ids
            ``[A, B|1, S]`` when ``spec.mrope_section`` is set.
        qk_format: ``"bhsd"`` or ``"bshd"``.
        inplace: write the result into q and k (the tail is then left untouched).
        out: preallocated ``(q_out, k_out)`` of q's and k's shapes and dtype (e.g. TensorRT's output buffers).
        block_h, num_warps: heads per program and warps (default: :func:`default_block`).
        check_positions: check positions on the host first (:func:`check_rope_positions`; reads them, so it
            synchronizes a CUDA stream). Turn off only inside CUDA graph capture or timing loops.

    Returns:
        ``(q_rotated, k_rotated)`` with q's and k's shapes, strides and dtype.

    Raises:
        ConfigError: bad shapes, dtypes or missing inputs.
        PositionError: positions past the table (checked on the host before the launch).
        BackendUnavailable: triton missing, or CPU tensors without ``TRITON_INTERPRET=1``.
    """
    fmt = parse_qk_format(qk_format)
    B, S, Hq, Hkv = _check_qk(q, k, spec, fmt)
    cos, sin = _check_angle_inputs(spec, cos, sin, turns, B, S)
    if spec.angles.uses_positions:
        positions = _check_positions_tensor(spec, positions, B, S)
        table_rows = cos.shape[0] if spec.angles is AngleSource.TABLE and cos is not None else None
        if check_positions:
            check_rope_positions(spec, positions, S, table_rows)
    if q.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise BackendUnavailable(
            "the RoPE kernel runs on CPU tensors only in Triton's interpreter; set TRITON_INTERPRET=1 before "
            "triton is imported, or move q and k to a CUDA device."
        )
    kernel = load_kernel()
    if inplace and (q.stride(-1) != 1 or k.stride(-1) != 1):
        raise ConfigError("inplace rotation needs q and k with a contiguous last axis; pass inplace=False.")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    if out is not None:
        q_out, k_out = out
        if q_out.shape != q.shape or k_out.shape != k.shape or q_out.dtype != q.dtype or k_out.dtype != k.dtype:
            raise ConfigError("out tensors must have q's and k's shapes and dtype.")
        if q_out.stride(-1) != 1 or k_out.stride(-1) != 1:
            raise ConfigError("out tensors need a contiguous last axis.")
    else:
        q_out = q if inplace else torch.empty_like(q)
        k_out = k if inplace else torch.empty_like(k)
    if B * S == 0:
        return q_out, k_out
    auto_h, auto_warps = default_block(Hq, Hkv, spec.rotary_dim, B * S)
    block_h = block_h or auto_h
    num_warps = num_warps or auto_warps

    def bhs(t: torch.Tensor) -> tuple[int, int, int]:
        st = t.stride()
        return (st[0], st[1], st[2]) if fmt is QKFormat.BHSD else (st[0], st[2], st[1])

    sc = (0, 0)
    if spec.angles is AngleSource.TABLE and cos is not None:
        sc = (cos.stride(0), 0)
    elif spec.angles is AngleSource.CACHE and cos is not None:
        sc = (cos.stride(0), cos.stride(1))
    pos_rows, sp = 1, (0, 0)
    if spec.angles.uses_positions and positions is not None:
        rows = positions if positions.dim() < 3 else positions[0]  # multi-axis: [A, rows, S], contiguous
        pos_rows = rows.shape[0]
        sp = (rows.stride(0), rows.stride(1) if rows.dim() == 2 else 0)
    grid = launch_grid(fmt, tuple(q.shape), tuple(k.shape), block_h)
    kernel.rope_qk_kernel[grid](
        q,
        k,
        cos,  # cos table / cache, or the FREQ turns
        sin if spec.angles in (AngleSource.TABLE, AngleSource.CACHE) else None,
        positions if spec.angles.uses_positions else None,
        S,
        Hq,
        Hkv,
        pos_rows,
        *bhs(q),
        *bhs(k),
        *bhs(q_out),
        *bhs(k_out),
        *sc,
        *sp,
        q_out,
        k_out,
        **spec.constexprs(block_h, copy_tail=not (inplace and out is None)),
        num_warps=num_warps,
        enable_fp_fusion=True,
    )
    return q_out, k_out
