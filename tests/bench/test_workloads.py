"""Workloads: byte counts from first principles, units each scheme has, plan errors."""

from __future__ import annotations

import pytest
import torch

from posenc import functional
from posenc.bench.plan import make_plan, table_modes_for, targets_plan
from posenc.bench.shapes import Shape
from posenc.bench.workloads import build_workload, check_unit
from posenc.config import AttentionConfig
from posenc.errors import ConfigError
from posenc.schemes import get_spec, scheme_names
from posenc.schemes.base import Placement, TableMode

TINY = AttentionConfig(hidden_size=32, num_heads=4, num_kv_heads=2, max_position_embeddings=32)


def test_rope_op_bytes_and_output_follow_the_formula() -> None:
    shape = Shape(batch=2, seq=5, past=3, name="prefill")
    w = build_workload("rope", "op", "precomputed", TINY, shape)
    b, h, hkv, s, d = 2, 4, 2, 5, TINY.head_dim
    expected = 2 * 4 * (b * h * s * d + b * hkv * s * d) + 8 * b * s  # q, k read and written; int64 positions
    assert w.bytes_moved == expected
    # the op rotates at positions past .. past + seq - 1 (independent check through the functional contract)
    inv_freq, _ = functional.rope_inv_freq(d)
    cos, sin = functional.rope_cos_sin(torch.arange(3, 8).expand(b, s), inv_freq)
    q_expected = functional.apply_rope(w.inputs["q"], cos.unsqueeze(1), sin.unsqueeze(1))
    torch.testing.assert_close(w.outputs[0], q_expected)


def test_block_bytes_are_the_decode_step_floor_for_both_cache_layouts() -> None:
    shape = Shape(batch=1, seq=1, past=4, name="decode")
    e, h, hkv, d = 32, 4, 2, TINY.head_dim
    weights = 4 * (e * h * d + 2 * e * hkv * d + h * d * e)
    hidden = 4 * 2 * e  # hidden read, out written
    cache_read = 4 * 2 * hkv * 5 * d  # every cached and new key and value read once
    new_written = 4 * 2 * hkv * 1 * d  # the new key and value written once
    for unit in ("block", "block-inplace"):
        w = build_workload("alibi", unit, "dynamic", TINY, shape)
        assert w.bytes_moved == weights + hidden + cache_read + new_written, unit
        # projections (q, k, v, o) and QK^T, PV over the 5 keys, 2 FLOPs per multiply-add
        assert w.flops == 2 * e * (h * d + 2 * hkv * d) + 2 * h * d * e + 2 * 2 * h * 5 * d, unit


def test_projection_layout_op_rotates_like_the_functional_contract() -> None:
    shape = Shape(batch=2, seq=3, past=5, name="decode")
    w = build_workload("rope", "op-3d", "dynamic", TINY, shape)
    q, k = w.inputs["q"], w.inputs["k"]
    assert q.shape == (2, 3, 4 * TINY.head_dim)
    assert k.shape == (2, 3, 2 * TINY.head_dim)
    inv_freq, _ = functional.rope_inv_freq(TINY.head_dim)
    cos, sin = functional.rope_cos_sin(torch.arange(5, 8).expand(2, 3), inv_freq)
    heads = q.reshape(2, 3, 4, TINY.head_dim)  # [B, S, H, D]: cos/sin broadcast over heads
    expected = functional.apply_rope(heads, cos.unsqueeze(2), sin.unsqueeze(2)).reshape(2, 3, -1)
    torch.testing.assert_close(w.outputs[0], expected, atol=2e-6, rtol=1e-5)
    assert w.bytes_moved == 2 * 4 * (q.numel() + k.numel()) + 8 * 2 * 3


def test_units_each_scheme_has() -> None:
    for name in scheme_names():
        spec = get_spec(name)
        reason = check_unit(name, "op")
        assert (reason is None) == (spec.placement is not Placement.NONE and "op" in spec.exports)
        assert (check_unit(name, "op-3d") is None) == (spec.placement is Placement.QK)
        assert check_unit(name, "block") is None
    with pytest.raises(ConfigError, match="unknown unit"):
        check_unit("rope", "layer")
    with pytest.raises(ConfigError, match="unknown scheme"):
        check_unit("ropey", "op")
    with pytest.raises(ConfigError, match="no positional op"):
        build_workload("nope", "op", "precomputed", TINY, Shape(1, 2, name="prefill"))


def test_table_mode_choice_follows_the_spec() -> None:
    for name in scheme_names():
        modes = get_spec(name).table_modes
        ((auto, reason),) = table_modes_for(name, "auto")
        assert reason == ""
        assert TableMode(auto) in modes
        assert TableMode(auto) is TableMode.PRECOMPUTED or TableMode.PRECOMPUTED not in modes
        assert {m for m, _ in table_modes_for(name, "all")} == {m.value for m in modes}
    ((_mode, reason),) = table_modes_for("rope_dynamic", "precomputed")
    assert "no table mode" in reason
    with pytest.raises(ConfigError, match="table mode choice"):
        table_modes_for("rope", "cached")


def test_plans_validate_their_input() -> None:
    plan = make_plan(["rope", "nope"], ["op", "block"], "auto", [Shape(1, 4, name="prefill")], ["torch"], TINY)
    assert [(c.scheme, c.unit) for c in plan] == [("rope", "op"), ("rope", "block"), ("nope", "op"), ("nope", "block")]
    by_default = make_plan(["rope", "nope"], None, "auto", [Shape(1, 4, name="prefill")], ["torch"], TINY)
    assert [(c.scheme, c.unit) for c in by_default] == [
        ("rope", "op"),
        ("rope", "op-3d"),
        ("rope", "block"),
        ("nope", "block"),
    ]
    assert plan[2].skip_reason.startswith("nope has no positional op")
    with pytest.raises(ConfigError, match="unknown scheme"):
        make_plan(["rope", "alibii"])
    with pytest.raises(ConfigError, match="unknown backend"):
        make_plan(["rope"], backends=["onnxruntime"])
    with pytest.raises(ConfigError, match="unknown unit"):
        make_plan(["rope"], units=["layer"])
    with pytest.raises(ConfigError, match="no shapes"):
        make_plan(["rope"], shapes=[])
    targets = targets_plan()
    assert targets[0].scheme == "rope"
    assert targets[0].shape.seq == 2048
    assert targets[0].config.num_heads == 32
    assert {c.scheme for c in targets if c.unit == "block"} == set(scheme_names())
