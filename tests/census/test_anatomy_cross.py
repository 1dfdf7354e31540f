"""A layer whose only attention is cross-attention is not a self-attention layer of the text model: the census does
not export it and says why (posenc.census.anatomy.cross_only, posenc.census.worker)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from posenc.census.anatomy import _skip_reason, read_anatomy


def test_mllama_s_cross_attention_layers_are_not_exported_and_say_why() -> None:
    """Mllama's text model interleaves cross-attention layers (MllamaTextCrossAttention, attending to the vision
    encoder's states) with self-attention ones: the self-attention kind is exported, the cross-attention kind is
    skipped with its reason."""
    import transformers

    config = transformers.MllamaTextConfig(hidden_size=64, intermediate_size=64, num_attention_heads=4,
                                           num_key_value_heads=2, num_hidden_layers=4, cross_attention_layers=[3],
                                           vocab_size=128, pad_token_id=1, bos_token_id=2,
                                           eos_token_id=3)  # fmt: skip
    anatomy = read_anatomy(transformers.MllamaForCausalLM(config), config)
    by_layer = {kind.layer: kind for kind in anatomy.kinds}
    assert by_layer[0].attention
    assert not by_layer[3].attention
    assert "MllamaTextCrossAttention" in by_layer[3].label
    assert by_layer[3].skipped.startswith("cross-attention only")
    assert _skip_reason((), 0, None) == "no attention module in this layer"
