"""Tiny seeded checkpoints of every supported family, built locally with transformers (never downloaded).

Each :class:`Sample` names a transformers config class, its settings, a model class and the layer to prove. The
test suite, the README and ``posenc demo``'s real-checkpoint section build them with :meth:`Sample.build`
(``save_pretrained`` into a folder, sharded), so each family is shown on a checkpoint with the layout real ones
have. Weights are the model's own initialisation plus a small seeded perturbation of every floating tensor, so a
missing bias or norm cannot hide behind a zero or a one.

Command line (a checkpoint to try posenc on)::

    python -m posenc.checkpoints.samples llama ckpt/        # or any name of `python -m ... --list`
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from posenc.checkpoints.reference import import_transformers
from posenc.errors import ConfigError
from posenc.schemes.base import TableMode

TINY: Mapping[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 96,
    "max_position_embeddings": 32768,
}
"""Decoder geometry: head_dim 16, grouped-query 4/2 heads, a long context (positions near it show transformers'
own float32 angle error)."""
NO_SPECIAL_TOKENS: Mapping[str, Any] = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
"""For configs whose default token ids exceed the tiny vocabulary."""


@dataclasses.dataclass(frozen=True)
class Sample:
    """A tiny checkpoint recipe and the layer it proves.

    Attributes:
        name: short name (``llama``, ``t5-decoder``, ...).
        title: what it shows.
        config_class, model_class: transformers class names.
        settings: config keyword arguments.
        layer, layer_type: the layer to export (``layer=None``: the first of ``layer_type``).
        table_modes: table modes its scheme has.
        long: check positions near the context length (False for learned tables, which end there anyway).
    """

    name: str
    title: str
    config_class: str
    model_class: str
    settings: Mapping[str, Any]
    layer: int | None = 0
    layer_type: str | None = None
    table_modes: tuple[str, ...] = tuple(mode.value for mode in TableMode)
    long: bool = True

    def with_settings(self, **overrides: Any) -> Sample:
        """This sample with some config settings changed (e.g. an option posenc must refuse)."""
        return dataclasses.replace(self, settings={**self.settings, **overrides})

    def config(self) -> Any:
        transformers = import_transformers()
        return getattr(transformers, self.config_class)(**self.settings)

    def build(self, folder: str | Path, *, seed: int = 0, shard: str | None = "40KB") -> Path:
        """Save the seeded checkpoint into ``folder`` (sharded at ``shard``; None: one file); returns ``folder``."""
        save_seeded(getattr(import_transformers(), self.model_class), self.config(), folder, seed=seed, shard=shard)
        return Path(folder)


def save_seeded(model_class: Any, config: Any, folder: str | Path, *, seed: int = 0, shard: str | None = None) -> Any:
    """``save_pretrained`` of ``model_class(config)`` into ``folder``: the model's own initialisation under
    ``seed`` plus a seeded perturbation (0.05 N(0, 1)) of every floating tensor; sharded at ``shard`` (None: one
    file). Returns the model (eval mode)."""
    transformers = import_transformers()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(0.05 * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype))
    transformers.utils.logging.disable_progress_bar()  # no "Writing model shards" bars on stderr
    if shard is None:
        model.save_pretrained(Path(folder))
    else:
        model.save_pretrained(Path(folder), max_shard_size=shard)
    return model


def _decoder(**settings: Any) -> dict[str, Any]:
    return {**TINY, **settings}


_T5 = {"d_model": 64, "d_kv": 16, "d_ff": 64, "num_layers": 2, "num_decoder_layers": 3, "num_heads": 4,
       "vocab_size": 96, "relative_attention_num_buckets": 8, "relative_attention_max_distance": 20}  # fmt: skip
_GEMMA3_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 4.0},
}
_LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 4096}  # fmt: skip
_PHI3_ROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
              "original_max_position_embeddings": 4096, "short_factor": [1.0 + 0.1 * i for i in range(6)],
              "long_factor": [1.0 + 2.0 * i for i in range(6)]}  # fmt: skip
_GEMMA = {"head_dim": 16, "num_hidden_layers": 4}
_ENCODER = {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 96}  # fmt: skip
_DEBERTA_V2 = {**_ENCODER, "max_position_embeddings": 256, "relative_attention": True}
_ROBERTA = {**_ENCODER, "max_position_embeddings": 82, "pad_token_id": 1}
_SEQ2SEQ = {"encoder_layers": 2, "decoder_layers": 2, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32, "vocab_size": 96}
_MARIAN = {
    **_SEQ2SEQ,
    "d_model": 45,
    "encoder_attention_heads": 3,
    "decoder_attention_heads": 3,
    "max_position_embeddings": 2048,
    "pad_token_id": 0,
    "decoder_start_token_id": 0,
    "scale_embedding": True,
}
"""Odd width 45 = 3 heads of 15: Marian's sinusoidal table with one more sine than cosines."""  # fmt: skip
_BART = {**_SEQ2SEQ, "d_model": 64, "encoder_attention_heads": 4, "decoder_attention_heads": 2,
         "max_position_embeddings": 96}  # fmt: skip
