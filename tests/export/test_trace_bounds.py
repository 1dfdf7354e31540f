"""Length bounds of a traced export (posenc.export.trace_bounds), on real torch.export runs of small modules.

References: ONNX Runtime running the bounded graph against the module itself; torch.export's own refusal for a
module whose computation branches on the length.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import torch

from posenc.errors import ExportError
from posenc.export.manifest import DimRange
from posenc.export.runtime import ort_session
from posenc.export.torch_onnx import to_onnx_model
from posenc.export.trace_bounds import bounded_export, deferred_export

CONTEXT = 16


class SlicedBuffer(torch.nn.Module):
    """Reads a causal buffer of the context's size by the lengths (GPT-1's ``bias[:, :, :S, :S]``)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(CONTEXT, CONTEXT)).view(1, CONTEXT, CONTEXT))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        s = hidden.shape[1]
        return hidden @ hidden.transpose(1, 2) * self.bias[:, :s, :s]


class Branching(torch.nn.Module):
    """Pads by a length-dependent amount (VITS's relative attention): another computation past a length."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        pad = max(hidden.shape[1] - 5, 0)
        if pad > 0:
            hidden = torch.nn.functional.pad(hidden, (0, 0, pad, pad))
        return hidden * 2


BLOCK = 6


class Blocked(torch.nn.Module):
    """Local attention over blocks of the sequence padded to a multiple of ``BLOCK`` (LongT5's own
    ``_split_into_blocks`` and ``_concatenate_3_blocks``): each block attends to itself and its two neighbours."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        from transformers.models.longt5.modeling_longt5 import _concatenate_3_blocks, _split_into_blocks

        blocks = _split_into_blocks(hidden, BLOCK, dim=1)  # [B, n, BLOCK, E]
        three = _concatenate_3_blocks(blocks, block_dim=1, sequence_dim=2)  # [B, n, 3 BLOCK, E]
        weights = torch.einsum("bnqe,bnke->bnqk", blocks, three).softmax(-1)
        out = torch.einsum("bnqk,bnke->bnqe", weights, three)
        return out.reshape(hidden.shape[0], -1, hidden.shape[2])[:, : hidden.shape[1]]


def _export(module: torch.nn.Module) -> Any:
    sample = (torch.randn(2, 4, 8),)

    def export(dims: Mapping[str, Any], deferred: bool = False) -> Any:
        shapes = ({0: dims["batch"], 1: dims["seq"]},)
        return to_onnx_model(module, sample, input_names=["hidden"], output_names=["out"], dynamic_shapes=shapes,
                             dim_names=({0: "batch", 1: "seq"},), opset=23, optimize=False,
                             deferred_guards=deferred)  # fmt: skip

    return export


RANGES = {"batch": DimRange(1, None, 2), "seq": DimRange(1, CONTEXT, 4)}


def test_a_buffer_read_by_the_length_bounds_the_length_and_the_graph_serves_it() -> None:
    module = SlicedBuffer().eval()
    (model, _), ranges, notes = bounded_export(_export(module), RANGES, CONTEXT, "SlicedBuffer")
    top = ranges["seq"].max
    assert top is not None
    assert CONTEXT // 2 <= top <= CONTEXT  # torch's bound (the whole buffer may be excluded: 15)
    assert notes == [] if top == CONTEXT else notes[0].startswith(f"lengths bounded for torch.export: seq <= {top}")
    session = ort_session(model.SerializeToString())
    for seq in (1, 7, top):
        hidden = torch.randn(1, seq, 8)
        got = session.run(None, {"hidden": hidden.numpy()})[0]
        np.testing.assert_allclose(got, module(hidden).numpy(), atol=1e-5)


def test_a_module_that_branches_on_the_length_is_refused_with_the_guard() -> None:
    with pytest.raises(
        ExportError, match=r"torch\.export specialises the lengths of Branching \(seq: .*cannot be traced"
    ):
        bounded_export(_export(Branching()), RANGES, CONTEXT, "Branching")


@pytest.mark.slow
def test_padding_to_blocks_exports_with_deferred_guards_and_the_graph_serves_every_length() -> None:
    """torch.export cannot prove LongT5's padded length ``S + (-S mod 6)`` a multiple of 6 and refuses the lengths; with
    its guards deferred and unnamed dynamic dimensions the graph keeps them dynamic and matches the module at one
    block, an exact multiple of it and several blocks (the sample ran 4 tokens: one padded block)."""
    module = Blocked().eval()
    with pytest.raises(ExportError, match="specialises the lengths of Blocked"):
        bounded_export(_export(module), RANGES, None, "Blocked")
    model, _ = deferred_export(_export(module), RANGES, {"hidden": {0: "batch", 1: "seq"}})
    session = ort_session(model.SerializeToString())
    for batch, seq in ((1, 1), (2, 5), (1, BLOCK), (2, BLOCK + 1), (1, 3 * BLOCK + 2)):
        hidden = torch.randn(batch, seq, 8)
        got = session.run(None, {"hidden": hidden.numpy()})[0]
        np.testing.assert_allclose(got, module(hidden).numpy(), atol=1e-5)


def test_a_deferred_export_falls_back_to_unnamed_dimensions_and_refuses_a_fixed_length() -> None:
    """Where torch.export's solver fails on the named dimensions, the deferred export takes the graph of unnamed
    dynamic ones if it kept every dynamic axis dynamic; one that fixed a length (a graph of one length) is refused,
    naming the axis. (The slow test above runs it on real torch.export.)"""
    import onnx

    def export_with(length: int | str) -> Any:
        def export(dims: Mapping[str, Any], deferred: bool = False) -> Any:
            assert deferred
            if not isinstance(dims["seq"], type(torch.export.Dim.DYNAMIC)):
                raise ExportError("torch.export could not trace Blocked: Cannot create Dim with inconsistent min=0")
            hidden = onnx.helper.make_tensor_value_info("hidden", onnx.TensorProto.FLOAT, ["batch", length, 8])
            return onnx.helper.make_model(onnx.helper.make_graph([], "g", [hidden], [hidden])), []

        return export

    dynamic = {"hidden": {0: "batch", 1: "seq"}}
    model, _ = deferred_export(export_with("seq"), RANGES, dynamic)
    assert [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == ["batch", "seq", 8]
    with pytest.raises(ExportError, match=r"fixed the lengths of the traced module \(hidden\[1\] = 4\)"):
        deferred_export(export_with(4), RANGES, dynamic)
