"""Aliases: model types whose attention is an existing family's, each proven against its own transformers module.

For every alias (``posenc.checkpoints.families.llama.ALIASES``, Gemma's ``vaultgemma``, Qwen-VL's
``qwen3_vl_moe``) one tiny seeded checkpoint is written with transformers (``save_pretrained`` of its causal-LM
class), with the options its Variant maps switched away from their defaults where the config has them (biases,
softmax multipliers, q/k norms, sliding windows, layers without RoPE). For each listed layer:

- posenc's block equals the alias's own attention module (built from its config class, loaded with the layer's
  tensors) within 1e-5: a prompt, a prompt at position 100, a decode step over a cache, and positions ending at the
  context length against the module in float64 fed float64 angles (tests/checkpoints/parity.py ``block_errors``);
- that reference reproduces the module as the alias's whole model drives it (its own mask and rotary module) over
  a prompt and a decode step (tests/checkpoints/whole_model.py).

Options posenc cannot express are refused with the option named. The slow run adds a CLI export of a few aliases
through ONNX Runtime (tests/checkpoints/parity.py ``check_case``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from posenc.checkpoints import load_layer, supported_model_types
from posenc.checkpoints.families.llama import ALIASES
from posenc.checkpoints.samples import (
    _ALTERNATING,
    _LFM3,
    _QWEN3_MROPE,
    _QWEN3_VISION,
    _WINDOW,
    ALIAS_SAMPLES,
    NO_SPECIAL_TOKENS,
    TINY,
    Sample,
)
from posenc.errors import ConfigError
from tests.checkpoints.parity import ATOL, Case, block_errors, check_case
from tests.checkpoints.whole_model import model_steps, reference_error

transformers = pytest.importorskip("transformers")
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

_MOE = {"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32}
_GPT_OSS_YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                 "truncate": False, "original_max_position_embeddings": 1024}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Alias:
    """One alias checkpoint: config settings beyond :data:`TINY` and the layers to prove."""

    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    layers: tuple[int, ...] = (1,)
    model_class: str | None = None
    """default: the type's causal-LM class."""

    def sample(self, model_type: str) -> Sample:
        model_class = self.model_class or MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
        settings = {**TINY, **NO_SPECIAL_TOKENS, "head_dim": 16, **self.settings}
        return Sample(model_type, model_type, CONFIG_MAPPING_NAMES[model_type], model_class, settings)


