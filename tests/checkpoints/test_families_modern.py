"""Families of today's attention features that are not Llama-convention aliases: Phi and Persimmon (q/k LayerNorm,
partial rotary, ``dense``; Persimmon's fused per-head ``query_key_value``), Mistral 4 (DeepSeek-V3's multi-head
latent attention with the query scaled by position).

Each is a tiny seeded checkpoint (``posenc.checkpoints.samples``); posenc's block equals the type's own attention
module within 1e-5 (a prompt, a prompt at position 100, a decode step over a cache, the context's end against the
module fed float64 angles: tests/checkpoints/parity.py ``block_errors``), and that reference reproduces the module as
the whole model drives it (tests/checkpoints/whole_model.py). tests/checkpoints/test_families.py exports the samples
through the CLI and ONNX Runtime (slow run).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from posenc.checkpoints import load_layer
from posenc.checkpoints.samples import get_sample
from tests.checkpoints.parity import ATOL, block_errors
from tests.checkpoints.whole_model import model_steps, reference_error

pytest.importorskip("transformers")


FEATURES = {
    "phi": ("phi", "qk_norm", "layer"),
    "phi-plain": ("phi", "qk_norm", "none"),
    "persimmon": ("persimmon", "qk_norm", "layer"),
    "mistral4": ("deepseek", "temperature_floor_scale", 4),
}
"""sample -> (family, a geometry field, the value its config gives it)."""


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_layer_is_its_own_module(name: str, tmp_path: Path) -> None:
    sample = get_sample(name)
    folder = sample.build(tmp_path / "ckpt")
    loaded = load_layer(folder, sample.layer)
    family, field, value = FEATURES[name]
    assert loaded.family.name == family
    assert getattr(loaded.plan.config, field) == value
    errors = block_errors(loaded)
    assert max(errors.values()) <= ATOL, errors
    steps = model_steps(folder, sample.layer or 0, None, path=f"layers.{sample.layer or 0}.self_attn")
    assert reference_error(loaded.reference(), steps) <= ATOL
