"""Model types whose transformers default config builds no model (issue 21's "not built" group): the census's
tiny configs carry what their released checkpoints set (``posenc.census.tiny``: TYPE_DEFAULTS, TYPE_OVERRIDES,
MODES, MIN_LAYERS), and the traced path finds and loads their attention (``posenc.trace``: an attention inside a
module named for it, layers tied across a kind, seeded encoder states, tied tensors of a wrapper's tower).

Default run: each mechanism on tiny seeded configs (transformers' own classes, never downloaded). Under ``slow``:
each type through ``posenc models --census`` (export and ``validate --against-hf`` of every layer kind).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from posenc.census.tiny import tiny_config
from posenc.cli import main
from posenc.trace.calls import Call
from posenc.trace.counts import built_layers
from posenc.trace.model import attention_child
from posenc.trace.stacks import token_stream


def _default(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]()


def test_fields_released_checkpoints_set_make_the_model_build_and_keep_its_layer_kinds() -> None:
    """LFM2-MoE's default leaves ``layer_types`` None (its model indexes it): the tiny config takes the released
    checkpoints' kinds and keeps both (short convolutions and attention); DBRX's attention reads
    ``attn_config.rope_theta`` and clamps to ``clip_qkv``, which the default lacks."""
    import transformers

    assert _default("lfm2_moe").layer_types is None
    lfm = tiny_config("lfm2_moe")
    assert set(lfm.config.layer_types) == {"conv", "full_attention"}
    assert lfm.kinds_kept
    dbrx = tiny_config("dbrx").config
    assert dbrx.attn_config.rope_theta == 500000
    assert dbrx.attn_config.clip_qkv == 8
    model = transformers.DbrxModel(dbrx)
    name, attention = attention_child(model.blocks[0])  # held inside DbrxNormAttentionNorm
    assert name == "norm_attn_norm.attn"
    assert type(attention).__name__ == "DbrxAttention"


def test_zamba_builds_with_two_hybrid_layers_and_its_shared_attention_is_found() -> None:
    """Zamba ties every hybrid layer's shared transformer to the first one's and refuses a model with a single
    hybrid layer: the tiny config starts at MIN_LAYERS, the capture builds through the second hybrid layer, and the
    attention is the shared transformer's ``self_attn`` (not the decoder layer that holds it)."""
    import transformers

    config = tiny_config("zamba").config
    hybrid = [i for i, kind in enumerate(config.layers_block_type) if kind == "hybrid"]
    assert len(hybrid) >= 2
    assert built_layers(config, hybrid[0] + 1) == hybrid[1] + 1
    assert built_layers(config, hybrid[1] + 1) == hybrid[1] + 1
    model = transformers.ZambaModel(config)
    name, attention = attention_child(model.layers[hybrid[0]])
    assert name == "shared_transf.self_attn"
    assert type(attention).__name__ == "ZambaAttention"
    assert attention_child(model.layers[0]) is None  # a Mamba layer


def test_esm_takes_the_rotary_mode_of_esm2() -> None:
    esm = tiny_config("esm")
    assert esm.config.position_embedding_type == "rotary"
    assert esm.mode["position_embedding_type"] == "rotary"
    assert esm.config.vocab_size == 33


def test_reformers_axial_position_table_is_a_learned_absolute_scheme() -> None:
    """Reformer factorises its learned table into per-axis weights (``AxialPositionEmbeddings``, no ``weight``): the
    census reads it as learned absolute positions, not NoPE (the tiny config takes its causal LM head's mode)."""
    import transformers

    from posenc.census.anatomy import read_anatomy

    made = tiny_config("reformer")
    assert made.mode == {"is_decoder": True}
    anatomy = read_anatomy(transformers.ReformerModelWithLMHead(made.config), made.config)
    assert anatomy.scheme == "learned absolute"


def test_a_position_module_of_another_stream_is_not_the_layers_positions() -> None:
    """The layer called on the token embeddings unchanged got no positions added (Moonshine Streaming's decoder:
    its ``pos_emb`` positions the encoder states); a layer called on embeddings plus positions did."""
    model = nn.ModuleDict(
        {"embed": nn.Embedding(10, 4), "pos": nn.Embedding(10, 4), "layers": nn.ModuleList([nn.Identity()])}
    )
    ids = torch.arange(5).unsqueeze(0)
    tokens, positions = model["embed"](ids), model["pos"](ids)
    calls = {"embed": Call((ids,), {}, tokens), "pos": Call((ids,), {}, positions)}
    assert token_stream({**calls, "layers.0": Call((tokens,), {})}, model, "layers.0")
    assert not token_stream({**calls, "layers.0": Call((tokens + positions,), {})}, model, "layers.0")
    assert not token_stream(calls, model, "layers.0")


