"""Configs the traced path could not cut or call before: a mask of ones (DeBERTa without relative attention), a
family that declines a config, per-stage layer counts (LXMERT), layers counted per block with a tuple of stack
tensors (Funnel), a layer list counted in a part's config (BLT), and types refused by name for their structure.

References: the checkpoint's own transformers attention module called as its model calls it (the capture's check,
``hf-fp32``, ``hf-fp64``) and posenc's float64 rebuild of the traced graph (``eager-fp64``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posenc.errors import ConfigError
from posenc.trace.calls import mask_kind
from posenc.trace.capture import capture_layer

transformers = pytest.importorskip("transformers", reason="transformers builds the tiny checkpoints")

_SMALL = {"hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 32, "vocab_size": 64}


def _save(config: object, model_class: str, folder: Path) -> Path:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        getattr(transformers, model_class)(config).save_pretrained(folder)
    return folder


def _deberta(folder: Path, **settings: object) -> Path:
    config = transformers.DebertaV2Config(**_SMALL, num_hidden_layers=1, max_position_embeddings=40, **settings)
    return _save(config, "DebertaV2Model", folder)


def _lxmert(folder: Path) -> Path:
    config = transformers.LxmertConfig(
        **_SMALL, l_layers=2, x_layers=1, r_layers=1, visual_feat_dim=8, max_position_embeddings=40
    )
    return _save(config, "LxmertModel", folder)


def test_a_mask_of_ones_the_attention_turns_boolean_is_kept_as_ones(tmp_path: Path) -> None:
    """DeBERTa without relative attention hands its attention a float mask of ones (``attention_mask.bool()``
    inside): read as additive it was rebuilt as zeros, every key hidden, and the capture's check found posenc's call
    1.1e-2 away from the model's. Now it is a ``keep`` mask, rebuilt as ones, and the capture's check passes."""
    ones = torch.ones(1, 1, 4, 4)
    assert mask_kind(ones) == "keep"
    assert mask_kind(torch.tril(ones)) == "keep"
    assert mask_kind(torch.zeros(1, 1, 4, 4)) == "additive"  # hides nothing either way
    assert mask_kind(torch.zeros(1, 1, 4, 4).masked_fill(torch.tril(ones) == 0, -1e30)) == "additive"
    assert mask_kind(ones.bool()) == "bool"
    captured = capture_layer(_deberta(tmp_path / "deberta"), 0)
    assert captured.mask.kind == "keep"
    assert not captured.mask.causal


def test_a_config_the_family_declines_takes_the_traced_path(tmp_path: Path) -> None:
    """The DeBERTa family's scheme is relative attention; a DeBERTa config without it (transformers' default) goes
    the traced path by default (``Family.declines``); released checkpoints' configs stay with the family."""
    from posenc.checkpoints.load import loads_by_family

    absolute = _deberta(tmp_path / "absolute")
    relative = _deberta(tmp_path / "relative", relative_attention=True, pos_att_type=["p2c", "c2p"])
    assert not loads_by_family(absolute)
    assert loads_by_family(relative)


def test_per_stage_layer_counts_cut_the_language_stage(tmp_path: Path) -> None:
    """LXMERT's config.json writes num_hidden_layers as per-stage counts: accepted as such; the capture cuts the
    language stage (``l_layers``) to layers 0 .. N and the vision and cross-modality stages, which run after it, to
    none; its embeddings count positions from the length, so they stay outside the unit, named."""
    from posenc.config.hf_json import check_config
    from posenc.trace.counts import reduced_config

    check_config({"model_type": "lxmert", "num_hidden_layers": {"language": 9, "vision": 5, "cross_encoder": 5}})
    for bad in ({"language": 0}, {}, [9, 5]):
        with pytest.raises(ConfigError, match="num_hidden_layers"):
            check_config({"num_hidden_layers": bad})
    folder = _lxmert(tmp_path / "lxmert")
    config = transformers.AutoConfig.from_pretrained(folder)
    reduced = reduced_config(config, 1)
    assert (reduced.l_layers, reduced.r_layers, reduced.x_layers) == (1, 0, 0)
    captured = capture_layer(folder, 1)
    assert captured.attention_ref.path == "encoder.layer.1.attention"
    assert captured.embedding is None


@pytest.mark.parametrize(
    ("config_class", "why"),
    [
        ("PerceiverConfig", "learned latent array"),
        ("PI0Config", "two models: PaliGemma"),
    ],
)
def test_a_model_without_one_layer_list_is_refused_saying_why(config_class: str, why: str) -> None:
    from posenc.trace.counts import layer_count

    with pytest.raises(ConfigError, match=why):
        layer_count(getattr(transformers, config_class)())


def _blt(folder: Path) -> Path:
    part = {"hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 32,
            "num_hidden_layers": 1, "vocab_size": 64, "max_position_embeddings": 64}  # fmt: skip
    config = transformers.BltConfig(
        vocab_size=64, max_position_embeddings=32, local_attention_window_len=6, patch_size=2,
        encoder_hash_byte_group_size=[2], encoder_hash_byte_group_vocab=16, patching_threshold=0.5,
        encoder_config={**part, "num_hidden_layers": 2, "sliding_window": 6, "cross_attn_k": 1},
        decoder_config={**part, "cross_attn_k": 1}, global_config=part, patcher_config=part,
    )  # fmt: skip
    return _save(config, "BltModel", folder)


