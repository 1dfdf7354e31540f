"""The census reads a type's positional scheme and layer kinds from the model transformers builds
(posenc.census.anatomy), checked on tiny models whose schemes the papers fix."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from posenc.census.anatomy import read_anatomy
from posenc.census.tiny import tiny_config
from posenc.census.types import model_type_info


def _anatomy(model_type: str):
    built = tiny_config(model_type)
    config = built.config
    import transformers

    cls = getattr(transformers, model_type_info(model_type).model_class)
    return read_anatomy(cls(config), config)


@pytest.mark.parametrize(
    ("model_type", "scheme"),
    [
        ("llama", "RoPE"),  # Su et al. 2021, RoFormer
        ("gpt2", "learned absolute"),
        ("t5", "T5 relative bias"),  # Raffel et al. 2020
        ("bloom", "ALiBi"),  # Press et al. 2022
        ("falcon", "RoPE / ALiBi"),  # rotary unless the config sets alibi=True
        ("marian", "sinusoidal"),  # Vaswani et al. 2017
        ("ctrl", "sinusoidal"),  # a sinusoid buffer, not a module
        ("deberta-v2", "disentangled (DeBERTa)"),  # He et al. 2021
        ("xlnet", "Transformer-XL relative"),  # Dai et al. 2019
        ("bros", "learned absolute"),  # its sinusoid box embedding carries an inv_freq buffer: not a rotation
        ("mamba", "none (no attention)"),
        ("rwkv", "none (no attention)"),  # "RwkvSelfAttention" mixes time without attention heads
        ("jamba", "NoPE"),  # attention layers without positions (the Mamba layers carry order)
    ],
)
def test_the_scheme_is_read_from_the_modules(model_type: str, scheme: str) -> None:
    assert _anatomy(model_type).scheme == scheme


def test_layer_kinds_of_a_hybrid_and_of_an_encoder_decoder() -> None:
    jamba = _anatomy("jamba").kinds
    assert [(k.layer, k.attention) for k in jamba] == [(0, False), (4, True)]  # attn_layer_offset 4
    t5 = _anatomy("t5").kinds
    assert [(k.stack, k.layer, k.attention) for k in t5] == [("encoder", 0, True), ("decoder", 0, True)]
    gemma3 = _anatomy("gemma3_text").kinds
    assert [k.layer for k in gemma3] == [0, 5]
    assert ["sliding_attention" in gemma3[0].label, "full_attention" in gemma3[1].label] == [True, True]
    assert [k.count for k in gemma3] == [5, 1]
    minimax = _anatomy("minimax").kinds  # lightning attention is linear: its layer_types entry says so
    found = [(k.layer, k.attention, "linear_attention" in k.label) for k in minimax]
    assert found == [(0, True, False), (1, False, True)]


def test_a_multimodal_types_text_part_excludes_its_vision_tower() -> None:
    """Llava's scheme and layers are its language model's; the vision tower's learned table is not read."""
    llava = _anatomy("llava")
    assert llava.scheme == "RoPE"
    assert not any("vision" in e for e in llava.evidence)
    assert all("Llama" in k.label for k in llava.kinds)


def test_two_attentions_of_one_layer_are_two_kinds_numbered_as_the_model_numbers_them() -> None:
    """ALBERT's layer group holding two shared layers (LongCat-Flash's layer calling self_attn[0] and [1] alike):
    two kinds, layers 0 and 1 (posenc.trace.counts.NESTED_ATTENTIONS)."""
    import transformers

    config = transformers.AlbertConfig(vocab_size=64, hidden_size=32, embedding_size=32, num_attention_heads=2,
                                       intermediate_size=32, num_hidden_layers=3, inner_group_num=2)  # fmt: skip
    kinds = read_anatomy(transformers.AlbertModel(config), config).kinds
    assert [(k.layer, k.attention, k.count) for k in kinds] == [(0, True, 1), (1, True, 1)]
    assert ["attention 0 of its layer" in kinds[0].label, "attention 1 of its layer" in kinds[1].label] == [True] * 2