def test_a_towers_tied_tensor_is_read_under_the_name_it_is_saved_as(tmp_path: Path) -> None:
    """DiffusionGemma's encoder text layers are tied to its decoder's: ``save_pretrained`` writes them once, under
    the decoder's names, and the tower's names list that one."""
    from posenc.checkpoints.towers import base_tower

    config = tiny_config("diffusion_gemma").config
    tower = base_tower(config, {"architectures": ["DiffusionGemmaForBlockDiffusion"]}, None)
    assert tower is not None
    names = tower.checkpoint_names("layers.0.self_attn.q_proj.weight")
    assert names[0] == f"{tower.path}.layers.0.self_attn.q_proj.weight"
    assert "model.decoder.layers.0.self_attn.q_proj.weight" in names


PASSING = (
    "dbrx,dots1,lfm2_moe,esm,zamba,chameleon,emu3,moonshine_streaming,cohere_compass_text,deepseek_ocr2_text,"
    "diffusion_gemma_text,granite4_vision,t5gemma2_text"
)


@pytest.mark.slow
def test_types_the_default_config_does_not_build_export_and_match_their_module(tmp_path: Path) -> None:
    cache = tmp_path / "c.json"
    argv = ["models", "--census", "--types", f"{PASSING},reformer,qwen4_exp_text", "-j", "2", "--cache", str(cache)]
    assert main([*argv, "-o", str(tmp_path / "m.md"), "--quiet"]) == 0
    types = json.loads(cache.read_text())["types"]
    for name in PASSING.split(","):
        kinds = [k for k in types[name]["layers"] if k["attention"]]
        assert kinds, name
        for kind in kinds:
            assert kind["path"] in ("family", "trace"), (name, kind)
            assert kind["parity"]["passed"], (name, kind)
            assert kind["parity"]["worst_hf"] <= 1e-5, (name, kind)
    assert types["reformer"]["scheme"] == "learned absolute"
    reformer = [k for k in types["reformer"]["layers"] if k["attention"]]
    assert all("ReformerDynamicCache" in k["reason"] for k in reformer)
    qwen4 = [k for k in types["qwen4_exp_text"]["layers"] if k["attention"]]
    assert all("indexer_position_ids" in k["reason"] for k in qwen4 if k["path"] == "refused")


def test_a_bidirectional_window_that_is_not_symmetric_is_rebuilt_as_a_band() -> None:
    """T5Gemma 2's encoder sliding layers see ``(w + 1) // 2`` keys up to the query and ``w // 2`` after it
    (transformers' own mask function is the reference): the capture records that band, which posenc's symmetric
    window is not."""
    from types import SimpleNamespace

    from transformers.models.t5gemma2.modeling_t5gemma2 import sliding_window_mask_function

    from posenc.trace.calls import _mask_recipe
    from posenc.trace.masks import visible

    size, window = 12, 8
    inner = sliding_window_mask_function(window, is_causal=False)
    allowed = torch.tensor([[bool(inner(0, 0, q, k)) for k in range(size)] for q in range(size)])
    additive = torch.zeros(1, 1, size, size).masked_fill(~allowed, torch.finfo(torch.float32).min)
    positions = torch.arange(size).unsqueeze(0)
    hf = SimpleNamespace(model_type="t5gemma2_text", sliding_window=window)
    recipe = _mask_recipe(additive, hf, "sliding_attention", positions)
    assert (recipe.causal, recipe.window, recipe.ahead) == (False, (window + 1) // 2, window // 2)
    rebuilt = visible(positions + 5, positions + 5, recipe)  # the unit's rebuild, at other positions too
    assert rebuilt is not None
    assert torch.equal(rebuilt[0, 0], allowed)
    symmetric = (positions.T - positions).abs() < window
    plain = _mask_recipe(symmetric.view(1, 1, size, size), hf, "sliding_attention", positions)
    assert (plain.window, plain.ahead) == (window, None)
