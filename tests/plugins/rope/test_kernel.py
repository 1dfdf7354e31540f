"""The fused RoPE kernel under Triton's interpreter (TRITON_INTERPRET=1, set by tests/conftest.py) against float64.

Shapes are tiny (the interpreter runs every program in Python); GQA everywhere (4 q heads, 2 kv heads).
"""

from __future__ import annotations

import math

import pytest
import torch

from posenc import AttentionConfig, functional, get_spec, rope_types
from posenc.errors import ConfigError, PositionError
from posenc.plugins.rope import RopeKernelSpec, freq_inputs, rope_qk
from posenc.schemes.base import DEFAULT_TOLERANCES
from posenc.schemes.rope import rope_parameters
from tests.plugins.rope.reference import naive_rotation, positions_of, rotate_reference, row_inv_freq
from tests.test_rope_types import toy_entry

pytest.importorskip("triton", reason="the RoPE kernel needs triton")

B, HQ, HKV, S, D = 2, 4, 2, 3, 16
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _qk(dtype: torch.dtype = torch.float32, fmt: str = "bhsd", seq: int = S) -> tuple[torch.Tensor, torch.Tensor]:
    q, k = torch.randn(B, HQ, seq, D), torch.randn(B, HKV, seq, D)
    if fmt == "bshd":  # strided views of [B, S, H, D] storage
        q, k = q.transpose(1, 2).contiguous().transpose(1, 2), k.transpose(1, 2).contiguous().transpose(1, 2)
    return q.to(dtype), k.to(dtype)


def _as_format(t: torch.Tensor, fmt: str) -> torch.Tensor:
    return t.transpose(1, 2) if fmt == "bshd" else t


def _check(out: torch.Tensor, ref: torch.Tensor, dtype_name: str) -> None:
    tol = DEFAULT_TOLERANCES[dtype_name]
    torch.testing.assert_close(out.to(torch.float64), ref, atol=tol.atol, rtol=tol.rtol)


# ------------------------------------------------------------------------------------------------------
# table mode: layouts x partial rotary x dtypes x q/k formats
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(("rotary_dim", "fmt"), [(16, "bhsd"), (8, "bshd"), (6, "bhsd")])
def test_table_matches_functional(dtype_name: str, layout: str, rotary_dim: int, fmt: str) -> None:
    dtype = DTYPES[dtype_name]
    q, k = _qk(dtype, fmt)
    inv_freq, _ = functional.rope_inv_freq(rotary_dim)
    cos, sin = functional.rope_cos_sin(torch.arange(32), inv_freq)
    pos = torch.randint(0, 32, (B, S))
    spec = RopeKernelSpec("table", rotary_dim, D, layout)
    q_view, k_view = _as_format(q, fmt), _as_format(k, fmt)
    q_out, k_out = rope_qk(q_view, k_view, spec, cos=cos, sin=sin, positions=pos, qk_format=fmt)
    assert q_out.dtype == dtype
    assert q_out.shape == q_view.shape
    _check(_as_format(q_out, fmt), rotate_reference(q, pos, inv_freq, 1.0, layout, rotary_dim), dtype_name)
    _check(_as_format(k_out, fmt), rotate_reference(k, pos, inv_freq, 1.0, layout, rotary_dim), dtype_name)
    if rotary_dim < D:  # the tail passes through bit-exactly
        assert torch.equal(_as_format(q_out, fmt)[..., rotary_dim:], q[..., rotary_dim:])


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_against_a_naive_loop(layout: str) -> None:
    """Independent of posenc.functional: Python floats, pair by pair."""
    q, k = _qk()
    inv_freq, _ = functional.rope_inv_freq(D, {"rope_theta": 500000.0})
    cos, sin = functional.rope_cos_sin(torch.arange(16), inv_freq)
    pos = torch.randint(0, 16, (B, S))
    q_out, _ = rope_qk(q, k, RopeKernelSpec("table", D, D, layout), cos=cos, sin=sin, positions=pos)
    freqs = inv_freq.tolist()
    for b, h, s in [(0, 0, 0), (1, 3, 2), (0, 2, 1)]:
        want = naive_rotation(q[b, h, s].double().tolist(), int(pos[b, s]), freqs, layout)
        assert q_out[b, h, s].double().tolist() == pytest.approx(want, abs=1e-5)