_FALCON = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 96, "bos_token_id": None, "eos_token_id": None}
_ALIBI_HEADS = 8
"""ALiBi layers use 8 heads of 8 (slopes 2^-1 .. 2^-8)."""
_PRECOMPUTED = ("precomputed",)
"""Learned tables have no dynamic mode."""
_GEMMA23 = {**_GEMMA, "sliding_window": 5, "query_pre_attn_scalar": 24}

_MROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}
"""Qwen2-VL's chunked M-RoPE with head_dim 16: 8 slots, 2 temporal, 3 height, 3 width (Qwen's 16/24/24 of 64)."""
_QWEN_VISION = {"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 1, "patch_size": 4,
                "spatial_merge_size": 2}  # fmt: skip
_QWEN3_VISION = {"depth": 1, "hidden_size": 32, "out_hidden_size": 64, "num_heads": 2, "intermediate_size": 32,
                 "patch_size": 4, "deepstack_visual_indexes": [0]}  # fmt: skip
_QWEN3_MROPE = {"rope_type": "default", "rope_theta": 5e5, "mrope_section": [4, 2, 2], "mrope_interleaved": True}
_GPT_OSS = {**TINY, "head_dim": 16, "num_local_experts": 2, "num_experts_per_tok": 1, "sliding_window": 4,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                                "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 1024},
            **NO_SPECIAL_TOKENS}  # fmt: skip
_QWEN3_NEXT = {**TINY, "head_dim": 16, "attention_bias": True,
               "layer_types": ["linear_attention", "full_attention", "full_attention"],
               "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
               "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32,
               "shared_expert_intermediate_size": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 2,
               "linear_key_head_dim": 8, "linear_value_head_dim": 8, **NO_SPECIAL_TOKENS}  # fmt: skip
_MINISTRAL3_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 4,
                    "llama_4_scaling_beta": 0.1, "beta_fast": 32.0, "beta_slow": 1.0}  # fmt: skip
_PARTIAL_HALF = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
_DEEPSEEK = {**TINY, "num_hidden_layers": 2, "num_key_value_heads": 4, "moe_intermediate_size": 32,
             "n_routed_experts": 2, "n_shared_experts": 1, "num_experts_per_tok": 1, "first_k_dense_replace": 1,
             "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12,
             **NO_SPECIAL_TOKENS}  # fmt: skip
_DEEPSEEK_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8192,
                  "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}  # fmt: skip