ALIAS_CASES: dict[str, Alias] = {
    "internlm3": Alias({"attention_bias": True, "mlp_bias": True}),
    "iquestcoder": Alias({"attention_bias": True}),
    "arcee": Alias({"attention_bias": True}),
    "aria_text": Alias({"attention_bias": True, "moe_num_experts": 2, "moe_topk": 1}),
    "jais2": Alias({"attention_bias": True}),
    "phimoe": Alias({"attention_bias": True, **_WINDOW, "num_local_experts": 2, "num_experts_per_tok": 1}),
    "ministral": Alias(_WINDOW),
    "nemotron": Alias({"attention_bias": True}),
    "solar_open": Alias({"attention_bias": True, "n_routed_experts": 2, "num_experts_per_tok": 1,
                         "moe_intermediate_size": 32, "first_k_dense_replace": 1}),
    "seed_oss": Alias({"attention_bias": True, "attention_out_bias": False}),
    "starcoder2": Alias({"use_bias": True, **_WINDOW}),
    "qwen2_moe": Alias({**_MOE, "shared_expert_intermediate_size": 32, "use_sliding_window": True, **_WINDOW,
                        "max_window_layers": 2}, layers=(0, 1)),
    "olmo": Alias(),
    "cwm": Alias({**_WINDOW, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                  "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}, layers=(0, 1)),
    "stablelm": Alias(ALIAS_SAMPLES["stablelm"].settings),
    "granite": Alias(ALIAS_SAMPLES["granite"].settings),
    "granitemoe": Alias({"attention_multiplier": 0.13, "num_local_experts": 2, "num_experts_per_tok": 1}),
    "granitemoeshared": Alias({"attention_multiplier": 0.07, "num_local_experts": 2, "num_experts_per_tok": 1,
                               "shared_intermediate_size": 32}),
    "hyperclovax": Alias({"attention_multiplier": 0.09}),
    "qwen3_moe": Alias({**_MOE, "use_sliding_window": True, **_WINDOW}),
    "apertus": Alias(),
    "dots1": Alias({"n_routed_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32,
                    "first_k_dense_replace": 1, "n_shared_experts": 1, **_WINDOW, "max_window_layers": 1},
                   layers=(0, 1)),
    "hy_v3": Alias({"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32}),
    "mellum": Alias({**_WINDOW, "layer_types": ["full_attention", "sliding_attention", "full_attention"],
                     **_MOE}, layers=(0, 1)),
    "glm4_moe": Alias({"use_qk_norm": True, "attention_bias": True, "n_routed_experts": 2, "num_experts_per_tok": 1,
                       "moe_intermediate_size": 32, "first_k_dense_replace": 1}),
    "exaone4": Alias(ALIAS_SAMPLES["exaone4"].settings, layers=(0, 1)),
    "exaone_moe": Alias({**_WINDOW, "sliding_window_pattern": 2, **_MOE}, layers=(0, 1)),
    "kolibri1": Alias({**_WINDOW, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"], **_MOE,
                       "shared_expert_intermediate_size": 32},
                      layers=(0, 1)),
    "smollm3": Alias(ALIAS_SAMPLES["smollm3"].settings, layers=(1, 3)),
    "glm": Alias(ALIAS_SAMPLES["glm"].settings),
    "glm4": Alias(ALIAS_SAMPLES["glm4"].settings),
    "helium": Alias(ALIAS_SAMPLES["helium"].settings),
    "ernie4_5": Alias(ALIAS_SAMPLES["ernie4_5"].settings),
    "ernie4_5_moe": Alias({"use_bias": True, **_MOE, "moe_num_experts": 2, "moe_k": 1}),
    "cohere": Alias(ALIAS_SAMPLES["cohere"].settings),
    "cohere2": Alias(ALIAS_SAMPLES["cohere2"].settings, layers=(0, 1)),
    "vaultgemma": Alias({**_WINDOW, "query_pre_attn_scalar": 24, "attn_logit_softcapping": 30.0},
                        layers=(0, 1)),
    # q/k RMSNorm over the whole projection
    "olmo2": Alias({"attention_bias": True}),
    "olmo3": Alias(ALIAS_SAMPLES["olmo3"].settings, layers=(0, 1)),
    "olmoe": Alias({"num_experts": 2, "num_experts_per_tok": 1}),
    "flex_olmo": Alias({"num_experts": 2, "num_experts_per_tok": 1}),
    "minimax_m2": Alias(ALIAS_SAMPLES["minimax_m2"].settings),
    # attention sinks
    "gpt_oss": Alias({"num_local_experts": 2, "num_experts_per_tok": 1, **_WINDOW, "layer_types": _ALTERNATING,
                      "rope_parameters": _GPT_OSS_YARN}, layers=(0, 1)),
    "granite_swa": Alias(ALIAS_SAMPLES["granite_swa"].settings, layers=(0, 1, 2)),
    "granitemoe_swa": Alias({"attention_multiplier": 0.13, "num_local_experts": 2, "num_experts_per_tok": 1,
                             **_WINDOW, "layer_types": _ALTERNATING}, layers=(0, 1)),
    # output gates
    "qwen3_next": Alias({"attention_bias": True, "layer_types": ["linear_attention", "full_attention",
                                                                 "full_attention"],
                         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                             "partial_rotary_factor": 0.5},
                         **_MOE, "shared_expert_intermediate_size": 32, "linear_num_key_heads": 2,
                         "linear_num_value_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8}),
    "afmoe": Alias(ALIAS_SAMPLES["afmoe"].settings, layers=(0, 1)),
    "laguna": Alias({**_WINDOW, "layer_types": _ALTERNATING, **_MOE, "shared_expert_intermediate_size": 32,
                     "num_attention_heads_per_layer": [4, 2, 4], "gating": True}, layers=(0, 1)),
    "lfm3": Alias(_LFM3, layers=(1, 2)),
    # the query scaled by its position
    "ministral3": Alias({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                             "original_max_position_embeddings": 4, "llama_4_scaling_beta": 0.1,
                                             "beta_fast": 32.0, "beta_slow": 1.0}}),
}  # fmt: skip
"""Every alias posenc registers, with the settings its test checkpoint uses."""


def test_every_alias_has_a_case() -> None:
    assert set(ALIASES) <= set(ALIAS_CASES)
    assert set(ALIAS_CASES) <= set(supported_model_types())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {}


def _checkpoint(model_type: str, checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    if model_type not in checkpoints:
        folder = tmp_path_factory.mktemp(model_type)
        checkpoints[model_type] = ALIAS_CASES[model_type].sample(model_type).build(folder)
    return checkpoints[model_type]


@pytest.mark.parametrize("model_type", sorted(ALIAS_CASES))
def test_alias_layer_is_its_own_module(
    model_type: str, checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = _checkpoint(model_type, checkpoints, tmp_path_factory)
    for layer in ALIAS_CASES[model_type].layers:
        loaded = load_layer(folder, layer)
        assert loaded.model_type == model_type
        errors = block_errors(loaded)
        assert max(errors.values()) <= ATOL, (layer, loaded.plan.scheme, errors)
        steps = model_steps(folder, layer, None, path=f"layers.{layer}.self_attn")
        assert reference_error(loaded.reference(), steps) <= ATOL, layer


QWEN3_VL_MOE = Sample(
    "qwen3-vl-moe", "Qwen3-VL-MoE text attention", "Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration",
    {"text_config": {**TINY, "head_dim": 16, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32,
                     "rope_parameters": _QWEN3_MROPE},
     "vision_config": _QWEN3_VISION},
)  # fmt: skip


def test_qwen3_vl_moe_is_qwen3_vl_text_attention(tmp_path: Path) -> None:
    """Qwen-VL's alias: Qwen3-VL-MoE's text attention is Qwen3-VL's (interleaved M-RoPE, q/k norms)."""
    folder = QWEN3_VL_MOE.build(tmp_path / "ckpt")
    loaded = load_layer(folder, 1)
    assert loaded.family.name == "qwen_vl"
    assert loaded.plan.scheme == "rope_mrope"
    assert max(block_errors(loaded).values()) <= ATOL
    steps = model_steps(folder, 1, None, path="language_model.layers.1.self_attn")
    assert reference_error(loaded.reference(), steps) <= ATOL


_QWEN3_5_TEXT = {**TINY, "head_dim": 16, "layer_types": ["linear_attention", "full_attention", "full_attention"],
                 "rope_parameters": {**_QWEN3_MROPE, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5},
                 "linear_num_key_heads": 2, "linear_num_value_heads": 2, "linear_key_head_dim": 8,
                 "linear_value_head_dim": 8, **NO_SPECIAL_TOKENS}  # fmt: skip
QWEN3_5 = Sample(
    "qwen3-5", "Qwen3.5 text attention", "Qwen3_5Config", "Qwen3_5ForConditionalGeneration",
    {"text_config": _QWEN3_5_TEXT, "vision_config": {**_QWEN3_VISION, "deepstack_visual_indexes": None}},
)  # fmt: skip


def test_qwen3_5_is_a_gated_qwen_vl_text_tower(tmp_path: Path) -> None:
    """Qwen3.5's wrapper loads through its text tower (qwen3_5_text, Qwen-VL family): interleaved M-RoPE on a partial
    rotary, zero-centred q/k norms, a sigmoid gate in q_proj; its Gated DeltaNet layer is refused by name."""
    folder = QWEN3_5.build(tmp_path / "ckpt")
    loaded = load_layer(folder, 1)
    assert (loaded.family.name, loaded.plan.scheme, loaded.plan.attention.output_gate) == (
        "qwen_vl", "rope_mrope", "sigmoid"
    )  # fmt: skip
    assert max(block_errors(loaded).values()) <= ATOL
    steps = model_steps(folder, 1, None, path="language_model.layers.1.self_attn")
    assert reference_error(loaded.reference(), steps) <= ATOL
    with pytest.raises(ConfigError, match=r"layer 0 .* linear-attention .*one of \[1, 2\]"):
        load_layer(folder, 0)


REFUSED: dict[str, dict[str, Any]] = {
    "olmo": {"clip_qkv": 8.0},
    "olmoe": {"clip_qkv": 8.0},
    "stablelm": {"qk_layernorm": True},
    "cohere": {"use_qk_norm": True},
}
"""Alias options the block cannot express (OLMo's and OLMoE's q/k/v clamp, StableLM's and Cohere's per-head
LayerNorms)."""


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_alias_options_posenc_cannot_express_are_refused(model_type: str, tmp_path: Path) -> None:
    ((option, value),) = REFUSED[model_type].items()
    case = ALIAS_CASES[model_type]
    folder = dataclasses.replace(case, settings={**case.settings, option: value}).sample(model_type).build(tmp_path)
    with pytest.raises(
        ConfigError, match=rf"{model_type} {option}={value!r} is not supported.*export the scheme by hand"
    ):
        load_layer(folder, 1)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["granite", "cohere2", "glm4_moe", "smollm3"])
def test_alias_exports_and_matches_its_module_on_onnx_runtime(model_type: str, tmp_path: Path) -> None:
    """The CLI path for aliases of each kind (a scale, interleaved pairs with NoPE layers, partial rotary with q/k
    norms, a NoPE table): export, ONNX Runtime against the module, both table modes, decode, the context's end."""
    case = ALIAS_CASES[model_type]
    folder = case.sample(model_type).build(tmp_path / "ckpt")
    for layer in case.layers:
        assert check_case(Case(folder, layer), tmp_path)


def test_lfm3_gate_is_optional_and_its_conv_layers_are_refused(tmp_path: Path) -> None:
    """LFM3's per-head sigmoid gate (stored as ``gate_proj``, ``g_proj`` in its module) only with
    ``use_attention_gate``; its short-convolution layers are refused by name."""
    case = ALIAS_CASES["lfm3"]
    gated = load_layer(case.sample("lfm3").build(tmp_path / "gated"), 1)
    assert (gated.plan.attention.output_gate, gated.plan.attention.output_gate_per_head) == ("sigmoid", True)
    assert tuple(gated.state["gate_proj.weight"].shape) == (4, 64)
    plain = dataclasses.replace(case, settings={**case.settings, "use_attention_gate": False})
    folder = plain.sample("lfm3").build(tmp_path / "plain")
    loaded = load_layer(folder, 2)
    assert loaded.plan.attention.output_gate == "none"
    assert max(block_errors(loaded).values()) <= ATOL
    with pytest.raises(ConfigError, match=r"layer 0 .* short-convolution layer.*one of \[1, 2\]"):
        load_layer(folder, 0)