def test_table_of_half_precision_and_broadcast_inputs() -> None:
    """fp16 tables, one position row shared by the batch, table in the activation dtype."""
    q, k = _qk(torch.bfloat16)
    inv_freq, _ = functional.rope_inv_freq(D)
    cos, sin = functional.rope_cos_sin(torch.arange(8), inv_freq, dtype=torch.float16)
    pos = torch.tensor([[5, 6, 7]])
    q_out, k_out = rope_qk(q, k, RopeKernelSpec("table", D, D), cos=cos, sin=sin, positions=pos)
    full = pos.expand(B, S)
    ref_q = functional.apply_rope(q.double(), cos[full][:, None].double(), sin[full][:, None].double())
    _check(q_out, ref_q, "bfloat16")
    assert k_out.shape == k.shape


def test_cache_mode_and_inplace() -> None:
    q, k = _qk()
    inv_freq, _ = functional.rope_inv_freq(8)
    pos = torch.randint(0, 100, (B, S))
    cos, sin = functional.rope_cos_sin(pos, inv_freq)  # per token [B, S, r/2]
    spec = RopeKernelSpec("cache", 8, D, "interleaved")
    want_q = rotate_reference(q, pos, inv_freq, 1.0, "interleaved", 8)
    q_ip, k_ip = q.clone(), k.clone()
    q_out, k_out = rope_qk(q_ip, k_ip, spec, cos=cos, sin=sin, inplace=True)
    assert q_out.data_ptr() == q_ip.data_ptr()
    assert k_out.data_ptr() == k_ip.data_ptr()
    _check(q_ip, want_q, "float32")
    _check(k_ip, rotate_reference(k, pos, inv_freq, 1.0, "interleaved", 8), "float32")
    assert torch.equal(q_ip[..., 8:], q[..., 8:])


def test_strided_rows() -> None:
    """q and k are column slices of wider buffers (row stride != D)."""
    wide_q, wide_k = torch.randn(B, HQ, S, D + 8), torch.randn(B, HKV, S, D + 8)
    q, k = wide_q[..., 4 : 4 + D], wide_k[..., 4 : 4 + D]
    inv_freq, _ = functional.rope_inv_freq(D)
    cos, sin = functional.rope_cos_sin(torch.arange(16), inv_freq)
    pos = torch.randint(0, 16, (B, S))
    q_out, k_out = rope_qk(q, k, RopeKernelSpec("table", D, D), cos=cos, sin=sin, positions=pos)
    _check(q_out, rotate_reference(q, pos, inv_freq, 1.0, "half", D), "float32")
    _check(k_out, rotate_reference(k, pos, inv_freq, 1.0, "half", D), "float32")


# ------------------------------------------------------------------------------------------------------
# in-kernel angles: every static scaling type, LongRoPE switching, dynamic NTK, long positions
# ------------------------------------------------------------------------------------------------------

SCALINGS = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "ntk": {"rope_type": "ntk", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64},
    "yarn_deepseek": {
        "rope_type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 64,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "truncation": {"rope_type": "truncation", "truncation_a": 0.01, "truncation_c": 0.5, "truncation_beta": 0.1},
}


@pytest.mark.parametrize("name", list(SCALINGS))
def test_static_scaling_types_in_kernel(name: str) -> None:
    params = SCALINGS[name]
    layout = "interleaved" if name in ("linear", "llama3") else "half"
    q, k = _qk()
    pos = torch.randint(0, 4096, (B, S))
    turns, kwargs = freq_inputs(D, params)
    spec = RopeKernelSpec("freq", D, D, layout, **kwargs)
    q_out, k_out = rope_qk(q, k, spec, turns=turns, positions=pos)
    inv_freq, factor = functional.rope_inv_freq(D, params)
    if name.startswith("yarn"):
        assert factor != 1.0  # the attention factor is exercised
    _check(q_out, rotate_reference(q, pos, inv_freq, factor, layout, D), "float32")
    _check(k_out, rotate_reference(k, pos, inv_freq, factor, layout, D), "float32")


@pytest.mark.parametrize(
    "rope_type",
    [
        name
        for name in rope_types.names()
        if not rope_types.get(name).continuous and rope_types.get(name).scale_rate is None
    ],
)
def test_every_registered_type_with_finite_frequency_sets_runs_in_kernel(rope_type: str) -> None:
    """From the registry: a type's scheme defaults (its default case) -> freq_inputs -> the kernel, against
    rope_inv_freq per row (rows on both sides of a switch, if the type has one). New types are covered without
    editing this test; types that scale q and k apart (xPos) are refused by freq_inputs (tests/schemes)."""
    config = AttentionConfig(hidden_size=64, num_heads=HQ, num_kv_heads=HKV, head_dim=D, max_position_embeddings=64)
    spec = get_spec(rope_types.get(rope_type).scheme)
    spec_params = spec.resolve(spec.cases["default"], config)
    params = rope_parameters(rope_type, spec_params, config)
    q, k = _qk()
    pos = torch.tensor([[0, 3, 9], [60, 61, 62]])
    turns, kwargs = freq_inputs(D, params)
    q_out, k_out = rope_qk(q, k, RopeKernelSpec("freq", D, D, "half", **kwargs), turns=turns, positions=pos)
    inv_rows, factor = row_inv_freq(D, params, pos)
    _check(q_out, rotate_reference(q, pos, inv_rows, factor, "half", D), "float32")
    _check(k_out, rotate_reference(k, pos, inv_rows, factor, "half", D), "float32")


