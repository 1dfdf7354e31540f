"""The graph pass RotaryEmbedding -> posenc RoPE plugin node, and parity of the plugin graph with eager PyTorch.

(The pass lives in posenc.graphs.rope_plugin; its tests sit with the plugin they depend on.)
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from polygraphy.backend.base import BaseRunner
from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
from polygraphy.common import TensorMetadata
from polygraphy.comparator import Comparator, DataLoader, SimpleCompareFunc

from posenc import functional
from posenc.config import AttentionConfig
from posenc.graphs.rope_plugin import plugin_nodes, replace_rope_with_plugin
from posenc.schemes import build_scheme

B, HQ, HKV, S, D = 2, 4, 2, 6, 16
MAX_POS = 64


def _tables(rotary_dim: int, dtype: np.dtype = np.float32) -> tuple[np.ndarray, np.ndarray]:
    inv_freq, _ = functional.rope_inv_freq(rotary_dim)
    cos, sin = functional.rope_cos_sin(torch.arange(MAX_POS), inv_freq)
    return cos.numpy().astype(dtype), sin.numpy().astype(dtype)


def _info(name: str, elem: int, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def rotary_model(
    *,
    rotary_dim: int = D,
    interleaved: int = 0,
    three_d: bool = False,
    dtype: int = TensorProto.FLOAT,
    cast_to_float: bool = False,
    with_positions: bool = True,
    tables: tuple[np.ndarray, np.ndarray] | None = None,
    chain: bool = False,
) -> onnx.ModelProto:
    """q and k rotated by two RotaryEmbedding nodes (opset 23); optional fp32 up/down casts around them."""
    q_shape = [B, S, HQ * D] if three_d else [B, HQ, S, D]
    k_shape = [B, S, HKV * D] if three_d else [B, HKV, S, D]
    nodes, q_in, k_in = [], "q", "k"
    if cast_to_float:
        nodes += [helper.make_node("Cast", [n], [f"{n}32"], to=TensorProto.FLOAT) for n in ("q", "k")]
        q_in, k_in = "q32", "k32"
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": 0 if rotary_dim == D else rotary_dim}
    extra = ["cos", "sin", "pos"] if with_positions else ["cos", "sin"]
    if chain:  # k's input depends on q's rotation: the pair must not be merged
        nodes.append(helper.make_node("Add", [k_in, "q_rot_head"], ["k_dep"]))
        nodes.append(helper.make_node("Slice", ["q_rot", "zero", "hk", "one"], ["q_rot_head"]))
        k_in = "k_dep"
    nodes.append(
        helper.make_node("RotaryEmbedding", [q_in, *extra], ["q_rot"], num_heads=HQ if three_d else 0, **attrs)
    )
    nodes.append(
        helper.make_node("RotaryEmbedding", [k_in, *extra], ["k_rot"], num_heads=HKV if three_d else 0, **attrs)
    )
    outs = ["q_rot", "k_rot"]
    if cast_to_float:
        nodes += [helper.make_node("Cast", [f"{n}_rot"], [f"{n}_out"], to=dtype) for n in ("q", "k")]
        outs = ["q_out", "k_out"]
    table_dtype = np.float32 if (dtype == TensorProto.FLOAT or cast_to_float) else np.float16
    if tables is None:
        if with_positions:
            tables = _tables(rotary_dim, table_dtype)
        else:
            inv_freq, _ = functional.rope_inv_freq(rotary_dim)
            pos = torch.arange(S).expand(B, S)
            tables = tuple(t.numpy().astype(table_dtype) for t in functional.rope_cos_sin(pos, inv_freq))
    inits = [numpy_helper.from_array(tables[0], "cos"), numpy_helper.from_array(tables[1], "sin")]
    if chain:
        inits += [
            numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("zero", [0]), ("hk", [HKV]), ("one", [1]))
        ]
    inputs = [_info("q", dtype, q_shape), _info("k", dtype, k_shape)]
    if with_positions:
        inputs.append(_info("pos", TensorProto.INT64, [B, S]))
    outputs = [_info(outs[0], dtype, q_shape), _info(outs[1], dtype, k_shape)]
    graph = helper.make_graph(nodes, "rope", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if value.type.tensor_type.elem_type == TensorProto.INT64:
            feeds[value.name] = rng.integers(0, MAX_POS, shape).astype(np.int64)
        else:
            np_dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
            feeds[value.name] = rng.standard_normal(shape).astype(np_dtype)
    return feeds


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _assert_same_outputs(before: onnx.ModelProto, after: onnx.ModelProto, atol: float = 1e-6) -> None:
    feeds = _feeds(before)
    for x, y in zip(_run(before, feeds), _run(after, feeds), strict=True):
        assert x.shape == y.shape
        assert x.dtype == y.dtype
        np.testing.assert_allclose(x.astype(np.float64), y.astype(np.float64), atol=atol, rtol=0)


# ------------------------------------------------------------------------------------------------------
# rewrites
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("rotary_dim", "interleaved"), [(D, 0), (8, 1)])
def test_pair_becomes_one_plugin_node(rotary_dim: int, interleaved: int) -> None:
    model = rotary_model(rotary_dim=rotary_dim, interleaved=interleaved)
    rewritten, count = replace_rope_with_plugin(model)
    assert count == 1
    (node,) = plugin_nodes(rewritten)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert (node.op_type, node.domain) == ("PosencRope", "posenc")
    assert attrs["rotary_dim"] == rotary_dim
    assert attrs["interleaved"] == interleaved
    assert attrs["qk_format"] == 0
    assert attrs["plugin_namespace"] == b"posenc"
    assert attrs["aot"] == 1
    assert list(node.input) == ["q", "k", "cos", "sin", "pos"]
    assert not [n for n in rewritten.graph.node if n.op_type == "RotaryEmbedding"]
    assert [o.name for o in rewritten.graph.output] == ["q_rot", "k_rot"]
    assert {f.name for f in rewritten.functions} == {"PosencRope"}
    onnx.checker.check_model(rewritten, full_check=True)
    _assert_same_outputs(model, rewritten)


def test_three_d_inputs_are_viewed_as_bshd() -> None:
    model = rotary_model(three_d=True, interleaved=1)
    rewritten, count = replace_rope_with_plugin(model)
    assert count == 1
    (node,) = plugin_nodes(rewritten)
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute}["qk_format"] == 1
    assert [n.op_type for n in rewritten.graph.node].count("Reshape") == 4
    _assert_same_outputs(model, rewritten)


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT16, TensorProto.BFLOAT16])
def test_float32_rotation_between_casts_runs_in_low_precision(dtype: int) -> None:
    model = rotary_model(cast_to_float=True, dtype=dtype)
    rewritten, count = replace_rope_with_plugin(model)
    assert count == 1
    (node,) = plugin_nodes(rewritten)
    assert list(node.input[:2]) == ["q", "k"]  # the casts are gone
    assert not [n for n in rewritten.graph.node if n.op_type == "Cast"]
    if dtype == TensorProto.FLOAT16:  # ORT has no bfloat16 Mul on CPU to run the original
        _assert_same_outputs(model, rewritten, atol=1e-3)


def test_caches_without_position_ids() -> None:
    model = rotary_model(with_positions=False)
    rewritten, count = replace_rope_with_plugin(model)
    assert count == 1
    assert plugin_nodes(rewritten)[0].op_type == "PosencRopeCache"
    _assert_same_outputs(model, rewritten)


def test_dependent_rotations_are_not_merged() -> None:
    """Merging would create a cycle: k's input depends on q's rotation."""
    model = rotary_model(chain=True)
    rewritten, count = replace_rope_with_plugin(model)
    assert count == 0
    assert not plugin_nodes(rewritten)
    assert [n.op_type for n in rewritten.graph.node].count("RotaryEmbedding") == 2


def test_odd_rotation_stays_native_and_functions_are_optional() -> None:
    model = rotary_model()
    node = helper.make_node("RotaryEmbedding", ["q_rot", "cos", "sin", "pos"], ["q_again"])
    model.graph.node.append(node)
    model.graph.output.append(_info("q_again", TensorProto.FLOAT, [B, HQ, S, D]))
    rewritten, count = replace_rope_with_plugin(model, with_functions=False)
    assert count == 1
    assert [n.op_type for n in rewritten.graph.node].count("RotaryEmbedding") == 1
    assert not rewritten.functions  # plain plugin nodes (TensorRT < 10.7 would inline a function)
    assert any(o.domain == "posenc" for o in rewritten.opset_import)


def test_decomposed_rotation_is_fused_first() -> None:
    """posenc's exported half rotation (Slice/Mul/Sub/Add/Concat on gathered cos/sin) -> one plugin node."""
    pytest.importorskip("posenc.graphs.rope", reason="the RoPE fusion passes are not available")
    cos, sin = _tables(D)
    nodes, inits = [], [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")]
    consts = {"zero": [0], "half": [D // 2], "end": [D], "axis": [-1], "step": [1], "one": [1]}
    inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in consts.items()]
    nodes += [
        helper.make_node("Gather", ["cos", "pos"], ["c3"]),
        helper.make_node("Gather", ["sin", "pos"], ["s3"]),
        helper.make_node("Unsqueeze", ["c3", "one"], ["c"]),
        helper.make_node("Unsqueeze", ["s3", "one"], ["s"]),
    ]
    for x in ("q", "k"):
        nodes += [
            helper.make_node("Slice", [x, "zero", "half", "axis", "step"], [f"{x}1"]),
            helper.make_node("Slice", [x, "half", "end", "axis", "step"], [f"{x}2"]),
            helper.make_node("Mul", [f"{x}1", "c"], [f"{x}1c"]),
            helper.make_node("Mul", [f"{x}2", "s"], [f"{x}2s"]),
            helper.make_node("Mul", [f"{x}2", "c"], [f"{x}2c"]),
            helper.make_node("Mul", [f"{x}1", "s"], [f"{x}1s"]),
            helper.make_node("Sub", [f"{x}1c", f"{x}2s"], [f"{x}a"]),
            helper.make_node("Add", [f"{x}2c", f"{x}1s"], [f"{x}b"]),
            helper.make_node("Concat", [f"{x}a", f"{x}b"], [f"{x}_rot"], axis=-1),
        ]
    inputs = [
        _info("q", TensorProto.FLOAT, [B, HQ, S, D]),
        _info("k", TensorProto.FLOAT, [B, HKV, S, D]),
        _info("pos", TensorProto.INT64, [B, S]),
    ]
    outputs = [_info("q_rot", TensorProto.FLOAT, [B, HQ, S, D]), _info("k_rot", TensorProto.FLOAT, [B, HKV, S, D])]
    graph = helper.make_graph(nodes, "decomposed", inputs, outputs, initializer=inits)
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]))
    model.ir_version = 10
    rewritten, count = replace_rope_with_plugin(model)
    assert count == 1
    assert plugin_nodes(rewritten)[0].op_type == "PosencRope"
    _assert_same_outputs(model, rewritten, atol=2e-6)


