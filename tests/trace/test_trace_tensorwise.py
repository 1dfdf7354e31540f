"""Tensor-wise rewrites of model code that reads the length as a Python number (``posenc.trace.tensorwise``).

Funnel's ``get_position_embeds`` builds its relative-shift encodings from ``list(range(seq_len))``, which torch.export
specialises to one length. posenc's rewrite computes the same values from tensors and is bound only while exporting.
References: Funnel's own ``FunnelAttentionStructure.get_position_embeds`` (bitwise, at every length tried), and for the
exported layer the checkpoint's own attention module called as its model calls it, whose encodings the model's code
computes (``hf-fp32``, ``hf-fp64``), and posenc's float64 rebuild of the graph (``eager-fp64``). Funnel-Transformer:
Dai et al., 2020, https://arxiv.org/abs/2006.03236.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from posenc.errors import ExportError
from posenc.trace import tensorwise

_FUNNEL = {"d_model": 32, "n_head": 2, "d_head": 16, "d_inner": 32, "vocab_size": 64, "num_decoder_layers": 1}


def _structure(**settings: object):  # type: ignore[no-untyped-def]
    import transformers
    from transformers.models.funnel.modeling_funnel import FunnelAttentionStructure

    return FunnelAttentionStructure(transformers.FunnelConfig(**{**_FUNNEL, **settings})).eval()


def test_funnel_position_rewrite_equals_the_models_code_at_every_length() -> None:
    """The rewrite gives Funnel's own encodings bit for bit (lengths 1 .. 40, float32 and float64); it is bound to
    the module only under torch.export (eager calls run the model's code); a config of two blocks is refused."""
    import torch

    structure = _structure(block_sizes=[2])
    for dtype in (torch.float32, torch.float64):
        for length in range(1, 41):
            ours = tensorwise.funnel_position_embeds(structure, length, dtype, torch.device("cpu"))
            theirs = structure.get_position_embeds(length, dtype, torch.device("cpu"))
            assert ours[0][1] is None
            assert theirs[0][1] is None
            assert torch.equal(ours[0][0], theirs[0][0]), (dtype, length)
    assert list(tensorwise.rewrites_of(structure)) == ["get_position_embeds"]
    with tensorwise.rewritten(structure):  # not exporting: nothing bound
        assert "get_position_embeds" not in vars(structure)
    with pytest.raises(ExportError, match="first block only; this model has 2 blocks"):
        tensorwise.funnel_position_embeds(_structure(block_sizes=[1, 1]), 4, torch.float32, torch.device("cpu"))


@pytest.mark.slow
def test_funnel_exports_for_every_length_and_matches_its_own_module(tmp_path: Path) -> None:
    """Funnel's first-block layer exports with a dynamic length (its encodings rewritten from tensors) and matches
    its module, whose encodings Funnel's own code computes, at lengths 1, 2, 3, 5 and 16 (torch.export's deferred
    guards name 2 and 3: held here too)."""
    import torch
    import transformers

    from posenc.export.shapes import Shape
    from posenc.export.trace import export_traced
    from posenc.graphs.trace_rewrite import replace_positions
    from posenc.validate.checkpoint import validate_against_checkpoint

    folder = tmp_path / "funnel"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformers.FunnelModel(transformers.FunnelConfig(**_FUNNEL, block_sizes=[1, 1])).save_pretrained(folder)
    result = export_traced(tmp_path / "funnel.onnx", folder, layer=0, rewrite=replace_positions)
    assert result.manifest.dynamic_dims["seq"].max is None
    parts = [part.detail for part in result.manifest.trace.parts if part.part == "stack position tensor"]
    assert any("computed from tensors by posenc" in detail for detail in parts)
    shapes = [Shape(2, length, 0) for length in (1, 2, 3, 5, 16)]
    report = validate_against_checkpoint(result.path, folder, shapes=shapes, long_positions=False)
    assert report.passed, report.to_markdown()
    assert {row.shape.seq for row in report.rows} == {1, 2, 3, 5, 16}
