"""The census's tiny-config builder: a type's own config class, shrunk generically, keeps the default's layer kinds,
validates, instantiates, and has the sizes asked for (posenc.census.tiny)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from posenc.census import shrink
from posenc.census.tiny import layer_kinds, tiny_config


def _default(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]()


def test_a_decoder_gets_the_asked_sizes_and_keeps_grouped_query_attention() -> None:
    built = tiny_config("llama")
    config = built.config
    assert (config.hidden_size, config.num_attention_heads, config.intermediate_size) == (64, 4, 64)
    assert config.num_key_value_heads == 4  # Llama's default is multi-head (kv == heads): kept so
    assert (config.num_hidden_layers, config.vocab_size) == (2, 128)
    assert config.max_position_embeddings <= shrink.CONTEXT
    assert built.kinds_kept


def test_grouped_and_multi_query_kv_heads_keep_their_kind() -> None:
    assert tiny_config("mistral").config.num_key_value_heads == shrink.KV_HEADS  # 32 / 8 in the default
    falcon = tiny_config("falcon").config  # multi-query by default: one kv head stays one
    assert falcon.multi_query
    assert falcon.num_attention_heads == 4


def test_layer_kinds_survive_the_shrink() -> None:
    """Gemma 3's five sliding layers and one full layer become six tiny layers with both kinds, not two sliding."""
    default = _default("gemma3_text")
    built = tiny_config("gemma3_text")
    kinds = set(layer_kinds(built.config))
    assert kinds == set(layer_kinds(default))
    assert len(kinds) == 2
    assert built.layers == built.config.num_hidden_layers == 6
    assert built.config.layer_types[:6] == default.layer_types[:6]
    assert built.config.sliding_window == shrink.WINDOW


def test_per_layer_overrides_stay_different_from_the_global_value() -> None:
    """Gemma 4's wider full-attention heads (a per-layer override) stay wider than the tiny global head width."""
    built = tiny_config("gemma4_text")
    data = built.config.to_dict()
    overrides = data["per_layer_config"]
    assert overrides, "the per-layer override was dropped"
    assert all(v["head_dim"] > data["head_dim"] for v in overrides.values())
    assert built.kinds_kept


def test_experts_and_latent_attention_shrink() -> None:
    moe = tiny_config("qwen3_moe").config
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (4, 2, 64)
    mla = tiny_config("deepseek_v3").config
    assert (mla.kv_lora_rank, mla.q_lora_rank, mla.qk_rope_head_dim, mla.qk_nope_head_dim) == (32, 24, 8, 16)
    assert mla.n_routed_experts == 4
    assert mla.n_group == 1
    assert mla.topk_group == 1