"""DeepSeek-V2-Lite's rope scaling (factor 40, original 4096 there) at a tiny scale: the softmax scale carries
mscale(4, 0.707)², the cos/sin mscale(4, 0.707) / mscale(4, 0.707) = 1."""
_LLAMA4 = {**TINY, "num_hidden_layers": 4, "head_dim": 16, "intermediate_size_mlp": 64, "num_local_experts": 2,
           "attention_chunk_size": 8, "floor_scale": 4, "attn_scale": 0.1, **NO_SPECIAL_TOKENS,
           "rope_parameters": {**_LLAMA3, "original_max_position_embeddings": 8192}}  # fmt: skip
"""Layers 0-2 RoPE (chunks of 8 tokens, L2 q/k norm), layer 3 NoPE; floor_scale 4 so the temperature changes
every 4 positions of a short feed (8192 in the released models)."""
_NTK_ALPHA = {"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0}
"""HunYuan labels NTK-α "dynamic" with an alpha (HunYuan-A13B: alpha 1000)."""
_HUNYUAN = {**TINY, "head_dim": 16, **NO_SPECIAL_TOKENS, "rope_parameters": _NTK_ALPHA}
_LFM3 = {**TINY, "head_dim": 16, "sliding_window": 4, "layer_types": ["conv", "sliding_attention", "full_attention"],
         "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "proportional", "rope_theta": 1e6,
                                                "partial_rotary_factor": 0.5}}, **NO_SPECIAL_TOKENS}  # fmt: skip
"""LFM3's layer pattern shortened (a convolution layer, a sliding layer, a full layer) with its RoPE per kind."""
_MODERNBERT = {**_ENCODER, "num_hidden_layers": 3, "max_position_embeddings": 32768, "attention_bias": True,
               "local_attention": 4, "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
               "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 160000.0},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
               "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1,
               "sep_token_id": 2}  # fmt: skip
"""ModernBERT-base's pattern (a global layer, then two local ones) and RoPE thetas; local_attention 4 (±2 tokens;
128 in the released models) so a 7-token feed crosses the window."""
_GEMMA4 = {**TINY, "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": 1, "attention_k_eq_v": True,
           "sliding_window": 4, "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
           "vocab_size_per_layer_input": 96, "hidden_size_per_layer_input": 16, "pad_token_id": 0,
           "bos_token_id": 1, "eos_token_id": 1}  # fmt: skip
"""Gemma 4's pattern shortened (two sliding layers, then a full one) with its default RoPE per kind (proportional,
0.25, theta 1e6 on the full layer: 4 of its 16 pairs rotate); the full layer 32 wide with one kv head whose values are
its keys (``attention_k_eq_v``, as the 31B model), the sliding layers 16 wide with two; window 4."""

_MIMO_ROPE = {"rope_type": "default", "partial_rotary_factor": 0.334}
_MIMO = {**TINY, "num_hidden_layers": 2, "num_key_value_heads": 1, "head_dim": 24, "v_head_dim": 16,
         "attention_bias": True, "sliding_window": 4, "layer_types": ["full_attention", "sliding_attention"],
         "rope_parameters": {"full_attention": {**_MIMO_ROPE, "rope_theta": 5e6},
                             "sliding_attention": {**_MIMO_ROPE, "rope_theta": 10000.0}},
         "moe_intermediate_size": 32, "n_routed_experts": 2, "num_experts_per_tok": 1,
         **NO_SPECIAL_TOKENS}  # fmt: skip
"""MiMo-V2-Flash's pattern shortened (a full layer, then a sliding one) with its RoPE per kind (0.334 of 24-wide heads:
8 features rotate, as 64 of 192 in the released model), values 16 wide (128 of 192 there), one kv head on the full layer
and two on the sliding one (4 and 8 there), sinks on the sliding layer, q/k/v biases, window 4 (129 there)."""

