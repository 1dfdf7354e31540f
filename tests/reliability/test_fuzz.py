"""Property-based fuzzing (hypothesis): random schemes x parameters x geometries x shapes through
:class:`~posenc.blocks.AttentionBlock`, :func:`~posenc.export.export_onnx` and :func:`~posenc.export.run_onnx`.

The properties: every refusal is a :class:`~posenc.errors.PosencError` subclass (never a raw ZeroDivisionError,
RuntimeError, IndexError, ...), and every configuration posenc accepts gives finite outputs.

The default profile keeps the example counts small (the suite stays fast); the ``slow`` tests run many more.
Examples are derandomized, so a failure reproduces; hypothesis prints the failing example.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis (a dev dependency: pip install -e .[dev])")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from posenc.blocks import AttentionBlock  # noqa: E402
from posenc.config import AttentionConfig  # noqa: E402
from posenc.errors import PosencError  # noqa: E402
from posenc.params import Param  # noqa: E402
from posenc.schemes import specs  # noqa: E402
from posenc.schemes.base import TableMode  # noqa: E402

SPECS = {spec.name: spec for spec in specs()}
FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

HOSTILE_FLOATS = (0.0, -1.0, 1.0, 1e-6, 1e6, 1e30, -1e30, math.inf, -math.inf, math.nan)
HOSTILE_INTS = (-5, -1, 0, 1, 2, 3, 7, 10**6, 10**12)


def value_for(param: Param) -> st.SearchStrategy[Any]:
    """Values for one parameter: its valid range and its edges, and hostile ones (wrong type, out of range)."""
    if param.kind == "bool":
        return st.sampled_from([True, False, "yes", 2])
    if param.kind == "str":
        return st.sampled_from([*(param.choices or ("x",)), "bogus", ""])
    if param.kind == "int":
        return st.one_of(st.sampled_from(HOSTILE_INTS), st.integers(-10, 600))
    if param.kind == "float":
        return st.one_of(st.sampled_from(HOSTILE_FLOATS), st.floats(-10.0, 1e5, allow_nan=False))
    return st.sampled_from([[1.0], [], [-1.0, math.nan], "x"])


@st.composite
def params_for(draw: st.DrawFn, scheme: str) -> dict[str, Any]:
    spec = SPECS[scheme]
    chosen = draw(st.lists(st.sampled_from(spec.params), unique_by=lambda p: p.name, max_size=3)) if spec.params else []
    return {p.name: draw(value_for(p)) for p in chosen}


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    heads = draw(st.sampled_from([1, 2, 4, 3]))
    kv_heads = draw(st.sampled_from([1, 2, heads, 3]))
    head_dim = draw(st.sampled_from([2, 4, 8, 16, 6, 5, 0]))
    hidden = draw(st.one_of(st.just(heads * head_dim), st.sampled_from([1, 8, 32, 0, -4])))
    return {
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": draw(st.sampled_from([1, 8, 32, 0])),
    }


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    scheme = draw(st.sampled_from(sorted(SPECS)))
    return {
        "scheme": scheme,
        "params": draw(params_for(scheme)),
        "config": draw(configs()),
        "mode": draw(st.sampled_from(["precomputed", "dynamic"])),
        "max_positions": draw(st.sampled_from([1, 4, 16, 48, 0, -1])),
        "batch": draw(st.integers(1, 2)),
        "seq": draw(st.integers(1, 5)),
        "past": draw(st.integers(0, 4)),
    }


def build(case: dict[str, Any]) -> AttentionBlock:
    config = AttentionConfig(**case["config"])
    return AttentionBlock(config, case["scheme"], case["params"], TableMode.parse(case["mode"]), case["max_positions"])


def run_eager(case: dict[str, Any]) -> None:
    """Build and call the block; any failure must be a PosencError, any output finite."""
    try:
        block = build(case).eval()
        cfg = block.config
        b, s, p = case["batch"], case["seq"], case["past"]
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(b, s, cfg.hidden_size, generator=generator)
        past = {}
        if p:
            shape = (b, cfg.num_kv_heads, p, cfg.head_dim)
            past = {
                "past_key": torch.randn(*shape, generator=generator),
                "past_value": torch.randn(*shape, generator=generator),
            }
        with torch.no_grad():
            out, key, value = block(x, **past)
    except PosencError:
        return
    for name, tensor in (("out", out), ("key", key), ("value", value)):
        assert torch.isfinite(tensor).all(), f"{name} is not finite for an accepted configuration: {case}"


def run_exported(case: dict[str, Any], folder) -> None:
    """Export the block and run it in ONNX Runtime at the case's shape; failures PosencError, outputs finite."""
    from posenc.export import export_scheme, run_onnx
    from posenc.export.feeds import make_feed
    from posenc.export.shapes import FeedShape

    try:
        config = AttentionConfig(**case["config"])
        result = export_scheme(
            case["scheme"],
            folder / "m.onnx",
            params=case["params"],
            unit="block",
            config=config,
            table_mode=case["mode"],
            max_positions=case["max_positions"],
        )
        feed = make_feed(result.manifest, FeedShape(batch=case["batch"], seq=case["seq"], past=case["past"]))
        outputs = run_onnx(result.path, feed, manifest=result.manifest)
    except PosencError:
        return
    for name, array in outputs.items():
        assert np.isfinite(array).all(), f"{name} is not finite for an accepted configuration: {case}"


@settings(FUZZ, max_examples=60)
@given(case=cases())
def test_eager_blocks_refuse_with_posenc_errors_or_give_finite_outputs(case: dict[str, Any]) -> None:
    run_eager(case)


@pytest.mark.slow
@settings(FUZZ, max_examples=400)
@given(case=cases())
def test_eager_blocks_refuse_with_posenc_errors_or_give_finite_outputs_many(case: dict[str, Any]) -> None:
    run_eager(case)


@settings(FUZZ, max_examples=4)
@given(case=cases())
def test_exported_blocks_refuse_with_posenc_errors_or_give_finite_outputs(
    case: dict[str, Any], tmp_path_factory
) -> None:
    run_exported(case, tmp_path_factory.mktemp("fuzz"))


@pytest.mark.slow
@settings(FUZZ, max_examples=80)
@given(case=cases())
def test_exported_blocks_refuse_with_posenc_errors_or_give_finite_outputs_many(
    case: dict[str, Any], tmp_path_factory
) -> None:
    run_exported(case, tmp_path_factory.mktemp("fuzz"))