def test_longrope_switches_per_row() -> None:
    params = {
        "rope_type": "longrope",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "short_factor": [1.0 + 0.1 * i for i in range(4)],
        "long_factor": [2.0 + 0.5 * i for i in range(4)],
    }
    q, k = _qk()
    pos = torch.tensor([[0, 1, 2], [20, 21, 22]])  # row 0 short (L=3), row 1 long (L=23 > 16)
    turns, kwargs = freq_inputs(8, params)
    spec = RopeKernelSpec("freq", 8, D, "half", **kwargs)
    q_out, _ = rope_qk(q, k, spec, turns=turns, positions=pos)
    inv_rows, factor = row_inv_freq(8, params, pos)
    assert not torch.equal(inv_rows[0], inv_rows[1])
    _check(q_out, rotate_reference(q, pos, inv_rows, factor, "half", 8), "float32")


@pytest.mark.parametrize("mode", ["ids", "offset"])
def test_dynamic_ntk_per_row_length(mode: str) -> None:
    params = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 32, "rope_theta": 10000.0}
    q, k = _qk()
    given = torch.tensor([[0, 5, 2], [70, 71, 72]]) if mode == "ids" else torch.tensor([3, 100])
    pos = positions_of(given, mode, B, S)
    spec = RopeKernelSpec("ntk", D, D, "interleaved", positions=mode, factor=2.0, max_position_embeddings=32)
    q_out, k_out = rope_qk(q, k, spec, positions=given)
    inv_rows, _ = row_inv_freq(D, params, pos)
    assert not torch.equal(inv_rows[0], inv_rows[1])  # row 0 within the trained length, row 1 scaled
    _check(q_out, rotate_reference(q, pos, inv_rows, 1.0, "interleaved", D), "float32")
    _check(k_out, rotate_reference(k, pos, inv_rows, 1.0, "interleaved", D), "float32")


