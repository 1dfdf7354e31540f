"""The traced path for attention its model calls without a KV cache (encoders): the unit is the embeddings module
fed the token embeddings, and layer 0's attention (``hidden``, ``position_ids`` -> ``out``), held to the
checkpoint's own transformers modules by ``validate --against-hf``.

References: the checkpoint's own modules (BigBird's embeddings module and ``BigBirdAttention``, called as its model
calls them), and the same graph fed shifted positions (which must change the output: the positions are read).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from posenc.errors import ConfigError, ExportError
from posenc.export.runtime import ort_session
from posenc.export.shapes import FeedShape
from posenc.export.trace import export_traced
from posenc.graphs.inspect import inspect_model
from posenc.graphs.trace_rewrite import replace_positions
from posenc.validate.checkpoint import decode_against_checkpoint, validate_against_checkpoint
from tests.trace.samples import ENCODERS, build


def test_an_encoder_traces_without_a_cache_and_matches_its_own_modules(tmp_path: Path) -> None:
    """BigBird with full attention: its model calls the attention without a cache and without a mask; the unit
    starts at the embeddings module (token types and LayerNorm included, the token table left out)."""
    folder = build(ENCODERS["big_bird"], tmp_path)
    result = export_traced(tmp_path / "big_bird.onnx", folder, rewrite=replace_positions)
    manifest = result.manifest
    record = manifest.trace
    assert record is not None
    assert record.cacheless
    assert record.embedding is not None
    assert record.embedding.position.path == "embeddings"
    assert record.embedding.tokens is not None
    assert record.embedding.tokens.path == "word_embeddings"
    assert [spec.name for spec in manifest.inputs] == ["hidden", "position_ids"]
    assert manifest.output_names == ["out"]
    assert "past" not in manifest.dynamic_dims
    assert not any("word_embeddings" in name for name in manifest.weights.source.tensors)  # never read
    parts = {part.part: part.status for part in record.parts}
    assert parts == {"attention mask": "absent", "position table": "kept"}
    assert (manifest.scheme, manifest.max_positions) == ("learned", 128)
    text = inspect_model(result.path).to_text()
    assert "kept: position table (Gather of the model's table" in text
    assert "absent: attention mask" in text
    assert "called without a KV cache (no past)" in text
    report = validate_against_checkpoint(result.path, folder, shapes=[FeedShape(2, 5, 0), FeedShape(1, 3, 120)])
    assert report.passed, report.to_markdown()
    assert {row.reference for row in report.rows} >= {"eager-fp64", "hf-fp32"}
    session = ort_session(result.path)
    hidden = np.random.default_rng(0).standard_normal((1, 4, 64)).astype(np.float32)
    first, shifted = (session.run(None, {"hidden": hidden, "position_ids": np.arange(4)[None] + start})[0]
                      for start in (0, 9))  # fmt: skip
    assert float(np.abs(first - shifted).max()) > 1e-3
    with pytest.raises(ConfigError, match="not used with a KV cache"):
        decode_against_checkpoint(result.path, folder)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(ENCODERS) - {"big_bird"}))
def test_every_traced_encoder_matches_its_own_modules(name: str, tmp_path: Path) -> None:
    sample = ENCODERS[name]
    folder = build(sample, tmp_path)
    result = export_traced(tmp_path / f"{name}.onnx", folder, layer=sample.layer, rewrite=replace_positions)
    record = result.manifest.trace
    assert record is not None
    assert record.cacheless
    parts = {part.part: part.status for part in record.parts}
    if record.rotary is not None:  # a rotary encoder: posenc's angles, no embedding step
        assert (parts["rotary angles"], parts["rotation"]) == ("replaced", "replaced")
    else:
        assert record.embedding is not None
        assert parts["position table"] == "kept"
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, report.to_markdown()


@pytest.mark.slow
def test_an_attention_its_model_reconfigures_while_captured_is_refused(tmp_path: Path) -> None:
    """BigBird's default block-sparse attention turns to full attention on the capture's short input: the captured
    call is not what the module built from the config computes, so the export is refused, naming the setting."""
    sample = ENCODERS["big_bird"].with_settings(attention_type="block_sparse")
    folder = build(dataclasses.replace(sample, name="big_bird_sparse"), tmp_path)
    with pytest.raises(ExportError, match=r"attention_type from 'block_sparse' to 'original_full'"):
        export_traced(tmp_path / "sparse.onnx", folder)
    assert not (tmp_path / "sparse.onnx").exists()