def test_composite_configs_shrink_their_text_config_and_keep_mrope_consistent() -> None:
    """Qwen2-VL's text config takes M-RoPE sections from its modeling module's default, rescaled to the tiny head."""
    built = tiny_config("qwen2_vl").config
    text = built.get_text_config(decoder=True)
    assert (text.hidden_size, text.num_attention_heads, text.vocab_size) == (64, 4, 128)
    section = text.rope_parameters["mrope_section"]
    assert sum(section) == (text.hidden_size // text.num_attention_heads) // 2
    assert len(section) == 3
    assert built.vision_config.depth == shrink.OTHER_LAYERS


def test_a_partial_rotary_head_keeps_a_frequency_for_every_mrope_section() -> None:
    """Qwen3.5 rotates a quarter of each head with three interleaved sections: the tiny head grows until each section
    keeps a frequency, so the sections sum to the rotary half-width (a consistent config posenc accepts)."""
    text = tiny_config("qwen3_5_text").config
    rope = text.rope_parameters
    half = int(text.head_dim * rope.get("partial_rotary_factor", 1.0)) // 2
    assert sum(rope["mrope_section"]) == half
    assert min(rope["mrope_section"]) >= 1


def test_a_partial_rotary_factor_keeps_an_even_rotary_width() -> None:
    """MiMo-V2-Flash rotates int(192 x 0.334) = 64 channels; a head of 16 would give transformers' odd width 5 (it
    then rotates 6 channels at the frequencies of 5), which no released checkpoint has: the tiny head widens."""
    config = tiny_config("mimo_v2_flash").config
    for params in config.rope_parameters.values():
        width = int(config.head_dim * params["partial_rotary_factor"])
        assert width >= 2, (config.head_dim, params)
        assert width % 2 == 0, (config.head_dim, params)
    assert shrink.even_rotary_head(16, 0.334) == 32
    assert shrink.even_rotary_head(16, 0.5) == 16


def test_encoder_decoder_stacks_and_token_ids_fit_the_tiny_vocabulary() -> None:
    t5 = tiny_config("t5").config
    assert (t5.d_model, t5.d_kv, t5.num_heads, t5.num_layers, t5.num_decoder_layers) == (64, 16, 4, 2, 2)
    bart = tiny_config("bart").config
    ids = [bart.pad_token_id, bart.bos_token_id, bart.eos_token_id, bart.decoder_start_token_id]
    assert all(i is None or 0 <= i < bart.vocab_size for i in ids)


def test_a_config_whose_validation_ties_sizes_together_takes_the_next_variant() -> None:
    """Bamba's Mamba heads x head width must equal 2 x hidden: 4 heads of 16 cannot, 8 can."""
    built = tiny_config("bamba")
    config = built.config
    assert built.targets.heads == 8
    assert config.mamba_n_heads * config.mamba_d_head == config.mamba_expand * config.hidden_size
    assert built.rejected  # the first variant was refused by the config class, and recorded


def test_the_tiny_config_instantiates_a_small_model() -> None:
    import transformers

    for model_type, cls in (("gemma3_text", "Gemma3ForCausalLM"), ("qwen3_moe", "Qwen3MoeForCausalLM")):
        model = getattr(transformers, cls)(tiny_config(model_type).config)
        assert sum(p.numel() for p in model.parameters()) < 500_000, model_type


def test_a_type_whose_default_config_does_not_build_is_told_apart_from_a_shrinking_problem() -> None:
    """DBRX's default attention config lacks the rope_theta its module reads: no shrinking can fix that (the
    released checkpoints' value comes from ``TYPE_DEFAULTS``), and the census says so rather than blaming the
    shrink."""
    from posenc.census.types import model_type_info
    from posenc.census.worker import _default_builds

    assert "does not build DbrxForCausalLM either" in _default_builds(model_type_info("dbrx"))
    assert "default config builds LlamaForCausalLM" in _default_builds(model_type_info("llama"))


def test_fields_a_model_needs_are_set_where_the_default_leaves_them_unset() -> None:
    """Step 3.5's model always builds a sliding-window mask, HunYuan-VL's rotary module splits heads by
    ``mrope_section``: the default configs leave both unset (``TYPE_DEFAULTS``), the tiny ones carry them shrunk.
    LayoutLMv3 concatenates 4 coordinate and 2 shape embeddings into the hidden width (``TYPE_OVERRIDES``)."""
    step = tiny_config("step3p5").config
    assert _default("step3p5").sliding_window is None
    assert step.sliding_window == shrink.WINDOW
    hunyuan = tiny_config("hunyuan_vl_text").config
    section = hunyuan.rope_parameters["mrope_section"]
    assert len(section) == 4
    assert sum(section) == hunyuan.head_dim // 2
    layout = tiny_config("layoutlmv3").config
    assert 4 * layout.coordinate_size + 2 * layout.shape_size == layout.hidden_size


def test_a_type_whose_default_mode_cannot_be_captured_takes_a_named_mode() -> None:
    """BigBird's block-sparse default turns to full attention on short inputs; its tiny config chooses the model's
    full-attention mode (``posenc.census.tiny.MODES``), and the census's notes say so."""
    from posenc.census.report import _notes

    made = tiny_config("big_bird")
    assert made.config.attention_type == "original_full"
    assert made.mode == {"attention_type": "original_full"}
    assert tiny_config("bert").mode == {}
    note = _notes({"build": {"layers": 2, "kinds_kept": True, "mode": made.mode}, "layers": []})
    assert "mode attention_type='original_full'" in note
