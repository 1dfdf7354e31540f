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
from posenc.export.trace_bounds import bounded_export

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


def _export(module: torch.nn.Module) -> Any:
    sample = (torch.randn(2, 4, 8),)

    def export(dims: Mapping[str, Any]) -> Any:
        shapes = ({0: dims["batch"], 1: dims["seq"]},)
        return to_onnx_model(module, sample, input_names=["hidden"], output_names=["out"], dynamic_shapes=shapes,
                             dim_names=({0: "batch", 1: "seq"},), opset=23, optimize=False)  # fmt: skip

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