@pytest.mark.parametrize("source", ["freq", "ntk"])
def test_long_positions_stay_accurate(source: str) -> None:
    """Positions up to 131072 (and 2**20) against float64; naive float32 angles would be off by ~1e-2."""
    q, k = torch.ones(1, 1, 4, D), torch.ones(1, 1, 4, D)
    offsets = torch.tensor([131072 - 3])
    pos = positions_of(offsets, "offset", 1, 4)
    if source == "freq":
        turns, kwargs = freq_inputs(D, {"rope_theta": 10000.0})
        spec = RopeKernelSpec("freq", D, D, positions="offset", **kwargs)
        q_out, _ = rope_qk(q, k, spec, turns=turns, positions=offsets)
        inv_freq, _ = functional.rope_inv_freq(D)
    else:
        params = {"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": 4096}
        spec = RopeKernelSpec("ntk", D, D, positions="offset", factor=4.0, max_position_embeddings=4096)
        q_out, _ = rope_qk(q, k, spec, positions=offsets)
        inv_freq, _ = functional.rope_inv_freq(D, params, seq_len=131072 + 1)
    ref = rotate_reference(q, pos, inv_freq, 1.0, "half", D)
    error = (q_out.double() - ref).abs().max().item()
    assert error < 5e-6
    naive = (pos.float()[0, :, None] * inv_freq.float()).cos()
    assert (naive.double() - ref[0, 0, :, : D // 2]).abs().max().item() > 1e-3  # what exact reduction avoids


def test_positions_to_2_pow_20_in_kernel() -> None:
    q, k = torch.randn(1, 1, 2, 8), torch.randn(1, 1, 2, 8)
    pos = torch.tensor([[2**20 - 1, 999_983]])
    turns, kwargs = freq_inputs(8, {"rope_theta": 10000.0})
    q_out, _ = rope_qk(q, k, RopeKernelSpec("freq", 8, 8, **kwargs), turns=turns, positions=pos)
    inv_freq, _ = functional.rope_inv_freq(8)
    _check(q_out, rotate_reference(q, pos, inv_freq, 1.0, "half", 8), "float32")


# ------------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------------


def test_positions_past_the_table_are_rejected_before_launch() -> None:
    q, k = _qk()
    inv_freq, _ = functional.rope_inv_freq(D)
    cos, sin = functional.rope_cos_sin(torch.arange(16), inv_freq)
    spec = RopeKernelSpec("table", D, D)
    with pytest.raises(PositionError, match="past the cos/sin table"):
        rope_qk(q, k, spec, cos=cos, sin=sin, positions=torch.tensor([[0, 1, 16], [0, 1, 2]]))
    with pytest.raises(PositionError, match="negative"):
        rope_qk(q, k, spec, cos=cos, sin=sin, positions=torch.tensor([[0, -1, 2], [0, 1, 2]]))
    offset_spec = RopeKernelSpec("table", D, D, positions="offset")
    with pytest.raises(PositionError, match="position 16"):  # offset 14 + S - 1 = 16
        rope_qk(q, k, offset_spec, cos=cos, sin=sin, positions=torch.tensor([0, 14]))


def test_positions_past_exact_range_are_rejected() -> None:
    q, k = _qk()
    turns, kwargs = freq_inputs(D)
    spec = RopeKernelSpec("freq", D, D, **kwargs)
    with pytest.raises(PositionError, match="float32-exact"):
        rope_qk(q, k, spec, turns=turns, positions=torch.full((B, S), 2**24))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"q": torch.randn(B, HQ, S, D, dtype=torch.float64)}, "float64"),
        ({"k": torch.randn(B, HKV, S + 1, D)}, "must agree"),
        ({"q": torch.randn(B, S, HQ * D)}, "4-D"),
        ({"cos": None}, "needs cos and sin"),
        ({"positions": torch.zeros(B, S)}, "int64"),
        ({"cos": torch.zeros(16, 4), "sin": torch.zeros(16, 4)}, "r/2 = 8"),
        ({"cos": torch.zeros(16, 8, dtype=torch.float64), "sin": torch.zeros(16, 8, dtype=torch.float64)}, "cos/sin"),
    ],
)
def test_bad_arguments_are_rejected(change: dict, message: str) -> None:
    q, k = _qk()
    inv_freq, _ = functional.rope_inv_freq(D)
    cos, sin = functional.rope_cos_sin(torch.arange(16), inv_freq)
    args = {"q": q, "k": k, "cos": cos, "sin": sin, "positions": torch.zeros(B, S, dtype=torch.int64)}
    args.update(change)
    with pytest.raises(ConfigError, match=message):
        rope_qk(args.pop("q"), args.pop("k"), RopeKernelSpec("table", D, D), **args)


def test_dynamic_type_is_not_a_static_frequency_set() -> None:
    with pytest.raises(ConfigError, match=r"AngleSource\.NTK"):
        freq_inputs(D, {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 8})


def test_frequency_sets_the_kernel_cannot_take_are_refused() -> None:
    """Two switch points, or sets with different attention factors: the kernel has one switch and one factor."""

    def two_switches(rotary_dim: int, base: float, params: dict, seq_len: object) -> tuple[torch.Tensor, float]:
        inv_freq = rope_types.default_inv_freq(rotary_dim, base)
        return rope_types.switch_at(
            seq_len, 8, rope_types.switch_at(seq_len, 4, inv_freq, inv_freq / 2), inv_freq / 3
        ), 1.0

    entry = toy_entry("toy_two_switches", two_switches, length_dependent=True, switch_points=lambda params: (4, 8))
    with rope_types.registered(entry):
        points, sets = functional.rope_frequency_sets(D, {"rope_type": entry.name})
        assert points == (4, 8)
        torch.testing.assert_close(sets[1][0] * 2, sets[0][0])
        with pytest.raises(ConfigError, match="at most one switch"):
            freq_inputs(D, {"rope_type": entry.name})


def test_empty_sequence_is_a_no_op() -> None:
    q, k = torch.randn(B, HQ, 0, D), torch.randn(B, HKV, 0, D)
    inv_freq, _ = functional.rope_inv_freq(D)
    cos, sin = functional.rope_cos_sin(torch.arange(4), inv_freq)
    q_out, k_out = rope_qk(
        q, k, RopeKernelSpec("table", D, D), cos=cos, sin=sin, positions=torch.zeros(B, 0, dtype=torch.int64)
    )
    assert q_out.shape == q.shape
    assert k_out.shape == k.shape


def test_interpreter_required_for_cpu_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc.errors import BackendUnavailable

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k = _qk()
    turns, kwargs = freq_inputs(D)
    with pytest.raises(BackendUnavailable, match="TRITON_INTERPRET=1"):
        rope_qk(
            q, k, RopeKernelSpec("freq", D, D, **kwargs), turns=turns, positions=torch.zeros(B, S, dtype=torch.int64)
        )
    assert math.isfinite(kwargs["attention_factor"])
