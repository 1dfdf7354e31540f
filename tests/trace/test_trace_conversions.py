"""Traced layers of checkpoints transformers stores converted (fused q/k/v on disk, renamed tensors).

Each case writes a tiny seeded checkpoint with ``save_pretrained`` (which reverts transformers' weight conversion:
GTE's ``q_proj``, ``k_proj``, ``v_proj`` become one ``qkv_proj`` on disk), captures layer 0 for the traced path and
holds every parameter of the captured attention to the one transformers' own ``from_pretrained`` loads into the same
module (independent of posenc's reader), element for element; the recorded tensors are the ones on disk.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posenc.census.tiny import tiny_config
from posenc.checkpoints.samples import save_seeded
from posenc.errors import ExportError
from posenc.trace.capture import capture_layer

transformers = pytest.importorskip("transformers")

CASES = {
    "gte": ("GteModel", "layers.0.self_attn", "encoder.layer.0.attention.qkv_proj.weight"),
    "nomic_bert": ("NomicBertModel", "layers.0.self_attn", "encoder.layers.0.attn.Wqkv.weight"),
    "molmo2_text": ("Molmo2TextModel", "layers.0.self_attn", "layers.0.self_attn.att_proj.weight"),
    "flint": ("FlintModel", "layers.0.self_attn", "layers.0.self_attn.softmax_offset"),
    "molmo2": ("Molmo2ForConditionalGeneration", "model.language_model.layers.0.self_attn",
               "model.transformer.blocks.0.self_attn.att_proj.weight"),
}  # fmt: skip
"""model_type -> (the class saved, where its from_pretrained model keeps layer 0's attention, a tensor on disk):
fused q/k/v (GTE, NomicBERT, Molmo 2's text model, and Molmo 2's text tower under its wrapper, which writes it as
``model.transformer.blocks``), a rename (Flint's sinks are ``softmax_offset`` on disk)."""


def check_case(model_type: str, folder: Path) -> None:
    model_class, path, stored = CASES[model_type]
    cls = getattr(transformers, model_class)
    save_seeded(cls, tiny_config(model_type).config, folder)
    captured = capture_layer(folder, 0)
    loaded = cls.from_pretrained(folder, attn_implementation="eager").eval()
    own = dict(loaded.get_submodule(path).named_parameters())
    ours = dict(captured.attention.named_parameters())
    assert sorted(ours) == sorted(own)
    for name, value in ours.items():
        assert torch.equal(value, own[name].float()), name
    assert any(name.endswith(stored) for name in captured.tensors), sorted(captured.tensors)


def test_a_fused_qkv_on_disk_is_read_as_transformers_loads_it(tmp_path: Path) -> None:
    check_case("gte", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(set(CASES) - {"gte"}))
def test_every_converted_checkpoint_reads_as_transformers_loads_it(model_type: str, tmp_path: Path) -> None:
    check_case(model_type, tmp_path)


@pytest.mark.slow
def test_an_attention_reading_its_model_s_conv_state_is_refused_by_name(tmp_path: Path) -> None:
    """Inkling 2's sliding attention (its tensors renamed on disk, read through the conversion) reads convolution
    state from its model's cache: refused with the reason, not an internal error."""
    save_seeded(transformers.Inkling2TextModel, tiny_config("inkling2_text").config, tmp_path)
    with pytest.raises(ExportError, match=r"reads a convolution or recurrent state from its cache .* keys and values"):
        capture_layer(tmp_path, 0)