def test_a_layer_list_counted_in_a_part_s_config_is_that_part_s() -> None:
    """BLT keeps its layer counts per part (no num_hidden_layers): the traced list is its local encoder's over the
    bytes (``encoder_config``), found by path among the parts' lists alike, cut in that config, whose window, heads
    and context the layer takes; its forward cannot build a cache from its config, so it is captured without one."""
    from posenc.trace.counts import layer_count, part_config, part_view, reduced_config

    config = transformers.BltConfig()
    assert layer_count(config) == config.encoder_config.num_hidden_layers
    assert part_config(config) is config.encoder_config
    data = config.to_dict()
    assert part_view(data)["max_position_embeddings"] == config.encoder_config.max_position_embeddings
    assert reduced_config(config, 1).encoder_config.num_hidden_layers == 1


@pytest.mark.slow
def test_blt_s_local_encoder_layer_is_captured_with_its_window_and_no_cache(tmp_path: Path) -> None:
    captured = capture_layer(_blt(tmp_path / "blt"), 1)
    assert captured.attention_ref.path == "local_encoder.layers.1.self_attn"
    assert captured.mask.window == 6
    assert captured.cacheless


def _funnel(**settings: object) -> object:
    return transformers.FunnelConfig(
        block_sizes=[2, 1], d_model=32, n_head=2, d_head=16, d_inner=32, vocab_size=64, **settings
    )


def test_layers_counted_per_block_are_cut_to_the_first_block_and_captured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Funnel numbers its layers across its blocks; the first block's attend over the tokens (later ones over a
    pooled sequence: refused, naming the block). The capture keeps that block alone, no decoder layers, and rebuilds
    ``attention_inputs`` (a tuple of relative encodings, token-type matrix, float padding mask of ones and <cls>
    mask) with the encoder's own ``attention_structure.init_attention_inputs``, checked equal to the model's."""
    from posenc.trace import counts

    config = _funnel()
    reduced = counts.reduced_config(config, 2)
    assert (reduced.block_sizes, reduced.block_repeats, reduced.num_decoder_layers) == ([2], [1], 0)
    with pytest.raises(ConfigError, match=r"layer 2 of this funnel model is in block 1 .* pooled sequence"):
        counts.reduced_config(config, 3)
    captured = capture_layer(_save(config, "FunnelModel", tmp_path / "funnel"), 1)
    assert captured.attention_ref.path == "encoder.blocks.0.1.attention"
    (recipe,) = captured.derived.values()
    assert (recipe.recipe.source.path, recipe.recipe.method) == ("encoder.attention_structure", "init_attention_inputs")
    monkeypatch.delitem(counts.BLOCKS, "funnel")  # a count computed from per-stage sizes, not declared: by name
    with pytest.raises(ConfigError, match=r"computes num_hidden_layers from per-stage sizes .*block_sizes"):
        counts.reduced_config(config, 1)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["deberta-absolute", "deberta-v1-absolute", "lxmert", "blt"])
def test_the_traced_configs_match_their_own_module(name: str, tmp_path: Path) -> None:
    """Exported through the CLI's default route and held to the model's own module (prompt, batch, positions near
    the context's end)."""
    from posenc.cli import main
    from posenc.validate.checkpoint import validate_against_checkpoint

    if name == "lxmert":
        folder = _lxmert(tmp_path / name)
    elif name == "blt":
        folder = _blt(tmp_path / name)
    elif name == "deberta-absolute":
        folder = _deberta(tmp_path / name)
    else:
        config = transformers.DebertaConfig(**_SMALL, num_hidden_layers=1, max_position_embeddings=40)
        folder = _save(config, "DebertaModel", tmp_path / name)
    out = tmp_path / f"{name}.onnx"
    assert main(["export", "--hf-model", str(folder), "--layer", "0", "-o", str(out)]) == 0
    import json

    manifest = json.loads(out.with_suffix(".manifest.json").read_text())
    parts = {part["part"]: part["status"] for part in manifest["trace"]["parts"]}
    if name == "lxmert":
        assert parts["stack embeddings"] == "absent"
    elif name == "blt":  # posenc's float64 tables in place of its angles
        assert parts["rotary angles"] == "replaced"
    else:
        assert parts["position table"] == "kept"
    report = validate_against_checkpoint(out, folder)
    assert report.passed, report.to_markdown()


@pytest.mark.slow
def test_a_length_read_as_a_python_number_is_refused_saying_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Funnel's relative-shift encodings start from ``list(range(seq_len))``: torch.export fixes the length. Without
    posenc's tensor-wise rewrite of that code (``trace.tensorwise``, which exports it: test_trace_tensorwise) the
    export is refused, saying so."""
    from posenc.errors import ExportError
    from posenc.export.trace import export_traced
    from posenc.trace import tensorwise

    monkeypatch.setattr(tensorwise, "REWRITES", {})
    folder = _save(_funnel(), "FunnelModel", tmp_path / "funnel")
    with pytest.raises(ExportError, match=r"seq: fixed at the capture's \d+\): the module's code reads the length"):
        export_traced(tmp_path / "funnel.onnx", folder, layer=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["deberta", "deberta-v2"])
def test_the_census_deberta_configs_are_the_released_ones_and_load_by_family(name: str, tmp_path: Path) -> None:
    from posenc.census.tiny import save_tiny_model, tiny_config
    from posenc.census.types import model_type_info
    from posenc.checkpoints.load import loads_by_family

    folder = tmp_path / name
    save_tiny_model(tiny_config(name).config, model_type_info(name).model_class, folder)  # type: ignore[union-attr]
    assert loads_by_family(folder)