# ------------------------------------------------------------------------------------------------------
# polygraphy parity: plugin graph (through the ONNX Runtime twin) vs eager PyTorch
# ------------------------------------------------------------------------------------------------------


class EagerRotaryRunner(BaseRunner):
    """Eager PyTorch reference: the scheme module's rotate(q, k, position_ids)."""

    def __init__(self, scheme: torch.nn.Module, shapes: dict[str, tuple[int, ...]]) -> None:
        super().__init__(name="eager-torch")
        self.scheme = scheme
        self.shapes = shapes

    def get_input_metadata_impl(self) -> TensorMetadata:
        meta = TensorMetadata()
        for name, shape in self.shapes.items():
            meta.add(name, np.int64 if name == "pos" else np.float32, shape)
        return meta

    def infer_impl(self, feed_dict: dict[str, np.ndarray]) -> OrderedDict:
        q, k = torch.from_numpy(feed_dict["q"]), torch.from_numpy(feed_dict["k"])
        pos = torch.from_numpy(feed_dict["pos"]).clamp(0, MAX_POS - 1)
        with torch.no_grad():
            q_rot, k_rot = self.scheme.rotate(q.double(), k.double(), pos)
        self.inference_time = 0.0
        return OrderedDict(q_rot=q_rot.float().numpy(), k_rot=k_rot.float().numpy())


