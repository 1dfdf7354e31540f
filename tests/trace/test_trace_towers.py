"""Text towers through the traced path: a wrapper checkpoint (vision-, audio-language) whose text tower no family
claims exports its tower's layer as the wrapper's own text module computes it.

Each case writes a tiny seeded checkpoint of the wrapper's own model class with transformers (``save_pretrained``:
the names transformers writes on disk, vision towers with the same ``layers.N.self_attn`` names included), then:

- ``posenc export --hf-model WRAPPER`` takes the traced path (no family for the tower's type) and records the tower
  (its base model's path in the wrapper and its class); the tensors it read are the tower's, under the names the
  checkpoint holds (MiniMax-M3-VL keeps its language model at ``model.language_model`` in memory and writes it as
  ``language_model.model``);
- ``validate --against-hf`` passes: the graph against the tower's attention module as posenc captures it;
- that reference reproduces the attention as the wrapper's tower drives it: the wrapper loaded with its own
  ``from_pretrained`` (not posenc's reader), its tower (found by the path named here) run on a text prompt and a
  decode step, the attention module's calls recorded (tests/checkpoints/whole_model.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from posenc.checkpoints.samples import NO_SPECIAL_TOKENS, TINY, Sample
from posenc.cli import main
from posenc.errors import ConfigError
from posenc.export import load_manifest
from posenc.export.shapes import FeedShape
from posenc.trace.build import tower_class
from posenc.trace.record import ModuleRef
from posenc.trace.reference import load_traced
from posenc.validate.checkpoint import validate_against_checkpoint
from tests.checkpoints.parity import ATOL
from tests.checkpoints.whole_model import Calls, capture, reference_error

transformers = pytest.importorskip("transformers")

_SMALL = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
          "num_key_value_heads": 2, "image_size": 32, "patch_size": 8, "head_dim": 16, "encoder_layers": 1,
          "depth": 1, "embed_dim": 32, "num_heads": 2, "out_hidden_size": 64, "vision_output_dim": 64,
          "projector_hidden_size": 64, "num_channels": 3}  # fmt: skip
"""What shrinks a wrapper's other towers (vision), applied to the keys their default config has."""
_TEXT = {**TINY, **NO_SPECIAL_TOKENS, "head_dim": 16, "num_hidden_layers": 2}


@dataclasses.dataclass(frozen=True)
class Wrapper:
    """A wrapper checkpoint: its model class, its text tower's config, and where the wrapper holds the tower and the
    tower the layer's attention (written here from transformers' modeling code, independent of posenc)."""

    model_class: str
    text: Mapping[str, Any]
    tower: str
    attention: str
    """the layer's attention in the tower, ``{layer}`` replaced."""
    saved: str
    """the layer's ``q_proj.weight`` as ``save_pretrained`` writes it."""
    layer: int = 0
    angles: str = "replaced"
    """what becomes of the tower's rotary angles (``absent``: positions enter at the embeddings)."""
    top: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def sample(self, model_type: str) -> Sample:
        default = transformers.AutoConfig.for_model(model_type)
        settings: dict[str, Any] = {"text_config": dict(self.text), **self.top}
        for name, sub in vars(default).items():
            if name != "text_config" and isinstance(sub, transformers.PreTrainedConfig):
                data = sub.to_dict()
                settings[name] = {**data, **{k: v for k, v in _SMALL.items() if k in data}}
        return Sample(model_type, model_type, type(default).__name__, self.model_class, settings)


