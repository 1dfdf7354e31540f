"""The ONNX Runtime twin of the plugin nodes: float64 references and the kernel agree with it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from posenc import functional
from posenc.errors import ExportError
from posenc.plugins.rope import RopeKernelSpec, freq_inputs, rope_qk
from posenc.plugins.rope.ort_twin import make_plugin_node, rope_function, rope_functions_for
from tests.plugins.rope.reference import positions_of, rotate_reference, row_inv_freq

B, HQ, HKV, S, D = 2, 4, 2, 5, 16
_ONNX_TYPES = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.int64: TensorProto.INT64}


def plugin_model(spec: RopeKernelSpec, feeds: dict[str, np.ndarray], fmt: str = "bhsd", opset: int = 18):
    """A one-node model: the plugin node plus its twin function."""
    names = list(spec.angles.inputs)
    node = make_plugin_node(spec, names, ["q_out", "k_out"], qk_format=fmt)
    inputs = [helper.make_tensor_value_info(n, _ONNX_TYPES[feeds[n].dtype.type], feeds[n].shape) for n in names]
    out_type = _ONNX_TYPES[feeds["q"].dtype.type]
    outputs = [helper.make_tensor_value_info(n, out_type, ["b", "x", "y", "d"]) for n in ("q_out", "k_out")]
    graph = helper.make_graph([node], "plugin", inputs, outputs)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid("posenc", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    model.functions.extend(rope_functions_for(model))
    onnx.checker.check_model(model, full_check=True)
    return model


def run_twin(spec: RopeKernelSpec, feeds: dict[str, np.ndarray], fmt: str = "bhsd", opset: int = 18) -> list:
    model = plugin_model(spec, feeds, fmt, opset)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _qk() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(B, HQ, S, D), torch.randn(B, HKV, S, D)


def _close(out: np.ndarray, ref: torch.Tensor, atol: float = 2e-6) -> None:
    np.testing.assert_allclose(out.astype(np.float64), ref.numpy(), atol=atol, rtol=0)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [16, 6])
def test_table_twin(layout: str, rotary_dim: int) -> None:
    q, k = _qk()
    inv_freq, _ = functional.rope_inv_freq(rotary_dim)
    cos, sin = functional.rope_cos_sin(torch.arange(64), inv_freq)
    pos = torch.randint(0, 64, (B, S))
    spec = RopeKernelSpec("table", rotary_dim, D, layout)
    feeds = {
        "q": q.numpy(),
        "k": k.numpy(),
        "cos_table": cos.numpy(),
        "sin_table": sin.numpy(),
        "positions": pos.numpy(),
    }
    q_out, k_out = run_twin(spec, feeds)
    _close(q_out, rotate_reference(q, pos, inv_freq, 1.0, layout, rotary_dim))
    _close(k_out, rotate_reference(k, pos, inv_freq, 1.0, layout, rotary_dim))


def test_cache_twin_bshd_fp16() -> None:
    q, k = _qk()
    q_s, k_s = q.transpose(1, 2).contiguous().half(), k.transpose(1, 2).contiguous().half()
    inv_freq, _ = functional.rope_inv_freq(8)
    pos = torch.randint(0, 100, (B, S))
    cos, sin = functional.rope_cos_sin(pos, inv_freq)
    spec = RopeKernelSpec("cache", 8, D, "interleaved")
    feeds = {"q": q_s.numpy(), "k": k_s.numpy(), "cos": cos.numpy(), "sin": sin.numpy()}
    q_out, _ = run_twin(spec, feeds, fmt="bshd")
    assert q_out.dtype == np.float16
    ref = rotate_reference(q_s.transpose(1, 2), pos, inv_freq, 1.0, "interleaved", 8).transpose(1, 2)
    _close(q_out, ref, atol=4e-3)


@pytest.mark.parametrize("opset", [17, 18])
def test_freq_twin_with_longrope_switch(opset: int) -> None:
    params = {
        "rope_type": "longrope",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "short_factor": [1.0 + 0.1 * i for i in range(8)],
        "long_factor": [2.0 + 0.5 * i for i in range(8)],
    }
    q, k = _qk()
    pos = torch.stack((torch.arange(S), torch.arange(S) + 40))  # row 0 short, row 1 long
    turns, kwargs = freq_inputs(D, params)
    spec = RopeKernelSpec("freq", D, D, **kwargs)
    feeds = {"q": q.numpy(), "k": k.numpy(), "turns": turns.numpy(), "positions": pos.numpy()}
    q_out, _ = run_twin(spec, feeds, opset=opset)
    inv_rows, factor = row_inv_freq(D, params, pos)
    _close(q_out, rotate_reference(q, pos, inv_rows, factor, "half", D), atol=1e-5)


def test_freq_twin_with_zero_frequencies() -> None:
    """Proportional RoPE (Gemma 4): frequencies over the head dim, the last pairs 0 (identity), in the twin."""
    params = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6, "factor": 2.0}
    q, k = _qk()
    pos = torch.stack((torch.arange(S), torch.arange(S) + 131000))
    turns, kwargs = freq_inputs(D, params)
    assert int((turns.abs().sum(0) == 0).sum()) == 6  # 2 of 8 pairs rotate
    feeds = {"q": q.numpy(), "k": k.numpy(), "turns": turns.numpy(), "positions": pos.numpy()}
    q_out, k_out = run_twin(RopeKernelSpec("freq", D, D, **kwargs), feeds)
    inv_freq, _ = functional.rope_inv_freq(D, params)
    _close(q_out, rotate_reference(q, pos, inv_freq, 1.0, "half", D), atol=5e-6)
    _close(k_out, rotate_reference(k, pos, inv_freq, 1.0, "half", D), atol=5e-6)
    np.testing.assert_array_equal(q_out[..., 2:8], q.numpy()[..., 2:8])  # unrotated pairs pass exactly


@pytest.mark.parametrize("mode", ["ids", "offset"])
def test_ntk_twin(mode: str) -> None:
    params = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 16}
    q, k = _qk()
    given = torch.tensor([[0, 3, 1, 2, 4], [30, 31, 32, 33, 34]]) if mode == "ids" else torch.tensor([2, 131067])
    pos = positions_of(given, mode, B, S)
    spec = RopeKernelSpec("ntk", D, D, "interleaved", positions=mode, factor=2.0, max_position_embeddings=16)
    feeds = {"q": q.numpy(), "k": k.numpy(), "positions": given.numpy()}
    _, k_out = run_twin(spec, feeds)
    inv_rows, _ = row_inv_freq(D, params, pos)
    _close(k_out, rotate_reference(k, pos, inv_rows, 1.0, "interleaved", D), atol=5e-6)


@pytest.mark.parametrize("source", ["table", "freq", "ntk"])
def test_kernel_matches_twin(source: str) -> None:
    """Two independent implementations of the plugin contract on the same node and inputs."""
    q, k = _qk()
    offsets = torch.tensor([7, 50])
    inv_freq, _ = functional.rope_inv_freq(D)
    cos, sin = functional.rope_cos_sin(torch.arange(64), inv_freq)
    turns, kwargs = freq_inputs(D, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16})
    spec = {
        "table": RopeKernelSpec("table", D, D, "interleaved", positions="offset"),
        "freq": RopeKernelSpec("freq", D, D, positions="offset", **kwargs),
        "ntk": RopeKernelSpec("ntk", D, D, positions="offset", factor=3.0, max_position_embeddings=8),
    }[source]
    tensors = {"cos_table": cos, "sin_table": sin, "turns": turns}
    feeds = {"q": q.numpy(), "k": k.numpy(), "positions": offsets.numpy()}
    feeds.update({n: tensors[n].numpy() for n in spec.angles.inputs if n in tensors})
    twin_q, twin_k = run_twin(spec, feeds)
    kernel_q, kernel_k = rope_qk(
        q, k, spec, cos=cos if source == "table" else None, sin=sin, turns=turns, positions=offsets
    )
    np.testing.assert_allclose(kernel_q.numpy(), twin_q, atol=3e-6, rtol=0)
    np.testing.assert_allclose(kernel_k.numpy(), twin_k, atol=3e-6, rtol=0)


def test_plugin_node_form() -> None:
    spec = RopeKernelSpec("freq", 64, 128, "interleaved", attention_factor=1.25)
    node = make_plugin_node(spec, ["q", "k", "turns", "positions"], ["qo", "ko"], qk_format="bshd")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert (node.op_type, node.domain) == ("PosencRopeFreq", "posenc")
    assert attrs["plugin_namespace"] == b"posenc"
    assert attrs["aot"] == 1
    assert attrs["interleaved"] == 1
    assert attrs["rotary_dim"] == 64
    assert attrs["qk_format"] == 1
    assert attrs["attention_factor"] == pytest.approx(1.25)
    assert node.op_type not in ("RotaryEmbedding", "Attention")  # builtin names are imported natively by TensorRT
    with pytest.raises(ExportError, match="takes inputs"):
        make_plugin_node(spec, ["q", "k"], ["qo", "ko"])


def test_old_opsets_are_refused() -> None:
    with pytest.raises(ExportError, match="opset >= 15"):
        rope_function("table", 14)