class _ClampedPositions(DataLoader):
    """Polygraphy's loader with position ids inside the table."""

    def __getitem__(self, index: int) -> OrderedDict:
        feeds = super().__getitem__(index)
        feeds["pos"] = np.abs(feeds["pos"]) % MAX_POS
        return feeds


@pytest.mark.parametrize(
    ("scheme_name", "params"),
    [
        ("rope", {}),
        ("rope", {"layout": "interleaved", "partial_rotary_factor": 0.5}),
        ("rope_yarn", {"factor": 4.0}),
        ("rope_llama3", {}),
        ("rope_proportional", {"partial_rotary_factor": 0.25}),  # frequency-0 pairs: identity in the kernel
        ("rope_ntk_alpha", {}),
    ],
)
def test_plugin_graph_parity_with_eager_pytorch(scheme_name: str, params: dict) -> None:
    config = AttentionConfig(hidden_size=HQ * D, num_heads=HQ, num_kv_heads=HKV, max_position_embeddings=MAX_POS)
    scheme = build_scheme(scheme_name, config, params, "precomputed", MAX_POS).eval()
    tables = (scheme.angles.cos_table.numpy(), scheme.angles.sin_table.numpy())
    interleaved = int(scheme.layout == "interleaved")
    model = rotary_model(rotary_dim=scheme.rotary_dim, interleaved=interleaved, tables=tables)
    rewritten, count = replace_rope_with_plugin(model)
    assert count == 1
    shapes = {"q": (B, HQ, S, D), "k": (B, HKV, S, D), "pos": (B, S)}
    runners = [OnnxrtRunner(SessionFromOnnx(rewritten.SerializeToString())), EagerRotaryRunner(scheme, shapes)]
    loader = _ClampedPositions(iterations=2, seed=1, val_range={"pos": (0, MAX_POS - 1)})
    results = Comparator.run(runners, data_loader=loader)
    compare = SimpleCompareFunc(atol=2e-5, rtol=1e-4, check_error_stat="max")
    assert bool(Comparator.compare_accuracy(results, compare_func=compare))
