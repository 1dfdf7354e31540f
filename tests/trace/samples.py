"""Tiny seeded checkpoints of model types posenc has no family for, for the traced path's tests.

Each is a :class:`posenc.checkpoints.samples.Sample` (a transformers config class, its settings, the layer to
trace), built with ``save_pretrained`` (sharded, seeded weights plus a seeded perturbation), never downloaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from posenc.checkpoints.samples import NO_SPECIAL_TOKENS, TINY, Sample
from posenc.records import from_json, to_json
from posenc.trace.build import TracePlan, rebuild, trace_record, traced_module
from posenc.trace.record import TraceRecord

LONG = 131072
"""The context of the far-position samples: positions up to 131071, where transformers' float32 angles are
~1e-2 rad off."""
_YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
         "original_max_position_embeddings": 4096}  # fmt: skip
_LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
_LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "original_max_position_embeddings": 4096,
    "short_factor": [1.0 + 0.1 * i for i in range(8)],
    "long_factor": [1.0 + 0.5 * i for i in range(8)],
}
_QWEN3_NEXT = {"num_hidden_layers": 4, "head_dim": 16, "partial_rotary_factor": 0.25, "linear_num_value_heads": 2,
               "linear_num_key_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8, "num_experts": 4,
               "num_experts_per_tok": 2, "moe_intermediate_size": 32,
               "shared_expert_intermediate_size": 32}  # fmt: skip


def _tiny(**settings: Any) -> dict[str, Any]:
    return {**TINY, **NO_SPECIAL_TOKENS, "head_dim": 16, **settings}


def _sample(name: str, model_type: str, title: str, settings: Mapping[str, Any], layer: int | None = 0) -> Sample:
    config, model = _CLASSES[model_type]
    return Sample(name, title, config, model, dict(settings), layer=layer)


_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "phi": ("PhiConfig", "PhiForCausalLM"),
    "roformer": ("RoFormerConfig", "RoFormerForMaskedLM"),
    "mpnet": ("MPNetConfig", "MPNetForMaskedLM"),
    "layoutlmv3": ("LayoutLMv3Config", "LayoutLMv3Model"),
    "beam": ("BeamConfig", "BeamForCausalLM"),
    "xlnet": ("XLNetConfig", "XLNetLMHeadModel"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM"),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM"),
    "ministral3": ("Ministral3Config", "Ministral3ForCausalLM"),
    "granite": ("GraniteConfig", "GraniteForCausalLM"),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM"),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM"),
    "nemotron": ("NemotronConfig", "NemotronForCausalLM"),
    "glm": ("GlmConfig", "GlmForCausalLM"),
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM"),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM"),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM"),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM"),
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM"),
    "apertus": ("ApertusConfig", "ApertusForCausalLM"),
    "persimmon": ("PersimmonConfig", "PersimmonForCausalLM"),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel"),
    "opt": ("OPTConfig", "OPTForCausalLM"),
    "big_bird": ("BigBirdConfig", "BigBirdForMaskedLM"),
    "electra": ("ElectraConfig", "ElectraForMaskedLM"),
    "camembert": ("CamembertConfig", "CamembertForMaskedLM"),
    "bert-generation": ("BertGenerationConfig", "BertGenerationEncoder"),
    "ernie": ("ErnieConfig", "ErnieForMaskedLM"),
    "distilbert": ("DistilBertConfig", "DistilBertForMaskedLM"),
    "layoutlm": ("LayoutLMConfig", "LayoutLMForMaskedLM"),
    "tapas": ("TapasConfig", "TapasForMaskedLM"),
    "roberta-prelayernorm": ("RobertaPreLayerNormConfig", "RobertaPreLayerNormForMaskedLM"),
    "modernbert": ("ModernBertConfig", "ModernBertForMaskedLM"),
    "eurobert": ("EuroBertConfig", "EuroBertForMaskedLM"),
    "siglip_text_model": ("SiglipTextConfig", "SiglipTextModel"),
    "qwen2_vl_text": ("Qwen2VLTextConfig", "Qwen2VLTextModel"),
    "qwen2_5_vl_text": ("Qwen2_5_VLTextConfig", "Qwen2_5_VLTextModel"),
    "qwen3_vl_text": ("Qwen3VLTextConfig", "Qwen3VLTextModel"),
    "qwen3_vl_moe_text": ("Qwen3VLMoeTextConfig", "Qwen3VLMoeTextModel"),
    "qwen2_5_omni_text": ("Qwen2_5OmniTextConfig", "Qwen2_5OmniThinkerTextModel"),
    "qwen3_omni_moe_text": ("Qwen3OmniMoeTextConfig", "Qwen3OmniMoeThinkerTextModel"),
    "cosmos3_edge_text": ("Cosmos3EdgeTextConfig", "Cosmos3EdgeTextModel"),
    "glm4v_text": ("Glm4vTextConfig", "Glm4vTextModel"),
    "glm4v_moe_text": ("Glm4vMoeTextConfig", "Glm4vMoeTextModel"),
    "glm_image_text": ("GlmImageTextConfig", "GlmImageTextModel"),
    "glm_ocr_text": ("GlmOcrTextConfig", "GlmOcrTextModel"),
    "paddleocr_vl_text": ("PaddleOCRTextConfig", "PaddleOCRTextModel"),
    "ernie4_5_vl_moe_text": ("Ernie4_5_VLMoeTextConfig", "Ernie4_5_VLMoeTextModel"),
    "modernbert-decoder": ("ModernBertDecoderConfig", "ModernBertDecoderForCausalLM"),
    "gemma4_text": ("Gemma4TextConfig", "Gemma4ForCausalLM"),
    "visual_bert": ("VisualBertConfig", "VisualBertModel"),
    "lfm3": ("Lfm3Config", "Lfm3ForCausalLM"),
    "openai-gpt": ("OpenAIGPTConfig", "OpenAIGPTLMHeadModel"),
    "gpt_neo": ("GPTNeoConfig", "GPTNeoForCausalLM"),
    "xglm": ("XGLMConfig", "XGLMForCausalLM"),
}
_GPT2 = {"n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 1024, "vocab_size": 96, **NO_SPECIAL_TOKENS}
_OPT = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "ffn_dim": 64, "word_embed_proj_dim": 64,
        "max_position_embeddings": 1024, "vocab_size": 96, **NO_SPECIAL_TOKENS}  # fmt: skip

SAMPLES: dict[str, Sample] = {
    s.name: s
    for s in (
        _sample("llama", "llama", "Llama convention (also a posenc family: traced vs family)", _tiny()),
        _sample(
            "phi",
            "phi",
            "partial rotary 0.5, biases, dense naming",
            _tiny(num_key_value_heads=4, partial_rotary_factor=0.5),
        ),
        _sample("olmo2", "olmo2", "q/k RMSNorm over the whole projection", _tiny()),
        _sample(
            "gpt_oss",
            "gpt_oss",
            "YaRN, learned sinks, sliding/full layers",
            _tiny(num_local_experts=4, num_experts_per_tok=2, sliding_window=4, rope_parameters=_YARN),
        ),
        _sample(
            "qwen3_next",
            "qwen3_next",
            "output gate, partial 0.25, linear-attention hybrid",
            _tiny(**_QWEN3_NEXT),
            layer=3,
        ),
        _sample(
            "cohere2", "cohere2", "interleaved RoPE on sliding layers", _tiny(num_hidden_layers=4, sliding_window=4)
        ),
        _sample(
            "cohere2-full",
            "cohere2",
            "a NoPE full-attention layer",
            _tiny(num_hidden_layers=4, sliding_window=4),
            layer=3,
        ),
        _sample("ministral3", "ministral3", "YaRN with a position-dependent q scale (llama_4_scaling)", _tiny()),
        _sample("granite", "granite", "attention multiplier", _tiny()),
        _sample("starcoder2", "starcoder2", "biases, sliding window", _tiny(sliding_window=4)),
        _sample("stablelm", "stablelm", "partial 0.25", _tiny(num_key_value_heads=4, partial_rotary_factor=0.25)),
        _sample("nemotron", "nemotron", "partial 0.5", _tiny(partial_rotary_factor=0.5)),
        _sample("glm", "glm", "interleaved, partial 0.5", _tiny()),
        _sample("ernie4_5", "ernie4_5", "interleaved", _tiny()),
        _sample("exaone4", "exaone4", "q/k norm, RoPE on sliding layers", _tiny()),
        _sample("smollm3", "smollm3", "NoPE every 4th layer", _tiny()),
        _sample("olmo3", "olmo3", "q/k norm, sliding layers", _tiny(sliding_window=4)),
        _sample("seed_oss", "seed_oss", "biases", _tiny()),
        _sample("apertus", "apertus", "llama3 RoPE, q/k norm", _tiny(rope_parameters=_LLAMA3)),
        _sample("persimmon", "persimmon", "fused qkv, partial 0.5, q/k LayerNorm", _tiny(num_key_value_heads=4)),
        _sample("gpt2", "gpt2", "learned positions at the embeddings: embedding step + first attention", _GPT2),
        _sample("opt", "opt", "learned positions with OPT's offset 2: embedding step + first attention", _OPT),
    )
}
"""Model types posenc has no family for (and Llama, which it has, to compare the two paths)."""

_ENCODER = {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 96, "max_position_embeddings": 128, **NO_SPECIAL_TOKENS}  # fmt: skip

_TINY_VOCAB = {"vocab_size": 96, **NO_SPECIAL_TOKENS}
_MODERNBERT_TOKENS = {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, "cls_token_id": 2, "sep_token_id": 1}

ENCODERS: dict[str, Sample] = {
    s.name: s
    for s in (
        _sample(
            "big_bird",
            "big_bird",
            "full attention, token types, LayerNorm at the embeddings",
            {**_ENCODER, "attention_type": "original_full"},
        ),
        _sample("electra", "electra", "BERT-like embeddings module", {**_ENCODER, "embedding_size": 64}),
        _sample("camembert", "camembert", "RoBERTa-like, token types", {**_ENCODER, "pad_token_id": 1}),
        _sample("bert-generation", "bert-generation", "no token types", _ENCODER),
        _sample("ernie", "ernie", "task type embeddings off", _ENCODER),
        _sample("layoutlm", "layoutlm", "zero boxes at the embeddings, a [B, 1, 1, K] padding mask", _ENCODER),
        _sample("tapas", "tapas", "seven token type tables", _ENCODER),
        _sample("roberta-prelayernorm", "roberta-prelayernorm", "a pre-norm encoder", {**_ENCODER, "pad_token_id": 1}),
        _sample(
            "modernbert",
            "modernbert",
            "RoPE, a local (sliding window) bidirectional layer",
            {**_ENCODER, "num_hidden_layers": 3, "local_attention": 4, **_MODERNBERT_TOKENS},
            layer=1,
        ),
        _sample("eurobert", "eurobert", "RoPE, bidirectional", {**_ENCODER, "num_key_value_heads": 4}),
        _sample(
            "siglip_text_model",
            "siglip_text_model",
            "a text tower AutoModel does not build (its architectures class does)",
            {**_ENCODER, "max_position_embeddings": 64},
        ),
        _sample(
            "distilbert",
            "distilbert",
            "embeddings called positionally, no token types",
            {"dim": 64, "n_heads": 4, "n_layers": 2, "hidden_dim": 64, "max_position_embeddings": 128, **_TINY_VOCAB},
        ),
    )
}
"""Encoders posenc has no family for: their attention is called without a KV cache, their positions enter at the
embeddings module (the unit: the embeddings module fed the token embeddings, and layer 0's attention)."""

FAR: dict[str, Sample] = {
    s.name: s
    for s in (
        _sample("half", "llama", "half layout", _tiny(max_position_embeddings=LONG)),
        _sample("llama3", "llama", "llama3 angles", _tiny(max_position_embeddings=LONG, rope_parameters=_LLAMA3)),
        _sample(
            "interleaved",
            "cohere2",
            "interleaved layout",
            _tiny(max_position_embeddings=LONG, num_hidden_layers=4, sliding_window=4),
        ),
        _sample(
            "partial",
            "phi",
            "partial rotary",
            _tiny(max_position_embeddings=LONG, num_key_value_heads=4, partial_rotary_factor=0.5),
        ),
        _sample(
            "yarn",
            "gpt_oss",
            "YaRN angles",
            _tiny(
                max_position_embeddings=LONG,
                num_local_experts=4,
                num_experts_per_tok=2,
                sliding_window=4,
                rope_parameters={**_YARN, "factor": 32.0},
            ),
            layer=1,
        ),
        _sample(
            "longrope",
            "phi3",
            "LongRoPE angles (short and long factors)",
            _tiny(max_position_embeddings=LONG, num_key_value_heads=4, rope_parameters=_LONGROPE),
        ),
    )
}
"""Samples with a 131072-position context, one per angle rule or layout the rewrite must get right far out."""


def _mrope(section: list[int], theta: float = 1e6, **extra: Any) -> dict[str, Any]:
    return {"rope_type": "default", "rope_theta": theta, "mrope_section": section, **extra}


_MOE = {"moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2}
SECTIONS: dict[str, Sample] = {
    s.name: s
    for s in (
        _sample(
            "qwen2_vl_text", "qwen2_vl_text", "M-RoPE in chunks, q/k/v biases", _tiny(rope_parameters=_mrope([2, 3, 3]))
        ),
        _sample("qwen2_5_vl_text", "qwen2_5_vl_text", "M-RoPE in chunks", _tiny(rope_parameters=_mrope([2, 3, 3]))),
        _sample(
            "qwen3_vl_text", "qwen3_vl_text", "M-RoPE interleaved, q/k norm", _tiny(rope_parameters=_mrope([3, 3, 2]))
        ),
        _sample(
            "qwen3_vl_moe_text",
            "qwen3_vl_moe_text",
            "M-RoPE interleaved, experts",
            _tiny(rope_parameters=_mrope([3, 3, 2]), **_MOE),
        ),
        _sample(
            "qwen2_5_omni_text",
            "qwen2_5_omni_text",
            "the omni thinker's M-RoPE",
            _tiny(rope_parameters=_mrope([2, 3, 3])),
        ),
        _sample(
            "qwen3_omni_moe_text",
            "qwen3_omni_moe_text",
            "the omni thinker's interleaved M-RoPE, experts",
            _tiny(rope_parameters=_mrope([3, 3, 2]), **_MOE),
        ),
        _sample(
            "cosmos3_edge_text", "cosmos3_edge_text", "M-RoPE, theta 1e8", _tiny(rope_parameters=_mrope([3, 3, 2], 1e8))
        ),
        _sample("glm4v_text", "glm4v_text", "M-RoPE interleaved pairs", _tiny(rope_parameters=_mrope([2, 3, 3], 1e4))),
        _sample(
            "glm4v_moe_text",
            "glm4v_moe_text",
            "M-RoPE, partial 0.5, the attention takes the rows too",
            _tiny(
                rope_parameters=_mrope([1, 2, 1], 1e4, partial_rotary_factor=0.5),
                n_routed_experts=4,
                moe_intermediate_size=32,
                first_k_dense_replace=1,
            ),
        ),
        _sample(
            "glm_image_text", "glm_image_text", "M-RoPE", _tiny(rope_parameters=_mrope([2, 3, 3], 1e4), pad_token_id=0)
        ),
        _sample(
            "glm_ocr_text", "glm_ocr_text", "M-RoPE interleaved pairs", _tiny(rope_parameters=_mrope([2, 3, 3], 1e4))
        ),
        _sample(
            "paddleocr_vl_text",
            "paddleocr_vl_text",
            "M-RoPE (keyword rows)",
            _tiny(rope_parameters=_mrope([2, 3, 3], 5e5)),
        ),
        _sample(
            "ernie4_5_vl_moe_text",
            "ernie4_5_vl_moe_text",
            "M-RoPE interleaved pairs, the attention takes the rows too",
            _tiny(
                rope_parameters=_mrope([3, 3, 2], 5e5),
                num_hidden_layers=2,
                mlp_layer_types=["dense", "sparse"],
                moe_num_experts=4,
                moe_intermediate_size=[32, 32],
            ),
        ),
    )
}
"""Text towers of vision-language models whose rotary module (or attention) takes multi-axis position ids
``[3, B, S]``: the traced unit serves text, every row the token's position."""

_LFM3 = _tiny(num_hidden_layers=5, sliding_window=8, pad_token_id=0, bos_token_id=1, eos_token_id=1,
              layer_types=["conv", "conv", "full_attention", "conv", "sliding_attention"])  # fmt: skip
ROTARY_PER_TYPE: dict[str, Sample] = {
    s.name: s
    for s in (
        _sample(
            "modernbert-decoder",
            "modernbert-decoder",
            "one rotary module called per layer type (global and local theta)",
            {
                **_ENCODER,
                "num_hidden_layers": 3,
                "local_attention": 4,
                "global_attn_every_n_layers": 3,
                **_MODERNBERT_TOKENS,
            },
            layer=1,
        ),
        _sample("lfm3", "lfm3", "per-type rotary; an output gate saved as gate_proj, g_proj in memory", _LFM3, 4),
        _sample("lfm3-full", "lfm3", "the same, a full layer with proportional partial RoPE", _LFM3, 2),
    )
}
"""Models whose rotary module runs once per layer type; a sliding layer reads the second call's cos/sin."""

_GEMMA4 = _tiny(global_head_dim=16, vocab_size_per_layer_input=96, hidden_size_per_layer_input=16, num_hidden_layers=6,
                sliding_window=8, layer_types=["sliding_attention"] * 5 + ["full_attention"], pad_token_id=0,
                bos_token_id=1, eos_token_id=1)  # fmt: skip
OTHER_ARGUMENTS: dict[str, Sample] = {
    s.name: s
    for s in (
        _sample(
            "gemma4_text", "gemma4_text", "keys and values shared between layers (a dict the layer writes)", _GEMMA4
        ),
        _sample(
            "gemma4_text-full",
            "gemma4_text",
            "the same, a full-attention layer with proportional partial RoPE",
            _GEMMA4,
            layer=5,
        ),
        _sample("visual_bert", "visual_bert", "the mask passed positionally ([B, 1, 1, K])", _ENCODER),
    )
}
"""Models whose attention takes another argument posenc rebuilds: Gemma 4's ``shared_kv_states``, a positional
mask."""

_BEAM = {"hidden_size": 64, "intermediate_size": 64, "moe_intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 4, "sliding_window": 8,
         "layer_types": ["sliding_attention", "full_attention"], "mlp_layer_types": ["dense", "dense"],
         **_TINY_VOCAB}  # fmt: skip
DERIVED: dict[str, Sample] = {
    s.name: s
    for s in (
        _sample("roformer", "roformer", "sin/cos of the positions computed once per stack by a module", _ENCODER),
        _sample("mpnet", "mpnet", "T5's bucketed bias computed once per stack by the encoder's method", _ENCODER),
        _sample("beam", "beam", "a NoPE layer's query scale computed from the positions by a function", _BEAM, 1),
        _sample(
            "layoutlmv3",
            "layoutlmv3",
            "a 1-D relative bias from the positions, computed by an encoder method that indexes a child's weight",
            {
                **_ENCODER,
                "coordinate_size": 8,
                "shape_size": 16,
                "has_spatial_attention_bias": False,
                "visual_embed": False,
                "max_2d_position_embeddings": 64,
            },
        ),
    )
}
_XLNET = {"d_model": 64, "n_layer": 2, "n_head": 4, "d_head": 16, "d_inner": 64, "vocab_size": 96, "pad_token_id": 5}
TIME_MAJOR = _sample("xlnet", "xlnet", "two-stream attention fed time-major hidden states [S, B, E]", _XLNET)
"""A model whose attention takes time-major hidden states (the unit transposes around it: posenc.trace.orders)."""
"""Models whose attention takes a positional tensor its stack computes from the sequence before the layers (RoFormer's
``sinusoidal_pos``, MPNet's ``position_bias``, Beam's ``attention_scaling``, LayoutLMv3's ``rel_pos`` without its 2-D
bias from the boxes): the unit calls the model's own code for it."""

_GPT_NEO = {"hidden_size": 64, "num_heads": 4, "num_layers": 2, "attention_types": [[["global", "local"], 1]],
            "window_size": 4, "max_position_embeddings": 512, **_TINY_VOCAB}  # fmt: skip
BOUNDED: dict[str, Sample] = {
    s.name: s
    for s in (
        _sample(
            "openai-gpt",
            "openai-gpt",
            "a causal buffer [L, L] sliced by the length (S <= L - 1)",
            {"n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 512, **_TINY_VOCAB},
        ),
        _sample("gpt_neo", "gpt_neo", "a causal buffer sliced by past and length", _GPT_NEO),
        _sample("gpt_neo-local", "gpt_neo", "the same on a local layer (no position table in the unit)", _GPT_NEO, 1),
        _sample(
            "xglm",
            "xglm",
            "a sinusoidal table; scores clamped at a default-dtype constant",
            {
                "d_model": 64,
                "attention_heads": 4,
                "num_layers": 2,
                "ffn_dim": 64,
                "max_position_embeddings": 512,
                **_TINY_VOCAB,
            },
        ),
    )
}
"""Models whose traced module torch.export exports only with bounded lengths (read a buffer of the context's size)."""


def build(sample: Sample, root: Path) -> Path:
    """The sample's checkpoint folder under ``root`` (built once per folder)."""
    folder = root / sample.name
    if not (folder / "config.json").exists():
        sample.build(folder)
    return folder


def unit_and_rebuilt(plan: TracePlan) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The plan's traced unit (float32) and the same unit rebuilt from its manifest record (through JSON), holding
    the unit's weights: both must give the model's own output."""
    unit = traced_module(plan)
    record = from_json(TraceRecord, to_json(trace_record(plan, ())))
    again = rebuild(record, None, None, torch.float32)
    again.load_state_dict(unit.state_dict())
    return unit, again


__all__ = [
    "BOUNDED",
    "DERIVED",
    "ENCODERS",
    "FAR",
    "LONG",
    "OTHER_ARGUMENTS",
    "ROTARY_PER_TYPE",
    "SAMPLES",
    "SECTIONS",
    "TIME_MAJOR",
    "build",
    "unit_and_rebuilt",
]
