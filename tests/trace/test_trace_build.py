"""Model types the traced path could not build before (issue 21's "cannot build" class): each mechanism on a tiny
config built with transformers' own config classes, and (slow) the census of every type of the class, each layer
kind exported and validated against its own transformers module.

Mechanisms, cheapest first: a text tower transformers neither maps nor exports is built from its config's own model
classes; a config that is one stack of an encoder-decoder is traced as one stack; config.json's tagged floats are read
as transformers reads them; a wrapper's top-level field that its text_config sets too is checked there only; a list as
long as the layers that is not per layer stays whole; a count of the model's last layers is cut with them; the
attention's output is found in nested tuples and dicts; channels-first hidden states are refused by name; a model
whose last layer differs is built one layer further; a heterogeneous config's layer is read through its per-layer view.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from posenc.checkpoints.reference import hf_config
from posenc.checkpoints.towers import text_config
from posenc.cli import main
from posenc.config.hf_json import check_config
from posenc.errors import ConfigError
from posenc.export.external import _tensor_bytes
from posenc.trace.arguments import attention_output
from posenc.trace.counts import built_layers, layer_config, reduced_config
from posenc.trace.model import build_base_model, layer_list

transformers = pytest.importorskip("transformers")

_SMALL = {"hidden_size": 32, "intermediate_size": 32, "num_attention_heads": 2, "vocab_size": 64}


def test_a_tower_transformers_does_not_export_is_built_from_its_configs_own_classes() -> None:
    config = transformers.AltCLIPTextConfig(**_SMALL, num_hidden_layers=2, max_position_embeddings=40)
    assert not hasattr(transformers, "AltRobertaModel")  # neither AutoModel nor the top level has it
    model = build_base_model(config, 1)
    assert type(model).__name__ == "AltRobertaModel"  # the base model, not a head
    path, layers = layer_list(model, 1)
    assert path == "encoder.layers"
    assert len(layers) == 1


def test_tagged_floats_of_config_json_are_read_as_transformers_reads_them(tmp_path: Path) -> None:
    config = transformers.FalconH1Config(**_SMALL, num_hidden_layers=2, time_step_limit=(0.0, math.inf))
    config.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["time_step_limit"][1] == {"__float__": "Infinity"}  # what transformers writes
    assert tuple(hf_config(data).time_step_limit) == (0.0, math.inf)
    assert tuple(transformers.AutoConfig.from_pretrained(tmp_path).time_step_limit) == (0.0, math.inf)


def test_a_wrappers_top_level_field_is_checked_where_its_text_config_sets_it() -> None:
    wrapper = {"model_type": "musicflamingo", "max_position_embeddings": 1200.0}  # its audio rotary's theta
    check_config({**wrapper, "text_config": {"model_type": "qwen2", "max_position_embeddings": 4096}})
    with pytest.raises(ConfigError, match=r"text_config\.max_position_embeddings is 4096\.5"):
        check_config({**wrapper, "text_config": {"model_type": "qwen2", "max_position_embeddings": 4096.5}})
    with pytest.raises(ConfigError, match=r"max_position_embeddings is 1200\.0"):  # no text_config: the model's own
        check_config(wrapper)


def test_a_list_as_long_as_the_layers_but_not_per_layer_stays_whole() -> None:
    config = transformers.FalconH1Config(**_SMALL, num_hidden_layers=2, mlp_multipliers=[0.5, 2.0])
    assert reduced_config(config, 1).mlp_multipliers == [0.5]  # cut: the model cannot build from it
    model = build_base_model(config, 1)
    mlp = model.layers[0].feed_forward
    assert (mlp.gate_multiplier, mlp.down_multiplier) == (0.5, 2.0)
    assert model.config.num_hidden_layers == 1


def test_a_count_of_the_last_layers_is_cut_with_the_layers() -> None:
    config = transformers.Gemma3nTextConfig(
        **_SMALL, num_hidden_layers=10, num_kv_shared_layers=4, layer_types=["sliding_attention"] * 4
        + ["full_attention"] + ["sliding_attention"] * 4 + ["full_attention"], head_dim=16,
        laurel_rank=8, hidden_size_per_layer_input=8, altup_num_inputs=2, num_key_value_heads=1,
    )  # fmt: skip
    for layers, shared in ((5, 0), (7, 1), (10, 4)):
        reduced = reduced_config(config, layers)
        assert reduced.num_kv_shared_layers == shared
        reuses = [mode == "reuse" for mode in reduced.kv_sharing_modes]
        assert reuses == [mode == "reuse" for mode in config.kv_sharing_modes[:layers]]  # each layer keeps its role


def test_the_last_layer_that_differs_is_built_past_layer_n() -> None:
    config = transformers.GPTNeoXJapaneseConfig(**_SMALL, num_hidden_layers=3)
    assert built_layers(config, 1) == 2
    assert built_layers(config, 3) == 3
    model = build_base_model(config, 1)
    assert [layer.attention.dense_bias is not None for layer in model.layers] == [False, True]
    cut = transformers.AutoModel.from_config(reduced_config(config, 1))
    assert cut.layers[0].attention.dense_bias is not None  # layer 0 built as a last layer: not the checkpoint's


def test_a_heterogeneous_configs_layer_is_read_through_its_per_layer_view() -> None:
    from posenc.census.tiny import tiny_config

    config = tiny_config("embedding_gemma2_text").config
    assert config.is_heterogeneous
    with pytest.raises(Exception, match="per-layer attribute"):
        _ = config.num_key_value_heads
    for layer in range(config.num_hidden_layers):
        assert layer_config(config, layer).num_key_value_heads == config.per_layer_config[layer].num_key_value_heads
    plain = transformers.LlamaConfig(**_SMALL)
    assert layer_config(plain, 0) is plain
    # an attention module holding the global config (which refuses its per-layer fields) gets its heads from the
    # layer's view: the census's EmbeddingGemma 2 failed on this after the stacks' sub-config lookup came in
    from posenc.trace.probe import cacheless_heads

    attention = torch.nn.Module()
    attention.config = config
    view = layer_config(config, 0)
    assert cacheless_heads(view, attention, view.hidden_size) == (view.num_key_value_heads, view.head_dim)


def test_a_wrappers_ambiguous_text_config_is_its_decoder() -> None:
    config = transformers.MusicgenConfig()
    with pytest.raises(ValueError, match="Multiple valid text configs"):
        config.get_text_config()
    assert text_config(config) is config.decoder
    llava = transformers.LlavaConfig()
    assert text_config(llava) is llava.get_text_config()


def test_the_attention_output_is_found_in_nested_tuples_and_dicts() -> None:
    out = torch.ones(1, 2, 3)
    assert attention_output(out) is out
    assert attention_output((out, None)) is out
    assert attention_output(((out,), (torch.zeros(1),))) is out  # I-BERT: (outputs, scaling factors)
    assert attention_output({"context_layer": out}) is out  # SqueezeBERT


def test_a_transposed_row_buffer_reads_as_its_bytes() -> None:
    row = torch.arange(5, dtype=torch.int64).unsqueeze(0)  # CLAP's position_ids buffer
    flipped = row.T
    assert flipped.stride(-1) != 1
    assert _tensor_bytes(flipped) == row.numpy().tobytes()


TYPES = (
    "altclip_text_model,bridgetower_text_model,canary_decoder,dia_decoder,kosmos_2_5_text_model,kosmos_2_text_model,"
    "voxtral_realtime_text,gemma3n_text,falcon_h1,musicflamingo,musicgen,musicgen_melody,embedding_gemma2_text,"
    "vibevoice,gpt_neox_japanese,clap_text_model,ibert"
)
"""The types of the class that export every layer kind and match their own module (vibevoice_asr too, with more
memory than the census's limit allows a 2-core test run; neomme's full-attention layers need its value embeddings)."""


@pytest.mark.slow
def test_the_types_of_the_class_export_and_match_their_own_module(tmp_path: Path) -> None:
    cache = tmp_path / "c.json"
    argv = ["models", "--census", "--types", TYPES, "-j", "2", "--cache", str(cache), "-o", str(tmp_path / "m.md")]
    assert main([*argv, "--quiet"]) == 0
    types = json.loads(cache.read_text())["types"]
    for name in TYPES.split(","):
        kinds = [kind for kind in types[name]["layers"] if kind["attention"]]
        assert kinds, name
        for kind in kinds:
            assert kind["path"] in ("family", "alias", "tower", "trace"), (name, kind)
            assert kind["parity"]["passed"], (name, kind)
            assert kind["parity"]["worst_hf"] <= 1e-5, (name, kind)