SAMPLES: dict[str, Sample] = {
    sample.name: sample
    for sample in (
        Sample("llama", "Llama", "LlamaConfig", "LlamaForCausalLM", _decoder(), layer=1),
        Sample(
            "llama3-scaling", "Llama 3 frequency bands", "LlamaConfig", "LlamaForCausalLM",
            _decoder(rope_parameters=_LLAMA3), layer=2,
        ),
        Sample("llama-attention-bias", "Llama with q/k/v/o biases", "LlamaConfig", "LlamaForCausalLM",
               _decoder(attention_bias=True)),
        Sample(
            "qwen2-yarn", "Qwen2: q/k/v biases, YaRN", "Qwen2Config", "Qwen2ForCausalLM",
            _decoder(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                      "original_max_position_embeddings": 8192}),
        ),
        Sample("qwen3", "Qwen3: per-head q/k RMSNorm", "Qwen3Config", "Qwen3ForCausalLM", _decoder(head_dim=16),
               layer=1),
        Sample("mistral-window", "Mistral: sliding window", "MistralConfig", "MistralForCausalLM",
               _decoder(sliding_window=6), layer=2),
        Sample("gemma", "Gemma", "GemmaConfig", "GemmaForCausalLM", _decoder(**_GEMMA), layer=1),
        Sample("gemma2-softcap", "Gemma 2: soft-cap, sliding layer", "Gemma2Config", "Gemma2ForCausalLM",
               _decoder(**_GEMMA23)),
        Sample("gemma2-full", "Gemma 2: full-attention layer", "Gemma2Config", "Gemma2ForCausalLM",
               _decoder(**_GEMMA23), layer=1),
        Sample(
            "gemma3-sliding", "Gemma 3: q/k norms, sliding layer, local RoPE", "Gemma3TextConfig",
            "Gemma3ForCausalLM", _decoder(**_GEMMA23, sliding_window_pattern=2, rope_parameters=_GEMMA3_ROPE),
            layer=None, layer_type="sliding_attention",
        ),
        Sample(
            "gemma3-full", "Gemma 3: full layer, linear-scaled global RoPE", "Gemma3TextConfig",
            "Gemma3ForCausalLM", _decoder(**_GEMMA23, sliding_window_pattern=2, rope_parameters=_GEMMA3_ROPE),
            layer=None, layer_type="full_attention",
        ),
        Sample(
            "phi3-longrope", "Phi-3: fused qkv, LongRoPE, partial rotary", "Phi3Config", "Phi3ForCausalLM",
            _decoder(rope_parameters=_PHI3_ROPE, **NO_SPECIAL_TOKENS), layer=1,
        ),
        Sample(
            "gptj", "GPT-J: interleaved partial RoPE", "GPTJConfig", "GPTJForCausalLM",
            {"n_embd": 64, "n_head": 4, "n_layer": 2, "rotary_dim": 8, "vocab_size": 96, "n_positions": 32768,
             "bos_token_id": None, "eos_token_id": None}, layer=1,
        ),
        Sample("t5-encoder", "T5 encoder: bidirectional buckets", "T5Config", "T5ForConditionalGeneration", _T5,
               layer=1, layer_type="encoder"),
        Sample("t5-decoder", "T5 decoder: causal buckets, layer 0's table", "T5Config",
               "T5ForConditionalGeneration", _T5, layer=2, layer_type="decoder"),
        Sample(
            "gpt-neox", "GPT-NeoX: per-head fused qkv, partial rotary, biases", "GPTNeoXConfig", "GPTNeoXForCausalLM",
            {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 64,
             "vocab_size": 96, "max_position_embeddings": 32768,
             "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
            layer=1,
        ),
        Sample(
            "falcon-new-arch-rope", "Falcon new decoder architecture: grouped fused qkv, RoPE", "FalconConfig",
            "FalconForCausalLM",
            {**_FALCON, "num_attention_heads": 4, "num_kv_heads": 2, "new_decoder_architecture": True,
             "max_position_embeddings": 32768}, layer=1,
        ),
        Sample(
            "falcon-multi-query-rope", "Falcon multi-query: one kv head, RoPE", "FalconConfig", "FalconForCausalLM",
            {**_FALCON, "num_attention_heads": 4, "multi_query": True, "max_position_embeddings": 32768},
        ),
        Sample(
            "falcon-alibi-bias", "Falcon: ALiBi scaled with the scores, bf16 slopes, biases", "FalconConfig",
            "FalconForCausalLM",
            {**_FALCON, "num_attention_heads": _ALIBI_HEADS, "multi_query": False, "alibi": True, "bias": True},
            layer=1,
        ),
        Sample(
            "falcon-new-arch-alibi", "Falcon new architecture with ALiBi", "FalconConfig", "FalconForCausalLM",
            {**_FALCON, "num_attention_heads": _ALIBI_HEADS, "num_kv_heads": 2, "new_decoder_architecture": True,
             "alibi": True},
        ),
        Sample("bloom", "BLOOM: fused qkv, ALiBi added unscaled, biases", "BloomConfig", "BloomForCausalLM",
               {"hidden_size": 64, "n_head": _ALIBI_HEADS, "n_layer": 2, "vocab_size": 96}, layer=1),
        Sample("mpt", "MPT: fused Wqkv, ALiBi with 6 heads (not a power of two)", "MptConfig", "MptForCausalLM",
               {"d_model": 48, "n_heads": 6, "n_layers": 2, "vocab_size": 96, "max_seq_len": 2048}, layer=1),
        Sample(
            "deberta-v2-shared", "DeBERTa-v3 style: shared keys, c2p+p2c, log buckets, rel LayerNorm",
            "DebertaV2Config", "DebertaV2ForMaskedLM",
            {**_DEBERTA_V2, "pos_att_type": "p2c|c2p", "share_att_key": True, "position_buckets": 8,
             "max_relative_positions": 16, "norm_rel_ebd": "layer_norm", "position_biased_input": False}, layer=1,
        ),
        Sample(
            "deberta-v2-c2p", "DeBERTa-v2: c2p only, own projection, clipped", "DebertaV2Config",
            "DebertaV2ForMaskedLM",
            {**_DEBERTA_V2, "pos_att_type": "c2p", "share_att_key": False, "max_relative_positions": 4},
        ),
        Sample(
            "deberta-v1", "DeBERTa v1: fused in_proj", "DebertaConfig", "DebertaModel",
            {**_ENCODER, "max_position_embeddings": 128, "relative_attention": True, "pos_att_type": "c2p|p2c",
             "max_relative_positions": 5}, layer=1,
        ),
        Sample("bert", "BERT: embedding step (token type, LayerNorm) + attention", "BertConfig", "BertForMaskedLM",
               {**_ENCODER, "max_position_embeddings": 80}, table_modes=_PRECOMPUTED),
        Sample("roberta", "RoBERTa: padding offset", "RobertaConfig", "RobertaForMaskedLM",
               {**_ROBERTA, "type_vocab_size": 1}, table_modes=_PRECOMPUTED),
        Sample("xlm-roberta-decoder", "XLM-RoBERTa as a causal decoder with a cache", "XLMRobertaConfig",
               "XLMRobertaForCausalLM", {**_ROBERTA, "is_decoder": True}, table_modes=_PRECOMPUTED),
        Sample("marian-encoder", "Marian encoder: odd-width sinusoidal", "MarianConfig", "MarianMTModel", _MARIAN,
               layer_type="encoder"),
        Sample("marian-decoder", "Marian decoder: sinusoidal, cache", "MarianConfig", "MarianMTModel", _MARIAN,
               layer_type="decoder"),
        Sample("bart-encoder", "BART encoder: learned offset 2, layernorm_embedding", "BartConfig",
               "BartForConditionalGeneration", _BART, layer_type="encoder", table_modes=_PRECOMPUTED),
        Sample("bart-decoder", "BART decoder: cache", "BartConfig", "BartForConditionalGeneration", _BART,
               layer_type="decoder", table_modes=_PRECOMPUTED),
        Sample("bart-decoder-layer1", "BART decoder layer 1: no positions (nope)", "BartConfig",
               "BartForConditionalGeneration", _BART, layer=1, layer_type="decoder", table_modes=_PRECOMPUTED),
        Sample(
            "qwen2-vl", "Qwen2-VL text attention: M-RoPE in sections, q/k/v biases", "Qwen2VLConfig",
            "Qwen2VLForConditionalGeneration",
            {"text_config": _decoder(rope_parameters=_MROPE), "vision_config": _QWEN_VISION}, layer=1,
        ),
        Sample(
            "qwen2.5-vl", "Qwen2.5-VL text attention: M-RoPE in sections", "Qwen2_5_VLConfig",
            "Qwen2_5_VLForConditionalGeneration",
            {"text_config": _decoder(rope_parameters=_MROPE),
             "vision_config": {**_QWEN_VISION, "out_hidden_size": 64, "intermediate_size": 32}},
        ),
        Sample(
            "qwen3-vl", "Qwen3-VL text attention: interleaved M-RoPE, q/k norms", "Qwen3VLConfig",
            "Qwen3VLForConditionalGeneration",
            {"text_config": _decoder(head_dim=16, rope_parameters=_QWEN3_MROPE), "vision_config": _QWEN3_VISION},
        ),
        Sample(
            "deepseek-v2-lite", "DeepSeek-V2-Lite shape: MLA, plain q_proj, complex RoPE, YaRN mscale",
            "DeepseekV2Config", "DeepseekV2ForCausalLM", {**_DEEPSEEK, "q_lora_rank": None,
                                                          "rope_parameters": _DEEPSEEK_YARN}, layer=1,
        ),
        Sample(
            "deepseek-v3", "DeepSeek-V3: MLA with q LoRA, rope_interleave, YaRN mscale", "DeepseekV3Config",
            "DeepseekV3ForCausalLM", {**_DEEPSEEK, "q_lora_rank": 24, "n_group": 1, "topk_group": 1,
                                      "rope_parameters": _DEEPSEEK_YARN},
        ),
        Sample("mistral4", "Mistral 4: MLA, rope_interleave, YaRN mscale, query scaled by position",
               "Mistral4Config", "Mistral4ForCausalLM",
               {**_DEEPSEEK, "q_lora_rank": 24, "n_group": 1, "topk_group": 1,
                "rope_parameters": {**_DEEPSEEK_YARN, "original_max_position_embeddings": 4,
                                    "llama_4_scaling_beta": 0.1, "partial_rotary_factor": 8 / 24}}, layer=1),
        Sample("llama4-rope", "Llama 4 RoPE layer: complex RoPE, chunked attention, L2 q/k norm",
               "Llama4TextConfig", "Llama4ForCausalLM", _LLAMA4, layer=1),
        Sample("llama4-nope", "Llama 4 NoPE layer: attention-temperature tuning", "Llama4TextConfig",
               "Llama4ForCausalLM", _LLAMA4, layer=3),
        Sample("hunyuan", "HunYuan: NTK-α RoPE, q/k norms after the rotation", "HunYuanDenseV1Config",
               "HunYuanDenseV1ForCausalLM", _HUNYUAN, layer=1),
        Sample("olmo2", "OLMo 2: q/k RMSNorm over the whole projection", "Olmo2Config", "Olmo2ForCausalLM",
               _decoder(head_dim=16, attention_bias=True, **NO_SPECIAL_TOKENS), layer=1),
        Sample("gpt-oss", "gpt-oss: attention sinks, YaRN, sliding layer, biases", "GptOssConfig",
               "GptOssForCausalLM", _GPT_OSS, layer=0),
        Sample("qwen3-next", "Qwen3-Next: sigmoid output gate in q_proj, zero-centred q/k norms, partial rotary",
               "Qwen3NextConfig", "Qwen3NextForCausalLM", _QWEN3_NEXT, layer=1),
        Sample("ministral3", "Ministral 3: YaRN, query scaled by position (llama_4_scaling)", "Ministral3Config",
               "Ministral3ForCausalLM", _decoder(head_dim=16, rope_parameters=_MINISTRAL3_YARN, **NO_SPECIAL_TOKENS),
               layer=1),
        Sample("phi", "Phi-2 style: q/k LayerNorm, partial rotary, dense", "PhiConfig", "PhiForCausalLM",
               _decoder(qk_layernorm=True, rope_parameters=_PARTIAL_HALF, **NO_SPECIAL_TOKENS), layer=1),
        Sample("phi-plain", "Phi (phi-1.5, phi-2): partial rotary, biases, dense", "PhiConfig", "PhiForCausalLM",
               _decoder(rope_parameters=_PARTIAL_HALF, **NO_SPECIAL_TOKENS), layer=1),
        Sample("lfm3", "LFM3: per-head sigmoid gate (gate_proj), q/k norms, proportional partial RoPE on full layers",
               "Lfm3Config", "Lfm3ForCausalLM", _LFM3, layer=2),
        Sample("gemma4-sliding", "Gemma 4 sliding layer: q/k/v norms, score scale 1, window, default RoPE",
               "Gemma4TextConfig", "Gemma4ForCausalLM", _GEMMA4, layer=1),
        Sample("gemma4-full", "Gemma 4 full layer: p-RoPE, wider heads, keys as values, v norm",
               "Gemma4TextConfig", "Gemma4ForCausalLM", _GEMMA4, layer=2),
        Sample("mimo-v2-flash-sliding", "MiMo-V2-Flash sliding layer: values narrower than keys, sinks, window, "
               "partial RoPE, scaled values", "MiMoV2FlashConfig", "MiMoV2FlashForCausalLM", _MIMO, layer=1),
        Sample("mimo-v2-flash-full", "MiMo-V2-Flash full layer: values narrower than keys, partial RoPE of theta 5e6",
               "MiMoV2FlashConfig", "MiMoV2FlashForCausalLM", _MIMO, layer=0),
        Sample("modernbert-global", "ModernBERT global layer: fused Wqkv, bidirectional, global RoPE theta",
               "ModernBertConfig", "ModernBertForMaskedLM", _MODERNBERT, layer=None, layer_type="full_attention"),
        Sample("modernbert-local", "ModernBERT local layer: bidirectional sliding window, local RoPE theta",
               "ModernBertConfig", "ModernBertForMaskedLM", _MODERNBERT, layer=None, layer_type="sliding_attention"),
        Sample("persimmon", "Persimmon: fused per-head qkv, q/k LayerNorm, partial rotary", "PersimmonConfig",
               "PersimmonForCausalLM", _decoder(num_key_value_heads=4, rope_parameters=_PARTIAL_HALF,
                                                **NO_SPECIAL_TOKENS), layer=1),
    )
}  # fmt: skip

