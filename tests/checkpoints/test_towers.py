"""Text towers: a wrapper checkpoint (vision-, audio-language) loads its text tower's layer through the tower's family.

Each case writes a tiny seeded checkpoint of the wrapper's own model class with transformers (``save_pretrained``:
the tensor names transformers writes on disk, vision and audio towers included, some with the same
``layers.N.self_attn`` names), then:

- the layer loads through the tower's family, from the tower's tensors (its root in the file is the one
  transformers wrote, not the vision tower's);
- posenc's block equals the tower's own attention module within 1e-5 (a prompt, a prompt at 100, a decode step,
  and positions at the context length against float64 angles: tests/checkpoints/parity.py ``block_errors``);
- that reference reproduces the attention module as the wrapper's whole model drives it (the wrapper's base model
  from ``AutoModel.from_pretrained``, text-only prompt and a decode step; the module found by its path, named here).

Bad input: a model_type with no text tower, or one whose tower posenc does not know, is refused with what to do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from posenc.checkpoints import load_layer
from posenc.checkpoints.samples import _DEEPSEEK, _DEEPSEEK_YARN, _GEMMA4, NO_SPECIAL_TOKENS, TINY, Sample
from posenc.cli import main
from posenc.errors import ConfigError
from tests.checkpoints.parity import ATOL, block_errors
from tests.checkpoints.whole_model import model_steps, reference_error

transformers = pytest.importorskip("transformers")

_SMALL = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
          "num_key_value_heads": 2, "image_size": 32, "patch_size": 8, "head_dim": 16, "encoder_layers": 1,
          "encoder_attention_heads": 2, "encoder_ffn_dim": 32, "d_model": 32, "num_mel_bins": 16,
          "max_source_positions": 32, "vision_output_dim": 64, "projector_input_dim": 64,
          "projector_output_dim": 64}  # fmt: skip
"""What shrinks a wrapper's other towers (vision, audio), applied to the keys their default config has."""
_TEXT = {**TINY, **NO_SPECIAL_TOKENS, "head_dim": 16}


@dataclasses.dataclass(frozen=True)
class Wrapper:
    """A wrapper checkpoint: its model class, its text tower's config and where its base model keeps the layer."""

    model_class: str
    text: Mapping[str, Any]
    path: str
    """the layer's attention in the base model (``AutoModel``), ``{layer}`` replaced; independent of posenc."""
    layers: tuple[int, ...] = (1,)

    def sample(self, model_type: str) -> Sample:
        default = transformers.AutoConfig.for_model(model_type)
        settings: dict[str, Any] = {"text_config": dict(self.text)}
        for name, sub in vars(default).items():
            if name != "text_config" and isinstance(sub, transformers.PreTrainedConfig):
                data = sub.to_dict()
                settings[name] = {**data, **{k: v for k, v in _SMALL.items() if k in data}}
        return Sample(model_type, model_type, type(default).__name__, self.model_class, settings)


