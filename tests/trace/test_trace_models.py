"""Every traced sample against its own module (slow): the model types posenc has no family for.

Each sample is exported with ``posenc export --via trace`` semantics (capture, export, posenc's rewrite) and held to
the checkpoint's own transformers module by ``validate --against-hf``: ``hf-fp32`` (its own float32 angles) at
ordinary shapes, ``hf-fp64, fp64 angles`` everywhere, including a feed ending at the context length.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from posenc.export.trace import export_traced
from posenc.graphs.trace_rewrite import replace_positions
from posenc.validate.checkpoint import validate_against_checkpoint
from tests.trace.samples import SAMPLES, build

pytestmark = pytest.mark.slow

ABSENT = {"cohere2-full"}
"""Samples whose layer does not rotate (Cohere 2's full-attention layers are NoPE)."""
KEPT = {"ministral3": "position-dependent values", "gpt2": "position table", "opt": "position table"}
"""Samples with a positional part posenc keeps as traced (Ministral 3's llama_4_scaling q scale, the learned tables
of the embedding step)."""
EMBEDDING = {"gpt2", "opt"}
"""Samples whose positions enter at the embeddings: the unit is the embedding step and the first attention."""


@pytest.mark.parametrize("name", sorted(set(SAMPLES) - {"llama", "gpt2"}))
def test_a_traced_layer_matches_its_own_module(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    root: Path = tmp_path_factory.mktemp(name)
    sample = SAMPLES[name]
    folder = build(sample, root)
    result = export_traced(root / f"{name}.onnx", folder, layer=sample.layer, rewrite=replace_positions)
    parts = {part.part: part.status for part in result.manifest.trace.parts}
    if name in ABSENT:
        assert parts["rotary angles"] == "absent"
        assert result.manifest.scheme == "nope"
    elif name in EMBEDDING:
        assert result.manifest.trace.embedding is not None
        assert result.manifest.scheme == "learned"
    else:
        assert parts["rotary angles"] == "replaced"
        assert parts["rotation"] == "replaced"
    assert parts["attention mask"] == "replaced"
    if name in KEPT:
        assert parts[KEPT[name]] == "kept"
    else:
        assert set(parts) <= {"rotary angles", "rotation", "attention mask"}
    if name in EMBEDDING:
        assert set(parts) == {"attention mask", KEPT[name]}
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, report.to_markdown()
