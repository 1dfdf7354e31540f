"""The fused RoPE Triton kernel: rotates q and k in one launch.

Grid: ``(B * S, cdiv(Hq, BLOCK_H) + cdiv(Hkv, BLOCK_H))``. A program owns one token and a block of heads of
q (first ``cdiv(Hq, BLOCK_H)`` column blocks) or of k (the rest). It gets cos/sin for its token once (table
row, cache row, or computed from the position) and reuses them for every head of its block; each head row is
read with contiguous loads (``x[:r/2]`` and ``x[r/2:r]`` for ``half``; one ``[r]`` load split into even/odd
lanes for ``interleaved``) and the pass-through tail ``x[r:]`` is copied. Multi-axis positions (M-RoPE's
``[3, B, S]``, axial's ``[2, B, S]``, contiguous) give each frequency slot the id of its axis (chunked sections
or Qwen3-VL's interleaved t,h,w); q's rotated slice may start at ``ROT_OFFSET`` (MLA: the rope part after the
position-free part of each head; k, its one shared rope head, has its own head dim ``HEAD_DIM_K``). Math runs
in float32; angles computed in the kernel use float32-exact range reduction (static frequencies, mirroring
:func:`posenc.functional.exact_angles`) or float64 (dynamic NTK).

Argument order is the TensorRT ahead-of-time contract: tensor inputs, int32 scalars, tensor outputs.
Unused pointers are passed as ``None`` (compile-time constants) and vanish from the compiled parameter list.

This module imports triton at import time; import it lazily (``posenc.plugins.rope.launch`` and ``.aot`` do).
"""

import triton
import triton.language as tl

# Codes shared with spec.py (_ANGLE_CODES / _POSITION_CODES).
TABLE = tl.constexpr(0)
CACHE = tl.constexpr(1)
FREQ = tl.constexpr(2)
NTK = tl.constexpr(3)
IDS = tl.constexpr(0)
OFFSET = tl.constexpr(1)

TWO_PI = tl.constexpr(6.283185307179586)
INV_TWO_PI = tl.constexpr(0.15915494309189535)


@triton.jit
def _centered(x):
    """``x`` minus its nearest integer, in [-0.5, 0.5) (exact for |x| < 2**22)."""
    return x - tl.floor(x + 0.5)


@triton.jit
def _f64(hi: tl.constexpr, lo: tl.constexpr):
    """A float64 scalar from an exact float32 hi/lo pair (Triton would round a Python float to float32)."""
    return tl.full([], hi, tl.float64) + tl.full([], lo, tl.float64)


@triton.jit
def _row_length(pos_ptr, prow, S, sp_b, sp_s, POSITIONS: tl.constexpr, BLOCK_S: tl.constexpr):
    """Length of one sequence: max position + 1 over its row (ids) or offset + S (offsets), int64."""
    if POSITIONS == 0:
        best = tl.full([BLOCK_S], -1, tl.int64)
        for start in range(0, S, BLOCK_S):
            cols = start + tl.arange(0, BLOCK_S)
            chunk = tl.load(pos_ptr + prow * sp_b + cols.to(tl.int64) * sp_s, mask=cols < S, other=-1)
            best = tl.maximum(best, chunk.to(tl.int64))
        length = tl.max(best, axis=0) + 1
    else:
        length = tl.load(pos_ptr + prow * sp_b).to(tl.int64) + S
    return length


@triton.jit
def _slot_axis(i, SEC_T: tl.constexpr, SEC_H: tl.constexpr, SEC_W: tl.constexpr, SEC_INTERLEAVED: tl.constexpr):
    """Position axis of each frequency slot ``i``: chunks of SEC_T, SEC_H, SEC_W slots, or interleaved t,h,w
    (height where ``i % 3 == 1`` and ``i < 3·SEC_H``, width where ``i % 3 == 2`` and ``i < 3·SEC_W``)."""
    if SEC_INTERLEAVED:
        height = ((i % 3) == 1) & (i < 3 * SEC_H)
        width = ((i % 3) == 2) & (i < 3 * SEC_W)
        axis = tl.where(height, 1, tl.where(width, 2, 0))
    else:
        axis = (i >= SEC_T).to(tl.int32) + (i >= SEC_T + SEC_H).to(tl.int32)
    return axis.to(tl.int64)


