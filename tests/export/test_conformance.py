"""The ONNX RotaryEmbedding conformance data (onnx/onnx backend node tests) through an exported RoPE op.

For each case a small "RoPE given cos/sin caches (+ position ids)" module built on
``posenc.functional.apply_rope`` is exported with ``posenc.export.export_module`` (dynamic sizes, a
sample shape other than the case's), run by ONNX Runtime on the case's inputs and compared with the
case's ``output_0``.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from torch import nn

from posenc import functional
from posenc.export import export_module, ort_session
from tests.conftest import CONFORMANCE

CASES = sorted(p.name for p in CONFORMANCE.glob("test_rotary_embedding*") if not p.name.endswith("_expanded"))


class CachedRope(nn.Module):
    """ONNX RotaryEmbedding semantics on top of apply_rope: x [B, H, S, D] or [B, S, H*D]."""

    def __init__(self, layout: str, rotary_dim: int | None, num_heads: int) -> None:
        super().__init__()
        self.layout, self.rotary_dim, self.num_heads = layout, rotary_dim, num_heads

    def forward(self, x, cos_cache, sin_cache, position_ids=None):
        if position_ids is not None:  # caches [max_position, r/2] gathered by position ids
            cos, sin = F.embedding(position_ids, cos_cache), F.embedding(position_ids, sin_cache)
        else:  # caches already [B, S, r/2]
            cos, sin = cos_cache, sin_cache
        three_d = x.dim() == 3
        if three_d:
            batch, seq, _ = x.shape
            x = x.reshape(batch, seq, self.num_heads, -1).transpose(1, 2)
        out = functional.apply_rope(x, cos.unsqueeze(1), sin.unsqueeze(1), self.layout, self.rotary_dim)
        return out.transpose(1, 2).reshape(batch, seq, -1) if three_d else out


def _load_case(name: str) -> tuple[dict, dict[str, np.ndarray], np.ndarray]:
    folder = CONFORMANCE / name
    node = onnx.load(str(folder / "model.onnx")).graph.node[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    tensors = {}
    for file in sorted((folder / "test_data_set_0").glob("*.pb")):
        proto = onnx.TensorProto()
        proto.ParseFromString(file.read_bytes())
        tensors[file.stem] = (proto.name, numpy_helper.to_array(proto))
    inputs = {tensors[k][0]: tensors[k][1] for k in sorted(tensors) if k.startswith("input_")}
    return attrs, inputs, tensors["output_0"][1]


@pytest.mark.skipif(not CASES, reason=f"conformance data not found at {CONFORMANCE}")
@pytest.mark.parametrize("case", CASES)
def test_rotary_embedding_conformance(case: str, tmp_path) -> None:
    attrs, inputs, expected = _load_case(case)
    x = inputs["input"]
    num_heads = int(attrs.get("num_heads", 0)) or x.shape[1]
    rotary_dim = int(attrs.get("rotary_embedding_dim", 0)) or None
    layout = "interleaved" if attrs.get("interleaved", 0) else "half"
    module = CachedRope(layout, rotary_dim, num_heads).eval()
    with_positions = "position_ids" in inputs
    half = inputs["cos_cache"].shape[-1]
    head_dim = x.shape[-1] // num_heads if x.ndim == 3 else x.shape[-1]

    # sample sizes differ from the case's (batch 3, seq 5, 20 cache rows) to prove the dims are dynamic
    if x.ndim == 3:
        sample_x, x_dims = torch.randn(3, 5, num_heads * head_dim), {0: "batch", 1: "seq"}
    else:
        sample_x, x_dims = torch.randn(3, num_heads, 5, head_dim), {0: "batch", 2: "seq"}
    if with_positions:
        caches = (torch.randn(20, half), torch.randn(20, half))
        args = (sample_x, *caches, torch.randint(0, 20, (3, 5)))
        dims = [x_dims, {0: "rows"}, {0: "rows"}, {0: "batch", 1: "seq"}]
    else:
        args = (sample_x, torch.randn(3, 5, half), torch.randn(3, 5, half))
        dims = [x_dims, {0: "batch", 1: "seq"}, {0: "batch", 1: "seq"}]
    names = list(inputs)
    path = export_module(
        module, args, tmp_path / "rope.onnx", input_names=names, output_names=["output"], dynamic_dims=dims
    )
    (got,) = ort_session(path).run(None, inputs)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
