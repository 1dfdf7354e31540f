"""The torchlib registry reused across exports (posenc.export.onnx_registry) changes no graph and keeps no export's
own translations."""

from __future__ import annotations

import torch
from torch import nn

from posenc.export import onnx_registry
from posenc.export.onnx_registry import reused_translation_registry


class _Scaled(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cos(x) * 2.0 + 1.0


def _cos_as_sin(x):  # a custom translation the export registers into its registry
    from onnxscript import opset18 as op

    return op.Sin(x)


def _export(custom: bool) -> bytes:
    table = {torch.ops.aten.cos.default: _cos_as_sin} if custom else None
    batch = torch.export.Dim("batch")
    program = torch.onnx.export(
        _Scaled(),
        (torch.randn(2, 3),),
        dynamo=True,
        dynamic_shapes=({0: batch},),
        custom_translation_table=table,
        verbose=False,
    )
    return program.model_proto.SerializeToString()


def _registry_class():
    from torch.onnx._internal.exporter import _registration

    return _registration.ONNXRegistry


def test_graphs_are_the_same_with_the_reused_registry_and_torch_is_restored() -> None:
    original = _registry_class().__dict__["from_torchlib"]
    plain, plain_custom = _export(False), _export(True)
    with reused_translation_registry():
        assert _registry_class().__dict__["from_torchlib"] is not original  # the context is active here
        reused_custom, reused = _export(True), _export(False)
        kept = dict(onnx_registry._KEPT)
        reused_again = _export(False)
        assert {opset: id(registry) for opset, registry in onnx_registry._KEPT.items()} == {
            opset: id(registry) for opset, registry in kept.items()
        }  # built once: the second export copied the kept registry
    assert _registry_class().__dict__["from_torchlib"] is original
    assert plain_custom != plain  # the custom translation shows in the graph (Sin for Cos)
    assert reused_custom == plain_custom
    assert reused == plain == reused_again  # the earlier export's custom translation did not stay in the registry
    for registry in onnx_registry._KEPT.values():
        assert not any(meta.is_custom for metas in registry.functions.values() for meta in metas)
