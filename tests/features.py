"""Attention blocks with the options real checkpoints need, exported once per test session.

Each :class:`FeatureCase` is one block (scheme, parameters, geometry with the attention options, table mode,
dtype) shaped after the model family it stands for. The parity, fusion and engine tests share the exports
through the session's ``export_cache`` folder (locked, so parallel workers export each file once).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from posenc import AttentionConfig
from tests.matrix import locked

_DECODER = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=64)
GEMMA = dataclasses.replace(
    _DECODER, qkv_bias=True, out_bias=True, attn_scale=0.2, logit_softcap=0.5, sliding_window=4, qk_norm="rms"
)
FALCON = AttentionConfig(hidden_size=96, num_heads=6, max_position_embeddings=64, qkv_bias=True, out_bias=True)
CAPPED_ENCODER = AttentionConfig(
    hidden_size=48, num_heads=6, max_position_embeddings=64, causal=False, logit_softcap=1.0, sliding_window=3
)
BERT = AttentionConfig(hidden_size=64, num_heads=4, max_position_embeddings=64, causal=False, qkv_bias=True,
                       out_bias=True)  # fmt: skip
BERT_EMBEDDINGS = {"position_offset": 2, "token_type": True, "embedding_norm": True}
MARIAN = AttentionConfig(hidden_size=63, num_heads=4, head_dim=16, max_position_embeddings=64, out_bias=True)
DEBERTA = dataclasses.replace(BERT, attn_scale=None)
LOCAL = dataclasses.replace(_DECODER, attn_scale=0.3, logit_softcap=2.0, sliding_window=4)
LLAMA4_ROPE = dataclasses.replace(_DECODER, qk_norm="l2", qk_norm_eps=1e-5, qk_norm_after_rope=True,
                                  attention_chunk_size=4)  # fmt: skip
LLAMA4_NOPE = dataclasses.replace(_DECODER, temperature_floor_scale=2, temperature_scale=0.1)
HUNYUAN = dataclasses.replace(_DECODER, qk_norm="rms", qk_norm_eps=1e-5, qk_norm_after_rope=True)
GPT_OSS = dataclasses.replace(_DECODER, qkv_bias=True, out_bias=True, sliding_window=4, attention_sinks=True)
QWEN3_NEXT = dataclasses.replace(_DECODER, qkv_bias=True, qk_norm="rms", output_gate="sigmoid")
LAGUNA = dataclasses.replace(_DECODER, qk_norm="rms", output_gate="softplus", output_gate_per_head=True)
OLMO2 = dataclasses.replace(_DECODER, qk_norm="rms", qk_norm_full_width=True)
MINISTRAL3 = dataclasses.replace(_DECODER, temperature_floor_scale=8, temperature_scale=0.1, temperature_offset=0)
PHI = dataclasses.replace(_DECODER, num_kv_heads=4, qkv_bias=True, out_bias=True, qk_norm="layer", qk_norm_eps=1e-5)
GEMMA4_FULL = dataclasses.replace(_DECODER, num_kv_heads=1, head_dim=32, attn_scale=1.0, qk_norm="rms", v_norm=True,
                                  values_from_keys=True)  # fmt: skip
_YARN = {"factor": 4.0, "original_max_position_embeddings": 16, "truncate": False}


@dataclasses.dataclass(frozen=True)
class FeatureCase:
    """One exported attention block with new options."""

    name: str
    scheme: str
    config: AttentionConfig
    params: Mapping[str, Any]
    table_mode: str
    dtype: str
    slow: bool = False
    """Redundant for parity: its options are exported by another case (``make test-slow`` runs it)."""

    @property
    def id(self) -> str:
        return f"{self.name}-{self.table_mode}-{self.dtype}"

    @property
    def biased(self) -> bool:
        return self.scheme in ("alibi", "deberta", "t5", "tupe", "transformer_xl")

    @property
    def fused_attention_expected(self) -> dict[str, int]:
        """Attention fusions per target: declined for schemes that attend themselves, a soft-cap on TensorRT
        (its parser rejects ``softcap``) and a soft-capped score bias (``Attention`` caps before its mask)."""
        if self.scheme in ("shaw", "rerope", "leaky_rerope"):
            return {"ort-cpu": 0, "trt": 0}
        capped = self.config.logit_softcap is not None
        return {"ort-cpu": int(not (capped and self.biased)), "trt": int(not capped)}


FEATURE_CASES = [
    FeatureCase("gemma2", "rope", GEMMA, {}, "precomputed", "float16"),
    FeatureCase("gemma2", "rope", GEMMA, {}, "dynamic", "float32"),
    FeatureCase("falcon_alibi", "alibi", FALCON, {"scaled": True, "bf16_rounding": True}, "precomputed", "float16"),
    FeatureCase("falcon_alibi", "alibi", FALCON, {"scaled": True, "bf16_rounding": True}, "dynamic", "float32"),
    FeatureCase("alibi_encoder_window_capped", "alibi", CAPPED_ENCODER, {"alibi_bias_max": 6.0}, "dynamic", "float32"),
    # fp32 in make test-slow: the fp16 case below exports the same options in the same table mode
    FeatureCase("bert_learned", "learned", BERT, BERT_EMBEDDINGS, "precomputed", "float32", slow=True),
    FeatureCase("bert_learned", "learned", BERT, BERT_EMBEDDINGS, "precomputed", "float16"),
    FeatureCase("marian_sinusoidal_odd", "sinusoidal", MARIAN, {"layout": "concat"}, "precomputed", "float16"),
    FeatureCase("xlm_sinusoidal_odd", "sinusoidal", MARIAN, {"layout": "interleaved"}, "dynamic", "float32"),
    FeatureCase(
        "deberta_v3",
        "deberta",
        DEBERTA,
        {"share_att_key": True, "rel_norm": True, "position_buckets": 8, "max_relative_positions": 16},
        "precomputed",
        "float16",
    ),
    FeatureCase(
        "deberta_p2c_shared",
        "deberta",
        DEBERTA,
        {"share_att_key": True, "pos_att_type": "p2c", "position_buckets": 8, "max_relative_positions": 16},
        "dynamic",
        "float32",
        slow=True,
    ),
    FeatureCase("shaw_local", "shaw", LOCAL, {"max_relative_position": 3}, "dynamic", "float32", slow=True),
    FeatureCase("rerope_local", "rerope", LOCAL, {"window": 3}, "precomputed", "float16"),
    FeatureCase("llama4_rope_chunked", "rope", LLAMA4_ROPE, {"layout": "interleaved"}, "precomputed", "float16"),
    FeatureCase("llama4_nope_temperature", "nope", LLAMA4_NOPE, {}, "precomputed", "float16"),
    FeatureCase("hunyuan_norm_after_rope", "rope_ntk_alpha", HUNYUAN, {"alpha": 1000.0}, "dynamic", "float32"),
    FeatureCase("gpt_oss_sinks", "rope_yarn", GPT_OSS, _YARN, "precomputed", "float16"),
    FeatureCase("gpt_oss_sinks", "rope_yarn", GPT_OSS, _YARN, "dynamic", "float32"),
    FeatureCase("qwen3_next_gate", "rope", QWEN3_NEXT, {"partial_rotary_factor": 0.5}, "precomputed", "float16"),
    FeatureCase("laguna_softplus_head_gate", "rope", LAGUNA, {}, "dynamic", "float32"),
    FeatureCase("olmo2_full_width_norm", "rope", OLMO2, {}, "precomputed", "float16"),
    FeatureCase("ministral3_scaled_query", "rope_yarn", MINISTRAL3, _YARN, "precomputed", "float16"),
    FeatureCase("phi_layernorm", "rope", PHI, {"partial_rotary_factor": 0.5}, "precomputed", "float32"),
    FeatureCase(
        "gemma4_keys_as_values",
        "rope_proportional",
        GEMMA4_FULL,
        {"partial_rotary_factor": 0.25},
        "precomputed",
        "float16",
    ),
]
"""Every option in fp32 and fp16 and in both table modes where its scheme has them."""

ENGINE_CASES = [c for c in FEATURE_CASES if c.dtype == "float16" and c.scheme != "rerope"]
"""One engine per option: q/k norm, soft-cap, window, biases (gemma2); scaled ALiBi; BERT embeddings; odd
sinusoids; shared DeBERTa projections; Llama 4's chunks, L2 norm after RoPE and temperature tuning; gpt-oss's
sinks (the zero-key Attention), Qwen3-Next's gate, OLMo 2's full-width norm, Ministral 3's scaled query, Gemma 4's
full layer (proportional RoPE, values from the key projection, value norm, scale 1).
(TensorRT-RTX has no fp16 fused-attention kernel for head_dim 8, so the blocks keep head_dim >= 16.)"""
FUSION_CASES = [
    c for c in FEATURE_CASES
    if c.dtype == "float16" or c.name in ("gemma2", "alibi_encoder_window_capped", "gpt_oss_sinks", "phi_layernorm",
                                          "laguna_softplus_head_gate")
]  # fmt: skip
"""The fp16 blocks (their TensorRT graphs are the engine tests' too), the fp32 dynamic RoPE block, the
soft-capped ALiBi block whose attention must stay decomposed, and the fp32 sink, softplus-gate and LayerNorm
blocks."""


def exported_feature(folder: Path, case: FeatureCase) -> Path:
    """The block of ``case`` exported to ONNX in ``folder`` (on first use)."""
    from posenc.export import export_scheme

    path = folder / f"feature_{case.id}.onnx"
    with locked(path):
        if not path.exists():
            export_scheme(case.scheme, path, unit="block", params=case.params, config=case.config,
                        table_mode=case.table_mode, dtype=case.dtype)  # fmt: skip
    return path


def optimized_feature(folder: Path, case: FeatureCase, target: str) -> Path:
    """``posenc optimize`` of the export for ``target`` (parity before/after checked on ONNX Runtime CPU)."""
    from posenc.graphs import optimize_file

    source = exported_feature(folder, case)
    path = source.with_name(f"{source.stem}.{target}.onnx")
    with locked(path):
        if not path.exists():
            optimize_file(source, path, target)
    return path