@triton.jit
def _exact_turns(pos, t_ptr, i, imask, HALF: tl.constexpr):
    """``pos * turns`` mod 1 in [-0.5, 0.5), float32-exact (turns split in 3 pieces by split_turns)."""
    low_i = pos & 4095
    high = (pos - low_i).to(tl.float32)
    low = low_i.to(tl.float32)
    t1 = tl.load(t_ptr + i, mask=imask, other=0.0)
    t2 = tl.load(t_ptr + HALF + i, mask=imask, other=0.0)
    t3 = tl.load(t_ptr + 2 * HALF + i, mask=imask, other=0.0)
    total = _centered(_centered(high * t1) + _centered(low * t1))
    total = _centered(total + _centered(high * t2))
    total = _centered(total + _centered(low * t2))
    return _centered(total + (high + low) * t3)


@triton.jit
def _ntk_turns(
    pos,
    length,
    i,
    ROT: tl.constexpr,
    NTK_MAX_POS: tl.constexpr,
    LOG2_THETA_HI: tl.constexpr,
    LOG2_THETA_LO: tl.constexpr,
    NTK_FACTOR_HI: tl.constexpr,
    NTK_FACTOR_LO: tl.constexpr,
    POWER_HI: tl.constexpr,
    POWER_LO: tl.constexpr,
):
    """Dynamic NTK: ``pos * inv_freq(L) / 2π`` mod 1 in float64, L = max(length, max_position_embeddings).

    :func:`posenc.rope_types.dynamic_ntk_base` in log2 form (Triton tensors have no float64 ``**``): log2 θ' =
    log2 θ + POWER · log2(factor · L / M − (factor − 1)); the constants come from :meth:`RopeKernelSpec.constexprs`
    (POWER = ``ntk_exponent(r)``) and tests/plugins/rope check the result against ``rope_inv_freq``.
    """
    factor = _f64(NTK_FACTOR_HI, NTK_FACTOR_LO)
    seq = tl.maximum(length, NTK_MAX_POS).to(tl.float64)
    scale = factor * seq / NTK_MAX_POS - (factor - 1.0)
    log2_base = _f64(LOG2_THETA_HI, LOG2_THETA_LO) + _f64(POWER_HI, POWER_LO) * tl.log2(scale)
    exponents = (2 * i).to(tl.float64) / ROT
    turns = tl.exp2(-exponents * log2_base) * tl.full([], INV_TWO_PI, tl.float64)
    t = pos.to(tl.float64) * turns
    t = t - tl.floor(t + 0.5)
    return t.to(tl.float32)