_WINDOW = {"sliding_window": 4}
"""A window shorter than the family tests' 6-token prompt, so the model's mask shows it."""
_ALTERNATING = ["sliding_attention", "full_attention", "sliding_attention"]


def _alias(name: str, title: str, classes: str, layer: int = 1, **settings: Any) -> Sample:
    """A model type whose attention is a family's (``families/llama.py`` ``ALIASES``): the tiny decoder with 16-wide
    heads and the options its family maps switched away from their defaults (``classes``: the transformers class
    names' common prefix, ``<prefix>Config`` and ``<prefix>ForCausalLM``)."""
    config = {**TINY, **NO_SPECIAL_TOKENS, "head_dim": 16, **settings}
    return Sample(name, title, f"{classes}Config", f"{classes}ForCausalLM", config, layer=layer)


ALIAS_SAMPLES: dict[str, Sample] = {
    sample.name: sample
    for sample in (
        _alias("smollm3", "SmolLM3: every fourth layer without RoPE (this one), biases", "SmolLM3", layer=3,
               num_hidden_layers=4, attention_bias=True),
        _alias("cohere2", "Cohere 2: interleaved RoPE on its sliding layers (this one), none on full ones", "Cohere2",
               layer=0, layer_types=_ALTERNATING, **_WINDOW),
        _alias("exaone4", "EXAONE 4: RoPE on its sliding layers (this one), none on full ones", "Exaone4",
               layer=0, sliding_window_pattern=2, **_WINDOW),
        _alias("ernie4_5", "ERNIE 4.5: interleaved RoPE, biases", "Ernie4_5", use_bias=True),
        _alias("cohere", "Cohere: interleaved RoPE, biases", "Cohere", attention_bias=True),
        _alias("glm", "GLM: interleaved partial RoPE, biases", "Glm", attention_bias=True),
        _alias("glm4", "GLM-4: interleaved partial RoPE, biases", "Glm4", attention_bias=True),
        _alias("helium", "Helium: interleaved RoPE, biases", "Helium", attention_bias=True),
        _alias("granite", "Granite: attention_multiplier as the softmax scale, biases", "Granite",
               attention_multiplier=0.11, attention_bias=True),
        _alias("stablelm", "StableLM: partial rotary, qkv biases, multi-head", "StableLm", use_qkv_bias=True,
               num_key_value_heads=4, head_dim=None),
        _alias("olmo3", "OLMo 3: q/k norms over the whole projection, a sliding layer (this one)", "Olmo3", layer=0,
               layer_types=_ALTERNATING, **_WINDOW),
        _alias("minimax_m2", "MiniMax-M2: q/k norms over the whole projection, partial rotary", "MiniMaxM2",
               num_local_experts=2, num_experts_per_tok=1, rotary_dim=8),
        _alias("granite_swa", "Granite SWA: a sliding layer (this one), RoPE theta per layer, attention multiplier",
               "GraniteSWA", layer=0, attention_multiplier=0.11, layer_types=_ALTERNATING,
               layer_rope_theta=[10000.0, 0.0, 50000.0], **_WINDOW),
        _alias("afmoe", "AFMoE: a sliding layer (this one), output gate", "Afmoe", layer=0,
               layer_types=_ALTERNATING, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32,
               num_shared_experts=1, **_WINDOW),
    )
}  # fmt: skip
"""Issue 22's model types whose attention an existing family already expresses (proven against their own modules in
tests/checkpoints/test_aliases.py, which builds them from these recipes): one sample each, in :data:`SAMPLES`."""
SAMPLES.update(ALIAS_SAMPLES)


def get_sample(name: str) -> Sample:
    """The sample ``name``; unknown names raise with the list."""
    try:
        return SAMPLES[name]
    except KeyError:
        raise ConfigError(f"unknown sample checkpoint {name!r}; choose one of {sorted(SAMPLES)}.") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m posenc.checkpoints.samples",
        description="Write a tiny seeded checkpoint of a supported family (transformers save_pretrained).",
    )
    parser.add_argument("name", nargs="?", help="sample name (see --list)")
    parser.add_argument("folder", nargs="?", help="where to write it")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--list", action="store_true", help="list the samples")
    args = parser.parse_args(argv)
    if args.list or not args.name or not args.folder:
        for sample in SAMPLES.values():
            print(f"{sample.name:22} {sample.title}")
        return 0 if args.list else 2
    try:
        sample = get_sample(args.name)
        sample.build(args.folder, seed=args.seed)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    layer = f"--layer {sample.layer}" if sample.layer is not None else ""
    kind = f" --layer-type {sample.layer_type}" if sample.layer_type else ""
    print(f"wrote {args.folder} ({sample.title}); try: posenc export --hf-model {args.folder} {layer}{kind} -o m.onnx")
    return 0


if __name__ == "__main__":
    sys.exit(main())
