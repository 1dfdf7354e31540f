"""Longformer's sliding chunks on the traced path (``posenc.trace.windows``): the unit pads the attention's input to
a multiple of the window as its model does, marks the padding in the call's masks, and returns the real rows.

References: transformers' ``LongformerSelfAttention`` called as ``LongformerModel`` calls it on a length it padded
to the window (the model's own ``_pad_to_window_size``); in the slow test the tiny census checkpoint's
``LongformerAttention`` and LED's ``LEDEncoderAttention`` (``hf-fp32`` / ``hf-fp64``) and posenc's float64 rebuild
(``eager-fp64``) against the exported graph on ONNX Runtime, across window edges. Longformer: "Longformer: The
Long-Document Transformer" (Beltagy, Peters and Cohan, 2020, https://arxiv.org/abs/2004.05150).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posenc.trace.windows import chunk_window, mark_padding, onnx_mode, pad_rows, padded_length

transformers = pytest.importorskip("transformers")


def _attention() -> torch.nn.Module:
    from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

    config = transformers.LongformerConfig(hidden_size=16, num_attention_heads=2, attention_window=[8])
    torch.manual_seed(0)
    return LongformerSelfAttention(config, 0).eval()


def _call(attention: torch.nn.Module, hidden: torch.Tensor, real: int) -> torch.Tensor:
    """The attention as the model calls it on ``hidden`` whose rows from ``real`` on are padding."""
    b, s = hidden.shape[:2]
    kwargs = {"attention_mask": torch.zeros(b, s), "is_index_masked": torch.zeros(b, s, dtype=torch.bool),
              "is_index_global_attn": torch.zeros(b, s, dtype=torch.bool)}  # fmt: skip
    mark_padding(kwargs, dict.fromkeys(kwargs, "zeros"), real)
    return attention(hidden, **kwargs, is_global_attn=False)[0][:, :real]


def test_the_unit_pads_to_the_window_and_keeps_the_real_rows() -> None:
    attention = _attention()
    assert chunk_window(attention) == 8
    assert [padded_length(n, 8) for n in (1, 7, 8, 9, 16)] == [16, 16, 24, 24, 32]
    torch.manual_seed(1)
    for length in (8, 13):
        hidden = torch.randn(1, length, 16)
        model_pads = padded_length(length, 8) - 8 if length % 8 else length  # _pad_to_window_size: next multiple
        with torch.no_grad():
            expected = _call(attention, pad_rows(hidden, model_pads), length)
            got = _call(attention, pad_rows(hidden, padded_length(length, 8)), length)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    flags = {"is_index_masked": torch.zeros(1, 4, dtype=torch.bool), "attention_mask": torch.zeros(1, 4),
             "is_index_global_attn": torch.zeros(1, 4, dtype=torch.bool)}  # fmt: skip
    mark_padding(flags, dict.fromkeys(flags, "zeros"), 3)
    assert flags["is_index_masked"].tolist() == [[False, False, False, True]]
    assert flags["attention_mask"][0, 3] == torch.finfo(torch.float32).min
    assert not flags["is_index_global_attn"].any()  # not a mask: no global tokens


def test_the_onnx_mode_is_set_only_while_tracing() -> None:
    attention = _attention()
    with onnx_mode(attention):
        assert not getattr(attention.config, "onnx_export", False)  # eager: the model's own mode


@pytest.mark.slow
@pytest.mark.parametrize(("name", "stack"), [("longformer", None), ("led", "encoder")])
def test_longformer_attention_exports_and_matches_its_module_across_windows(
    name: str, stack: str | None, tmp_path: Path
) -> None:
    """Longformer's attention, and LED's encoder's (the same code, ``LEDEncoderAttention``), exported with their
    length guards deferred, against their own module at lengths below, on and across the window."""
    from posenc.census.tiny import save_tiny_model, tiny_config
    from posenc.census.types import model_type_info
    from posenc.export.shapes import Shape
    from posenc.export.trace import export_traced
    from posenc.graphs.trace_rewrite import replace_positions
    from posenc.validate.checkpoint import validate_against_checkpoint

    folder = tmp_path / name
    info = model_type_info(name)
    save_tiny_model(tiny_config(name).config, info.model_class, folder)  # type: ignore[union-attr]
    result = export_traced(tmp_path / "unit.onnx", folder, layer=0, layer_type=stack, rewrite=replace_positions)
    assert result.manifest.trace is not None
    assert result.manifest.trace.cacheless
    expected = ("encoder.layer.0.attention", "LongformerAttention") if stack is None else (
        "encoder.layers.0.self_attn", "LEDEncoderAttention")  # fmt: skip
    assert (result.manifest.trace.attention.path, result.manifest.trace.attention.cls.rsplit(".", 1)[1]) == expected
    shapes = [Shape(1, 8, 0), Shape(2, 16, 0), Shape(1, 9, 0), Shape(2, 24, 0), Shape(1, 33, 0), Shape(1, 1, 0)]
    report = validate_against_checkpoint(result.path, folder, layer_type=stack, shapes=shapes, long_positions=False)
    assert report.passed, report.to_markdown()
