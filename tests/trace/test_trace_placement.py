"""Where a model keeps its attention, when no layer module holds it as a child, and an attention that mixes nothing.

ALBERT shares its layer groups across depths (its layers hold ``albert_layers``); LongCat-Flash's layer calls two
attentions (``self_attn`` is a ``ModuleList``), numbered by the model as ``2N`` and ``2N + 1``; XLM and FlauBERT keep
their attentions in ``model.attentions`` beside ``layer_norm1`` / ``ffns`` (and hand them a cache they cannot extend by
several tokens: traced as the encoders they are); MRA's attention without its CUDA kernel mixes no positions.
References: each checkpoint's own transformers attention module called as its model calls it (``hf-fp32``,
``hf-fp64``), and posenc's float64 rebuild of the traced graph (``eager-fp64``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from posenc.errors import ConfigError, ExportError
from posenc.export.trace import export_traced
from posenc.graphs.trace_rewrite import replace_positions
from posenc.trace import counts
from posenc.trace.capture import capture_layer
from posenc.validate.checkpoint import validate_against_checkpoint

_SMALL = {"vocab_size": 64, "max_position_embeddings": 64}
CONFIGS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "albert": ("AlbertConfig", "AlbertModel", {"hidden_size": 32, "embedding_size": 32, "num_hidden_layers": 3,
               "num_attention_heads": 2, "intermediate_size": 32, "num_hidden_groups": 1, "inner_group_num": 2}),
    "longcat_flash": ("LongcatFlashConfig", "LongcatFlashModel", {"hidden_size": 32, "num_layers": 1,
                      "num_attention_heads": 2, "num_key_value_heads": 2, "kv_lora_rank": 16, "q_lora_rank": 16,
                      "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "head_dim": 8,
                      "ffn_hidden_size": 32, "expert_ffn_hidden_size": 32, "n_routed_experts": 4, "moe_topk": 2,
                      "zero_expert_num": 2}),
    "xlm": ("XLMConfig", "XLMModel", {"emb_dim": 32, "n_layers": 2, "n_heads": 2}),
    "flaubert": ("FlaubertConfig", "FlaubertModel", {"emb_dim": 32, "n_layers": 2, "n_heads": 2}),
    "mra": ("MraConfig", "MraModel", {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 32}),
}  # fmt: skip
"""Tiny seeded configs of the five types (transformers' config classes), built with ``save_pretrained``."""


def _save(name: str, folder: Path) -> Path:
    import torch
    import transformers

    config_class, model_class, settings = CONFIGS[name]
    config = getattr(transformers, config_class)(**{**_SMALL, **settings})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        getattr(transformers, model_class)(config).save_pretrained(folder)
    return folder


def test_attentions_nested_in_a_layer_are_located_by_the_models_own_numbering(tmp_path: Path) -> None:
    """ALBERT's two shared layers of its one group are layers 0 and 1 at every depth (3 depths, 2 attentions); the
    count says why. Without the table's entry the group holds no attention of its own. (LongCat-Flash's attention
    1, ``layers.0.self_attn.1``, in the slow test below.)"""
    albert = _save("albert", tmp_path / "albert")
    captured = capture_layer(albert, 1)
    assert captured.attention_ref.path == "encoder.albert_layer_groups.0.albert_layers.1.attention"
    assert (captured.layer, captured.cacheless) == (1, True)
    with pytest.raises(ConfigError, match=r"the checkpoint has 2 layers \(0 .. 1\) \(ALBERT shares its layers"):
        capture_layer(albert, 2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(counts, "NESTED_ATTENTIONS", {})
        with pytest.raises(ConfigError, match=r"has no softmax attention \(it holds ModuleList \(albert_layers\)\)"):
            capture_layer(albert, 0)


def test_attentions_in_a_list_of_their_own_trace_without_the_cache_they_cannot_extend(tmp_path: Path) -> None:
    """XLM's layer 0 attention is ``attentions.0`` (its ``ffns.0`` is no attention); its forward hands the attention
    an EncoderDecoderCache, which the unit leaves out (the module extends it by one token at a time only)."""
    folder = _save("xlm", tmp_path / "xlm")
    captured = capture_layer(folder, 0)
    assert captured.attention_ref.path == "attentions.0"
    assert captured.cacheless
    assert not captured.mask.causal


def test_an_attention_that_mixes_no_positions_is_refused_naming_its_kernel(tmp_path: Path) -> None:
    """MRA's attention runs through a CUDA kernel; without it transformers' module returns zeros for the attention
    (the output at each token is that token's alone): refused, naming the kernel."""
    folder = _save("mra", tmp_path / "mra")
    with pytest.raises(ExportError, match=r"mixes no positions here.*mra_cuda_kernel is not loaded"):
        capture_layer(folder, 0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "layer"), [("albert", 0), ("albert", 1), ("longcat_flash", 0), ("longcat_flash", 1), ("xlm", 1),
                        ("flaubert", 0)],
)  # fmt: skip
def test_each_placement_exports_and_matches_its_own_module(name: str, layer: int, tmp_path: Path) -> None:
    folder = _save(name, tmp_path / name)
    result = export_traced(tmp_path / f"{name}.onnx", folder, layer=layer, rewrite=replace_positions)
    record = result.manifest.trace
    assert record is not None
    assert record.layer == layer
    assert record.cacheless == (name != "longcat_flash")
    if name == "longcat_flash":  # attention 2N + i of the model's numbering: self_attn[i] of layer N, its cache slot
        assert record.attention.path == f"layers.0.self_attn.{layer}"
        assert result.manifest.attention["num_kv_heads"] == 1  # MLA: the latent cache [B, 1, P, kv_lora_rank]
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, f"{name} {layer}\n{report.to_markdown()}"