@triton.jit
def _rotate_heads(
    x_ptr,
    o_ptr,
    b,
    s,
    h0,
    n_heads,
    sx_b,
    sx_h,
    sx_s,
    so_b,
    so_h,
    so_s,
    cos,
    sin,
    INTERLEAVED: tl.constexpr,
    ROT: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
    BLOCK_H: tl.constexpr,
    COPY_TAIL: tl.constexpr,
    OFFSET: tl.constexpr,
    BLOCK_HEAD: tl.constexpr,
):
    """Rotate features ``[OFFSET, OFFSET + ROT)`` of heads ``[h0, h0 + BLOCK_H)`` of one token (cos/sin
    ``[BLOCK_HALF]`` float32); with ``COPY_TAIL`` the other features ``[0, OFFSET)`` and ``[OFFSET + ROT, D)`` are
    copied."""
    HALF: tl.constexpr = ROT // 2
    heads = h0 + tl.arange(0, BLOCK_H)
    hmask = heads < n_heads
    heads64 = heads.to(tl.int64)
    x_base = x_ptr + (b * sx_b + s * sx_s) + heads64[:, None] * sx_h
    o_base = o_ptr + (b * so_b + s * so_s) + heads64[:, None] * so_h
    x_row = x_base + OFFSET
    o_row = o_base + OFFSET
    c = cos[None, :]
    sn = sin[None, :]
    if INTERLEAVED:
        d = tl.arange(0, 2 * BLOCK_HALF)
        mask = hmask[:, None] & (d < ROT)[None, :]
        x = tl.load(x_row + d[None, :], mask=mask, other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(x, [BLOCK_H, BLOCK_HALF, 2]))
        y = tl.reshape(tl.join(x1 * c - x2 * sn, x2 * c + x1 * sn), [BLOCK_H, 2 * BLOCK_HALF])
        tl.store(o_row + d[None, :], y.to(o_ptr.dtype.element_ty), mask=mask)
    else:
        d = tl.arange(0, BLOCK_HALF)
        mask = hmask[:, None] & (d < HALF)[None, :]
        x1 = tl.load(x_row + d[None, :], mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_row + HALF + d[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(o_row + d[None, :], (x1 * c - x2 * sn).to(o_ptr.dtype.element_ty), mask=mask)
        tl.store(o_row + HALF + d[None, :], (x2 * c + x1 * sn).to(o_ptr.dtype.element_ty), mask=mask)
    if COPY_TAIL:
        t = OFFSET + ROT + tl.arange(0, BLOCK_TAIL)
        tmask = hmask[:, None] & (t < HEAD_DIM)[None, :]
        tail = tl.load(x_base + t[None, :], mask=tmask, other=0.0)
        tl.store(o_base + t[None, :], tail.to(o_ptr.dtype.element_ty), mask=tmask)
        if OFFSET > 0:
            lead = tl.arange(0, BLOCK_HEAD)
            lmask = hmask[:, None] & (lead < OFFSET)[None, :]
            head = tl.load(x_base + lead[None, :], mask=lmask, other=0.0)
            tl.store(o_base + lead[None, :], head.to(o_ptr.dtype.element_ty), mask=lmask)


@triton.jit
def rope_qk_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    S,
    HQ,
    HKV,
    POS_ROWS,
    sq_b,
    sq_h,
    sq_s,
    sk_b,
    sk_h,
    sk_s,
    soq_b,
    soq_h,
    soq_s,
    sok_b,
    sok_h,
    sok_s,
    sc_0,
    sc_1,
    sp_b,
    sp_s,
    qo_ptr,
    ko_ptr,
    ANGLES: tl.constexpr,
    POSITIONS: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ROT: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
    BLOCK_H: tl.constexpr,
    COPY_TAIL: tl.constexpr,
    ATTN_FACTOR: tl.constexpr,
    LONGROPE_ORIGINAL: tl.constexpr,
    NTK_MAX_POS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    LOG2_THETA_HI: tl.constexpr,
    LOG2_THETA_LO: tl.constexpr,
    NTK_FACTOR_HI: tl.constexpr,
    NTK_FACTOR_LO: tl.constexpr,
    POWER_HI: tl.constexpr,
    POWER_LO: tl.constexpr,
    ROT_OFFSET: tl.constexpr,
    HEAD_DIM_K: tl.constexpr,
    BLOCK_HEAD: tl.constexpr,
    AXES: tl.constexpr,
    SEC_T: tl.constexpr,
    SEC_H: tl.constexpr,
    SEC_W: tl.constexpr,
    SEC_INTERLEAVED: tl.constexpr,
):
    """RoPE on q ``[B, Hq, S, D]``-like and k ``[B, Hkv, S, Dk]``-like strided views (strides in elements).

    Inputs by angle source: TABLE cos/sin ``[P, r/2]`` (row stride ``sc_0``); CACHE cos/sin ``[B, S, r/2]``
    (strides ``sc_0``, ``sc_1``); FREQ turns ``[n_sets, 3, r/2]`` float32 contiguous in ``cos_ptr``; NTK none.
    Positions ``[POS_ROWS, S]`` ids or ``[POS_ROWS]`` offsets (strides ``sp_b``, ``sp_s``); a row index past
    ``POS_ROWS - 1`` reuses the last row (broadcast of a single row). With ``AXES`` > 1 the ids are
    ``[AXES, POS_ROWS, S]``, contiguous (axis stride ``POS_ROWS · sp_b``), and slot i reads the axis
    :func:`_slot_axis` gives it. q rotates features ``[ROT_OFFSET, ROT_OFFSET + r)`` of its ``HEAD_DIM``; k
    features ``[0, r)`` of ``HEAD_DIM_K``.
    """
    HALF: tl.constexpr = ROT // 2
    token = tl.program_id(0)
    block = tl.program_id(1)
    b = (token // S).to(tl.int64)
    s = (token % S).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)
    imask = i < HALF

    if ANGLES == CACHE:
        offs = b * sc_0 + s * sc_1 + i
        cos = tl.load(cos_ptr + offs, mask=imask, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + offs, mask=imask, other=0.0).to(tl.float32)
    else:
        prow = tl.minimum(b, POS_ROWS - 1)
        if AXES > 1:
            axis = _slot_axis(i, SEC_T, SEC_H, SEC_W, SEC_INTERLEAVED)
            row = axis * POS_ROWS + prow  # contiguous [AXES, POS_ROWS, S]
            pos = tl.load(pos_ptr + row * sp_b + s * sp_s, mask=imask, other=0).to(tl.int64)
        elif POSITIONS == IDS:
            pos = tl.load(pos_ptr + prow * sp_b + s * sp_s).to(tl.int64)
        else:
            pos = tl.load(pos_ptr + prow * sp_b).to(tl.int64) + s
        if ANGLES == TABLE:
            offs = pos * sc_0 + i
            cos = tl.load(cos_ptr + offs, mask=imask, other=0.0).to(tl.float32)
            sin = tl.load(sin_ptr + offs, mask=imask, other=0.0).to(tl.float32)
        else:
            if ANGLES == FREQ:
                t_ptr = cos_ptr
                if LONGROPE_ORIGINAL > 0:
                    length = _row_length(pos_ptr, prow, S, sp_b, sp_s, POSITIONS, BLOCK_S)
                    t_ptr = cos_ptr + (length > LONGROPE_ORIGINAL).to(tl.int64) * (3 * HALF)
                turns = _exact_turns(pos, t_ptr, i, imask, HALF)
            else:
                length = _row_length(pos_ptr, prow, S, sp_b, sp_s, POSITIONS, BLOCK_S)
                turns = _ntk_turns(
                    pos,
                    length,
                    i,
                    ROT,
                    NTK_MAX_POS,
                    LOG2_THETA_HI,
                    LOG2_THETA_LO,
                    NTK_FACTOR_HI,
                    NTK_FACTOR_LO,
                    POWER_HI,
                    POWER_LO,
                )
            angle = turns * TWO_PI
            cos = tl.cos(angle)
            sin = tl.sin(angle)
            if ATTN_FACTOR != 1.0:
                cos = cos * ATTN_FACTOR
                sin = sin * ATTN_FACTOR

    q_blocks = tl.cdiv(HQ, BLOCK_H)
    if block < q_blocks:
        _rotate_heads(
            q_ptr,
            qo_ptr,
            b,
            s,
            block * BLOCK_H,
            HQ,
            sq_b,
            sq_h,
            sq_s,
            soq_b,
            soq_h,
            soq_s,
            cos,
            sin,
            INTERLEAVED,
            ROT,
            HEAD_DIM,
            BLOCK_HALF,
            BLOCK_TAIL,
            BLOCK_H,
            COPY_TAIL,
            ROT_OFFSET,
            BLOCK_HEAD,
        )
    else:
        _rotate_heads(
            k_ptr,
            ko_ptr,
            b,
            s,
            (block - q_blocks) * BLOCK_H,
            HKV,
            sk_b,
            sk_h,
            sk_s,
            sok_b,
            sok_h,
            sok_s,
            cos,
            sin,
            INTERLEAVED,
            ROT,
            HEAD_DIM_K,
            BLOCK_HALF,
            BLOCK_TAIL,
            BLOCK_H,
            COPY_TAIL,
            0,
            BLOCK_HEAD,
        )


__all__ = ["rope_qk_kernel", "triton"]
