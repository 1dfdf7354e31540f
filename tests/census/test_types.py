"""Which model types are text model types, derived from transformers (posenc.census.types)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from posenc.census.types import text_model_types


def test_text_multimodal_and_left_out_types() -> None:
    found, left = text_model_types(["llama", "llava", "t5", "clip", "vit", "encoder-decoder", "wav2vec2"])
    kinds = {t.name: (t.kind, t.text_type, t.model_class) for t in found}
    assert kinds == {
        "llama": ("text", "llama", "LlamaForCausalLM"),
        "llava": ("multimodal", "llama", "LlavaForConditionalGeneration"),
        "t5": ("text", "t5", "T5ForConditionalGeneration"),  # an encoder-decoder: saved from its seq2seq head
    }
    reasons = {entry.name: entry.reason for entry in left}
    assert set(reasons) == {"clip", "vit", "encoder-decoder", "wav2vec2"}
    assert "text tower clip_text_model is counted" in reasons["clip"]
    assert "takes no token ids" in reasons["vit"]
    assert "takes no token ids" in reasons["wav2vec2"]
    assert "generic composite" in reasons["encoder-decoder"]


@pytest.mark.slow
def test_every_type_is_accounted_for_and_towers_are_found() -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    found, left = text_model_types()
    assert sorted([t.name for t in found] + [entry.name for entry in left]) == sorted(CONFIG_MAPPING_NAMES)
    towers = {t.name for t in found if t.kind == "tower"}
    assert {"qwen2_vl_text", "siglip_text_model"} <= towers
    assert len(found) > 300
