"""The official ONNX RotaryEmbedding node tests, computed by posenc.functional.apply_rope.

The 16 cases (and their ``_expanded`` twins, which inline the op as primitive nodes) come from the onnx
repository's backend test data; see ``tests/data/onnx_rotary_embedding/PROVENANCE.txt``. Each case
has ``model.onnx`` and ``test_data_set_0/input_*.pb`` / ``output_0.pb``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc import functional
from tests.conftest import CONFORMANCE

onnx = pytest.importorskip("onnx", reason="onnx reads the conformance protobufs (pip install onnx)")
from onnx import numpy_helper  # noqa: E402

CASES = sorted(p.name for p in CONFORMANCE.glob("test_rotary_embedding*") if p.is_dir())


def test_the_conformance_data_is_in_the_repository() -> None:
    assert len(CASES) == 16, f"expected the 16 ONNX RotaryEmbedding node tests in {CONFORMANCE}"


def _attributes(case: str) -> dict[str, int]:
    """RotaryEmbedding attributes; ``_expanded`` models have no such node, so read the non-expanded twin."""
    model = onnx.load(str(CONFORMANCE / case.removesuffix("_expanded") / "model.onnx"))
    nodes = [n for n in model.graph.node if n.op_type == "RotaryEmbedding"]
    assert len(nodes) == 1, f"{case}: expected one RotaryEmbedding node"
    return {a.name: onnx.helper.get_attribute_value(a) for a in nodes[0].attribute}


def _load_case(case: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    folder = CONFORMANCE / case
    model = onnx.load(str(folder / "model.onnx"))
    names = [i.name for i in model.graph.input]
    data = folder / "test_data_set_0"
    inputs = {
        name: numpy_helper.to_array(onnx.load_tensor(str(data / f"input_{i}.pb"))) for i, name in enumerate(names)
    }
    return inputs, numpy_helper.to_array(onnx.load_tensor(str(data / "output_0.pb")))


def rotary_embedding(inputs: dict[str, np.ndarray], attributes: dict[str, int]) -> torch.Tensor:
    """ONNX RotaryEmbedding-23 semantics on top of apply_rope.

    input ``[B, N, S, H]`` or ``[B, S, N*H]`` (needs ``num_heads``); cos/sin caches ``[max_pos, r/2]`` gathered
    by ``position_ids [B, S]``, or ``[B, S, r/2]`` when there are no position ids.
    """
    x = torch.tensor(inputs["input"])
    cos, sin = torch.tensor(inputs["cos_cache"]), torch.tensor(inputs["sin_cache"])
    if "position_ids" in inputs:
        positions = torch.tensor(inputs["position_ids"], dtype=torch.int64)
        cos, sin = cos[positions], sin[positions]  # [B, S, r/2]
    three_d = x.dim() == 3
    if three_d:
        b, s, hidden = x.shape
        heads = attributes["num_heads"]
        x = x.reshape(b, s, heads, hidden // heads).transpose(1, 2)  # [B, N, S, H]
    layout = "interleaved" if attributes.get("interleaved", 0) else "half"
    rotary_dim = attributes.get("rotary_embedding_dim", 0) or x.shape[-1]
    out = functional.apply_rope(x, cos.unsqueeze(1), sin.unsqueeze(1), layout, rotary_dim)
    if three_d:
        out = out.transpose(1, 2).reshape(b, s, hidden)
    return out


def test_all_sixteen_cases_are_present() -> None:
    assert len(CASES) == 16, CASES
    assert sum(c.endswith("_expanded") for c in CASES) == 8


@pytest.mark.parametrize("case", CASES)
def test_onnx_rotary_embedding_conformance(case: str) -> None:
    inputs, expected = _load_case(case)
    got = rotary_embedding(inputs, _attributes(case))
    assert got.dtype == torch.float32
    assert tuple(got.shape) == expected.shape
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-5, rtol=0)
    # The comparison can tell: the other pairing layout gives a different answer on every case.
    attributes = _attributes(case)
    swapped = {**attributes, "interleaved": 0 if attributes.get("interleaved", 0) else 1}
    assert not np.allclose(rotary_embedding(inputs, swapped).numpy(), expected, atol=1e-3)