_LM = "language_model.layers.{layer}.self_attn"
WRAPPERS: dict[str, Wrapper] = {
    "llava": Wrapper("LlavaForConditionalGeneration", {"model_type": "llama", **_TEXT, "attention_bias": True}, _LM),
    "mistral3": Wrapper("Mistral3ForConditionalGeneration", {"model_type": "mistral", **_TEXT, "sliding_window": 4},
                        _LM),
    "paligemma": Wrapper("PaliGemmaForConditionalGeneration", {"model_type": "gemma", **_TEXT}, _LM),
    "gemma3": Wrapper("Gemma3ForConditionalGeneration",
                      {"model_type": "gemma3_text", **_TEXT, "sliding_window": 4, "sliding_window_pattern": 2,
                       "query_pre_attn_scalar": 24}, _LM, layers=(0, 1)),
    "idefics3": Wrapper("Idefics3ForConditionalGeneration", {"model_type": "llama", **_TEXT},
                        "text_model.layers.{layer}.self_attn"),
    "qwen2_audio": Wrapper("Qwen2AudioForConditionalGeneration", {"model_type": "qwen2", **_TEXT}, _LM),
    "llama4": Wrapper("Llama4ForConditionalGeneration",
                      {"model_type": "llama4_text", **_TEXT, "num_hidden_layers": 4, "intermediate_size_mlp": 64,
                       "num_local_experts": 2, "attention_chunk_size": 8, "floor_scale": 4, "attn_scale": 0.1},
                      "language_model.model.layers.{layer}.self_attn", layers=(1, 3)),
    "aya_vision": Wrapper("AyaVisionForConditionalGeneration",
                          {"model_type": "cohere2", **_TEXT, "sliding_window": 4,
                           "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
                          _LM, layers=(0, 1)),
    "gemma4": Wrapper("Gemma4ForConditionalGeneration", {"model_type": "gemma4_text", **_GEMMA4}, _LM, layers=(1, 2)),
    "kimi_k25": Wrapper("Kimi_K25ForConditionalGeneration",
                        {"model_type": "deepseek_v3", **_TEXT, **_DEEPSEEK, "head_dim": 8, "q_lora_rank": 24,
                         "n_group": 1, "topk_group": 1, "rope_parameters": _DEEPSEEK_YARN}, _LM),
}  # fmt: skip
"""Wrapper checkpoints, their text towers (Llama, Mistral with a window, Gemma, Gemma 3's layer types, Llama 4's
RoPE and NoPE layers, Cohere 2 — an alias — under Aya Vision, DeepSeek-V3's multi-head latent attention under Kimi
K2.5, which transformers 5.23 saves as ``language_model.model.blocks.N``, Gemma 4's sliding and full layers under its
vision and audio wrapper) and where their base models keep the layer."""


SLOW_WRAPPERS = {"gemma4"}
"""Wrappers whose tower's family is proven in the default run elsewhere (tests/checkpoints/test_gemma4.py); the way
to their tower is the other wrappers' (each ~8 s: the wrapper's vision and audio towers are built and saved too)."""


@pytest.mark.parametrize(
    "model_type",
    [pytest.param(t, marks=[pytest.mark.slow] if t in SLOW_WRAPPERS else []) for t in sorted(WRAPPERS)],
)
def test_text_tower_layer_is_its_own_module(model_type: str, tmp_path: Path) -> None:
    case = WRAPPERS[model_type]
    folder = case.sample(model_type).build(tmp_path / "ckpt")
    for layer in case.layers:
        loaded = load_layer(folder, layer)
        assert loaded.tower is not None
        assert loaded.tower.model_type == case.text["model_type"]
        assert loaded.provenance().model_type == model_type
        errors = block_errors(loaded)
        assert max(errors.values()) <= ATOL, (layer, loaded.plan.scheme, errors)
        steps = model_steps(folder, layer, None, path=case.path.format(layer=layer))
        assert reference_error(loaded.reference(), steps) <= ATOL, layer


def test_a_tower_exports_and_validates_against_its_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI path: ``export --hf-model`` of a Llava checkpoint's text layer, then ``validate --against-hf``."""
    folder = WRAPPERS["llava"].sample("llava").build(tmp_path / "ckpt")
    out = tmp_path / "layer1.onnx"
    assert main(["export", "--hf-model", str(folder), "--layer", "1", "-o", str(out)]) == 0
    assert main(["validate", str(out), "--against-hf", str(folder)]) == 0
    assert "transformers LlamaAttention (checkpoint weights, layer 1" in capsys.readouterr().out


def test_an_in_memory_wrapper_loads_its_tower(tmp_path: Path) -> None:
    """A transformers model object (not a folder) is searched as it is, with its in-memory tensor names."""
    sample = WRAPPERS["idefics3"].sample("idefics3")
    model = getattr(transformers, sample.model_class)(sample.config()).eval()
    loaded = load_layer(model, 1)
    assert loaded.names["q_proj.weight"] == "model.text_model.layers.1.self_attn.q_proj.weight"
    assert torch.equal(loaded.tensors["q_proj.weight"], model.model.text_model.layers[1].self_attn.q_proj.weight)


def _config_only(folder: Path, config: Any) -> Path:
    """A folder with ``config`` and a placeholder weights file (the refusal comes before any tensor is read)."""
    config.save_pretrained(folder)
    save_file({"placeholder": torch.zeros(1)}, str(folder / "model.safetensors"))
    return folder


def test_a_model_type_without_a_text_tower_is_refused(tmp_path: Path) -> None:
    folder = _config_only(tmp_path, transformers.ViTConfig(hidden_size=32, num_hidden_layers=1))
    with pytest.raises(
        ConfigError, match=r"'vit' is not supported .*wraps no text tower.*supported model types: .*llama"
    ):
        load_layer(folder, 0)


def test_a_tower_posenc_does_not_know_is_refused(tmp_path: Path) -> None:
    folder = _config_only(tmp_path, transformers.Blip2Config())
    with pytest.raises(
        ConfigError, match=r"'blip-2' wraps a text tower of model_type 'opt', which posenc does not load"
    ):
        load_layer(folder, 0)


def test_a_layer_outside_the_tower_is_refused(tmp_path: Path) -> None:
    folder = WRAPPERS["paligemma"].sample("paligemma").build(tmp_path / "ckpt")
    with pytest.raises(ConfigError, match=r"layer 3 is out of range: the checkpoint has 3 layers"):
        load_layer(folder, 3)