WRAPPERS: dict[str, Wrapper] = {
    "minimax_m3_vl": Wrapper(
        "MiniMaxM3SparseForConditionalGeneration",
        {"model_type": "minimax_m3_vl_text", **_TEXT, "rotary_dim": 8, "num_local_experts": 4,
         "num_experts_per_tok": 2, "dense_intermediate_size": 64, "shared_intermediate_size": 64,
         "layer_types": ["full_attention"] * 2, "mlp_layer_types": ["sparse"] * 2,
         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
        "model.language_model", "layers.{layer}.self_attn",
        "language_model.model.layers.{layer}.self_attn.q_proj.weight",
        top={"projector_hidden_size": 64, "merged_hidden_size": 64},
    ),
    "lfm2_vl": Wrapper(
        "Lfm2VlForConditionalGeneration",
        {"model_type": "lfm2", **_TEXT, "layer_types": ["conv", "full_attention"], "block_ff_dim": 64},
        "model.language_model", "layers.{layer}.self_attn",
        "model.language_model.layers.{layer}.self_attn.q_proj.weight", layer=1,
        top={"projector_hidden_size": 64},
    ),
    "granite_docling": Wrapper(
        "GraniteDoclingForConditionalGeneration",
        {"model_type": "granite_docling_text", **_TEXT, "attention_multiplier": 0.05, "embedding_multiplier": 12.0,
         "residual_multiplier": 0.25, "logits_scaling": 4.0},
        "model.text_model", "layers.{layer}.self_attn", "model.text_model.layers.{layer}.self_attn.q_proj.weight",
        layer=1, top={"image_token_id": 95, "pad_token_id": None},
    ),
    "blip-2": Wrapper(
        "Blip2ForConditionalGeneration",
        {"model_type": "opt", **_TEXT, "ffn_dim": 64, "word_embed_proj_dim": 64, "max_position_embeddings": 512},
        "language_model.model", "decoder.layers.{layer}.self_attn",
        "language_model.model.decoder.layers.{layer}.self_attn.q_proj.weight", layer=1, angles="absent",
        top={"num_query_tokens": 4},
    ),
}  # fmt: skip
"""Wrappers whose text tower has no posenc family: MiniMax-M3-VL (partial rotary, which its rotary module reads
from ``rope_parameters``, not ``rotary_dim``; q/k norms; a conversion that renames the tower on disk), LFM2-VL
(LFM2's attention layer among convolution layers), Granite-Docling (Granite's attention multiplier), BLIP-2 (OPT
under ``OPTForCausalLM``: a learned position table, layer 1 past the embedding step)."""


def tower_steps(folder: Path, case: Wrapper) -> Calls:
    """The attention's inputs and outputs while the wrapper's own text tower (the wrapper from ``from_pretrained``)
    runs a 6-token prompt and one decode step with the cache."""
    model = getattr(transformers, case.model_class).from_pretrained(folder, attn_implementation="eager").eval()
    tower = model.get_submodule(case.tower)
    calls, handle = capture(tower.get_submodule(case.attention.format(layer=case.layer)))
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        past = tower(input_ids=ids[:, :6], use_cache=True).past_key_values
        tower(input_ids=ids[:, 6:], past_key_values=past, use_cache=True)
    handle.remove()
    return calls


def check_wrapper(model_type: str, root: Path) -> str:
    """Export the wrapper's tower layer through the CLI, validate it and hold its reference to the wrapper's own
    tower; returns what validate printed."""
    case = WRAPPERS[model_type]
    folder = case.sample(model_type).build(root / "ckpt")
    out = root / "layer.onnx"
    assert main(["export", "--hf-model", str(folder), "--layer", str(case.layer), "-o", str(out)]) == 0
    manifest = load_manifest(out)
    assert manifest.trace is not None
    assert manifest.trace.tower is not None
    assert (manifest.trace.model_type, manifest.trace.tower.path) == (model_type, case.tower)
    assert {p.part: p.status for p in manifest.trace.parts}.get("rotary angles", "absent") == case.angles
    read = set(manifest.weights.source.tensors)
    assert case.saved.format(layer=case.layer) in read, sorted(read)
    traced = load_traced(folder, case.layer)
    assert reference_error(traced.reference(), tower_steps(folder, case)) <= ATOL
    shapes = [FeedShape(2, 5, 3), FeedShape(1, 1, 7)]
    report = validate_against_checkpoint(out, folder, shapes=shapes)
    assert report.passed, report.to_markdown()
    return report.to_markdown()


def test_a_wrapper_s_tower_without_a_family_is_traced_as_the_wrapper_builds_it(tmp_path: Path) -> None:
    text = check_wrapper("minimax_m3_vl", tmp_path)
    assert "of the minimax_m3_vl model's text tower model.language_model (MiniMaxM3VLTextModel)" in text


def test_a_record_s_tower_class_is_a_transformers_model_class_or_refused() -> None:
    """A manifest names the tower's class; only transformers' own model classes are taken from it."""
    assert tower_class(ModuleRef("language_model.model", "transformers.OPTModel")) is transformers.OPTModel
    for name in ("os.system", "transformers.OPTConfig", "transformers.models.opt.modeling_opt.Missing"):
        with pytest.raises(ConfigError, match="not a model class of the installed transformers"):
            tower_class(ModuleRef("language_model.model", name))


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(set(WRAPPERS) - {"minimax_m3_vl"}))
def test_every_traced_tower_matches_the_wrapper_s_module(model_type: str, tmp_path: Path) -> None:
    check_wrapper(model_type, tmp_path)
