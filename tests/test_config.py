"""AttentionConfig validation and import of Hugging Face config.json files (checked against transformers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from posenc import AttentionConfig, ConfigError, build_scheme, from_hf_config
from posenc.config import HFImport

LLAMA_3_1 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "max_position_embeddings": 131072, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}  # fmt: skip
QWEN2_YARN = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
    "num_key_value_heads": 4, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
}  # fmt: skip
PHI3_LONGROPE = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
    "num_key_value_heads": 32, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0 + 0.002 * i for i in range(48)],
                     "long_factor": [1.0 + 0.5 * i for i in range(48)]},
}  # fmt: skip
GPT_NEOX = {
    "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_size": 512, "num_attention_heads": 8,
    "rotary_pct": 0.25, "rotary_emb_base": 20000, "max_position_embeddings": 2048,
}  # fmt: skip
GPT_J = {"architectures": ["GPTJForCausalLM"], "model_type": "gptj", "n_embd": 256, "n_head": 4, "rotary_dim": 16,
         "n_positions": 2048}  # fmt: skip
BLOOM = {"architectures": ["BloomForCausalLM"], "model_type": "bloom", "hidden_size": 1024, "n_head": 16}
T5 = {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "d_model": 512, "num_heads": 8,
      "d_kv": 64, "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
      "is_encoder_decoder": True}  # fmt: skip
BERT = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 768, "num_attention_heads": 12,
        "max_position_embeddings": 512, "position_embedding_type": "absolute"}  # fmt: skip


def _hf_cos_sin(config_class: str, data: dict[str, Any], positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    transformers = pytest.importorskip("transformers", reason="transformers is the reference")
    import importlib

    config = getattr(transformers, f"{config_class}Config").from_dict(dict(data))
    module = importlib.import_module(f"transformers.models.{data['model_type']}.modeling_{data['model_type']}")
    rotary = getattr(module, f"{config_class}RotaryEmbedding")(config)
    return rotary(torch.zeros(1), positions)


@pytest.mark.parametrize(
    ("data", "config_class", "scheme", "geometry"),
    [
        (LLAMA_3_1, "Llama", "rope_llama3", (4096, 32, 8, 128)),
        (QWEN2_YARN, "Qwen2", "rope_yarn", (3584, 28, 4, 128)),
        (PHI3_LONGROPE, "Phi3", "rope_longrope", (3072, 32, 32, 96)),
        (GPT_NEOX, "GPTNeoX", "rope", (512, 8, 8, 64)),
    ],
    ids=["llama-3.1", "qwen2-yarn", "phi3-longrope", "gpt-neox"],
)
def test_rope_configs_give_the_cos_sin_of_transformers(
    data: dict, config_class: str, scheme: str, geometry: tuple[int, int, int, int]
) -> None:
    imported = from_hf_config(data)
    assert imported.scheme == scheme
    assert imported.model_type == data["model_type"]
    cfg = imported.config
    assert (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == geometry
    assert cfg.causal
    assert cfg.max_position_embeddings == data["max_position_embeddings"]
    module = build_scheme(imported.scheme, cfg, imported.params, "dynamic")
    # Short positions (HF angles are float32), plus one far position that puts LongRoPE on its long factors.
    for positions in (torch.arange(48).unsqueeze(0), torch.cat((torch.arange(48), torch.tensor([5000]))).unsqueeze(0)):
        expected_cos, expected_sin = _hf_cos_sin(config_class, data, positions)
        cos, sin = module.cos_sin(positions)
        half = cos.shape[-1]
        assert expected_cos.shape[-1] == 2 * half
        torch.testing.assert_close(cos[:, :48], expected_cos[:, :48, :half], atol=3e-5, rtol=0)
        torch.testing.assert_close(sin[:, :48], expected_sin[:, :48, :half], atol=3e-5, rtol=0)


def test_gpt_j_is_interleaved_partial_rope_like_transformers() -> None:
    gptj = pytest.importorskip("transformers.models.gptj.modeling_gptj", reason="GPT-J is the reference")
    imported = from_hf_config(GPT_J)
    assert imported.scheme == "rope"
    assert imported.params["layout"] == "interleaved"
    assert imported.params["partial_rotary_factor"] == 0.25
    cfg = imported.config
    assert (cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.max_position_embeddings) == (256, 4, 64, 2048)
    module = build_scheme(imported.scheme, cfg, imported.params, max_positions=64)
    positions = torch.arange(30).unsqueeze(0)
    q = torch.randn(1, 30, 4, 64)  # GPT-J rotates [B, S, H, D] before moving heads forward
    sincos = gptj.create_sinusoidal_positions(64, 16)[positions]
    sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)
    expected = torch.cat((gptj.apply_rotary_pos_emb(q[..., :16], sin, cos), q[..., 16:]), dim=-1)
    got, _ = module.rotate(q.transpose(1, 2), q.transpose(1, 2), positions)
    torch.testing.assert_close(got.transpose(1, 2), expected, atol=1e-5, rtol=1e-5)


def test_interleaved_model_types_import_their_layout_as_their_checkpoints_load() -> None:
    """``export --hf-config`` and the checkpoint loader agree on the layout of every Llama-convention type: the
    interleaved ones (GLM-4, Helium, ERNIE 4.5, Cohere, ...) import ``layout=interleaved``, the others do not."""
    transformers = pytest.importorskip("transformers")
    from posenc.checkpoints.families.llama import VARIANTS

    for model_type, variant in VARIANTS.items():
        data = transformers.CONFIG_MAPPING[model_type]().to_dict()
        data["head_dim"] = 64  # GLM-4-MoE's default 4096 // 96 = 42 heads x partial 0.5: an odd width, refused
        nested = any(isinstance(v, dict) for v in (data.get("rope_parameters") or {}).values())
        layer_type = next(iter(data["rope_parameters"])) if nested else None
        layout = from_hf_config(data, layer_type).params.get("layout")
        assert (layout == "interleaved") is variant.interleaved, model_type


@pytest.mark.parametrize(
    ("data", "scheme", "params", "causal"),
    [
        (BLOOM, "alibi", {}, True),
        ({"model_type": "falcon", "hidden_size": 256, "num_attention_heads": 8, "alibi": True}, "alibi",
         {"scaled": True, "bf16_rounding": True}, True),
        ({"model_type": "mpt", "d_model": 256, "n_heads": 8, "max_seq_len": 2048, "attn_config": {"alibi": True}},
         "alibi", {}, True),
        (T5, "t5", {"num_buckets": 32, "max_distance": 128, "bidirectional": True}, False),
        (BERT, "learned", {}, False),
    ],
    ids=["bloom", "falcon-alibi", "mpt", "t5", "bert"],
)  # fmt: skip
def test_non_rope_configs(data: dict, scheme: str, params: dict, causal: bool) -> None:
    imported = from_hf_config(data)
    assert (imported.scheme, imported.params, imported.config.causal) == (scheme, params, causal)
    build_scheme(imported.scheme, imported.config, imported.params, max_positions=16)  # the import is usable


def test_t5_geometry_uses_d_kv() -> None:
    cfg = from_hf_config(T5).config
    assert (cfg.hidden_size, cfg.num_heads, cfg.head_dim) == (512, 8, 64)


def test_transformers_v5_rope_parameters_and_dynamic_scaling() -> None:
    v5 = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 4096,
          "rope_parameters": {"rope_type": "default", "rope_theta": 123456.0}}  # fmt: skip
    assert (from_hf_config(v5).scheme, from_hf_config(v5).params) == ("rope", {"rope_theta": 123456.0})
    dynamic = {**v5, "rope_parameters": None, "rope_scaling": {"type": "dynamic", "factor": 2.0}}
    imported = from_hf_config(dynamic)
    assert imported.scheme == "rope_dynamic"
    assert imported.params == {"rope_theta": 10000.0, "factor": 2.0}


def test_reads_files_and_model_directories(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_1))
    from_file = from_hf_config(tmp_path / "config.json")
    assert isinstance(from_file, HFImport)
    assert from_file == from_hf_config(str(tmp_path)) == from_hf_config(LLAMA_3_1)


def test_missing_or_invalid_files_raise_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"does not exist; pass the path of config.json"):
        from_hf_config(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match="does not exist"):
        from_hf_config(tmp_path)  # a directory without config.json
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        from_hf_config(bad)
    bad.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        from_hf_config(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not an object"):
        from_hf_config(bad)
    with pytest.raises(ConfigError, match="lacks hidden_size/num_attention_heads"):
        from_hf_config({"model_type": "llama"})
    with pytest.raises(ConfigError, match=r"rope_type 'axial' in config.json is not supported; supported: "):
        from_hf_config({**LLAMA_3_1, "rope_scaling": {"rope_type": "axial"}})


def test_attention_config_validation() -> None:
    with pytest.raises(ConfigError, match="num_heads 8 is not divisible by num_kv_heads 3"):
        AttentionConfig(hidden_size=64, num_heads=8, num_kv_heads=3)
    with pytest.raises(ConfigError, match="give head_dim explicitly"):
        AttentionConfig(hidden_size=100, num_heads=8)
    with pytest.raises(ConfigError, match="hidden_size must be a positive int"):
        AttentionConfig(hidden_size=0)
    with pytest.raises(ConfigError, match="num_kv_heads must be a positive int"):
        AttentionConfig(num_kv_heads=0)
    with pytest.raises(ConfigError, match=r"unknown AttentionConfig field.*'heads'"):
        AttentionConfig.from_dict({"heads": 4})
    cfg = AttentionConfig(hidden_size=100, num_heads=8, head_dim=16, num_kv_heads=2)
    assert cfg.kv_groups == 4
    assert AttentionConfig.from_dict(cfg.to_dict()) == cfg


def test_falcon_kv_heads_follow_transformers() -> None:
    falcon = pytest.importorskip("transformers.models.falcon.modeling_falcon", reason="Falcon is the reference")
    from transformers import FalconConfig

    base = {"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 8, "vocab_size": 16}
    cases = [
        {"multi_query": True, "new_decoder_architecture": False},  # falcon-7b: one kv head
        {"multi_query": True, "new_decoder_architecture": True, "num_kv_heads": 2},  # falcon-40b: 8 in the real one
        {"multi_query": False, "new_decoder_architecture": False},  # plain multi-head attention
    ]
    for extra in cases:
        data = {**base, **extra}
        attention = falcon.FalconAttention(FalconConfig.from_dict(dict(data)), layer_idx=0)
        qkv_out = attention.query_key_value.out_features
        expected_kv = (qkv_out // attention.head_dim - attention.num_heads) // 2
        assert from_hf_config(data).config.num_kv_heads == expected_kv, extra


def test_encoder_relative_models_import_their_schemes() -> None:
    deberta_v3 = {"model_type": "deberta-v2", "hidden_size": 768, "num_attention_heads": 12,
                  "max_position_embeddings": 512, "relative_attention": True, "pos_att_type": ["p2c", "c2p"],
                  "position_buckets": 256, "max_relative_positions": -1}  # fmt: skip
    imported = from_hf_config(deberta_v3)
    assert (imported.scheme, imported.config.causal) == ("deberta", False)
    assert imported.params == {"position_buckets": 256, "max_relative_positions": 512, "pos_att_type": "c2p|p2c",
                               "share_att_key": False, "rel_norm": False, "rel_norm_eps": 1e-7}  # fmt: skip
    build_scheme(imported.scheme, imported.config, imported.params, max_positions=16)
    v3_base = {**deberta_v3, "share_att_key": True, "norm_rel_ebd": "layer_norm", "layer_norm_eps": 1e-6,
               "pos_att_type": "p2c|c2p"}  # microsoft/deberta-v3-base's settings  # fmt: skip
    params = from_hf_config(v3_base).params
    assert (params["share_att_key"], params["rel_norm"], params["rel_norm_eps"]) == (True, True, 1e-6)
    assert from_hf_config({**deberta_v3, "pos_att_type": "c2p"}).params["pos_att_type"] == "c2p"
    with pytest.raises(ConfigError, match="c2p and/or p2c terms"):
        from_hf_config({**deberta_v3, "pos_att_type": ["c2p", "p2p"]})
    with pytest.raises(ConfigError, match="c2p and/or p2c terms"):
        from_hf_config({**deberta_v3, "relative_attention": False})
    xlnet = {"model_type": "xlnet", "d_model": 1024, "n_head": 16, "d_head": 64}
    imported = from_hf_config(xlnet)
    assert (imported.scheme, imported.config.head_dim, imported.config.causal) == ("transformer_xl", 64, False)


def test_models_without_a_known_scheme_are_refused() -> None:
    for model_type in ("bart", "gpt_neo", "gpt_bigcode"):
        with pytest.raises(ConfigError, match=r"names no positional scheme posenc can import; supported: RoPE"):
            from_hf_config({"model_type": model_type, "hidden_size": 64, "num_attention_heads": 4})
    # an unknown model type with rope keys is still RoPE
    imported = from_hf_config({"model_type": "newlm", "hidden_size": 64, "num_attention_heads": 4, "rope_theta": 5e5})
    assert (imported.scheme, imported.params) == ("rope", {"rope_theta": 5e5})
    mpt = {"model_type": "mpt", "d_model": 64, "n_heads": 4, "attn_config": None}
    assert (from_hf_config(mpt).scheme, from_hf_config(mpt).params) == ("alibi", {})
    mpt_bias_max = {**mpt, "attn_config": {"alibi": True, "alibi_bias_max": 6}}
    assert from_hf_config(mpt_bias_max).params == {"alibi_bias_max": 6.0}
    falcon_rw = {"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 4, "alibi": True}
    assert from_hf_config(falcon_rw).params == {"scaled": True, "bf16_rounding": True}  # as build_alibi_tensor


def test_per_layer_type_rope_parameters_need_a_choice() -> None:
    gemma3 = {"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
              "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}  # fmt: skip
    with pytest.raises(ConfigError, match=r"per layer type \['full_attention', 'sliding_attention'\]"):
        from_hf_config(gemma3)
    full = from_hf_config(gemma3, layer_type="full_attention")
    assert (full.scheme, full.params) == ("rope_linear", {"rope_theta": 1e6, "factor": 8.0})
    sliding = from_hf_config(gemma3, layer_type="sliding_attention")
    assert (sliding.scheme, sliding.params) == ("rope", {"rope_theta": 1e4})
    with pytest.raises(ConfigError, match="one rope_parameters for all layers"):
        from_hf_config(LLAMA_3_1, layer_type="full_attention")


def test_flags_must_be_booleans() -> None:
    with pytest.raises(ConfigError, match="causal must be True or False, got 'no'"):
        AttentionConfig(causal="no")
    with pytest.raises(ConfigError, match="qkv_bias must be True or False"):
        AttentionConfig(qkv_bias=1)


def test_attention_options_default_to_plain_attention_and_round_trip() -> None:
    cfg = AttentionConfig()
    assert (cfg.out_bias, cfg.attn_scale, cfg.logit_softcap, cfg.sliding_window, cfg.qk_norm) == (
        False, None, None, None, "none"
    )  # fmt: skip
    gemma = AttentionConfig(attn_scale=1 / 16, logit_softcap=50, sliding_window=4096, qk_norm="rms", out_bias=True)
    assert isinstance(gemma.logit_softcap, float)
    assert gemma.logit_softcap == 50.0
    assert AttentionConfig.from_dict(gemma.to_dict()) == gemma
    old_manifest = {k: v for k, v in cfg.to_dict().items() if k in ("hidden_size", "num_heads", "causal")}
    assert AttentionConfig.from_dict(old_manifest) == cfg  # manifests written before these fields still load


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("attn_scale", 0.0, r"attn_scale must be a finite number > 0 \(the multiplier"),
        ("attn_scale", -0.125, "attn_scale must be a finite number > 0"),
        ("attn_scale", float("nan"), "attn_scale must be a finite number > 0"),
        ("attn_scale", True, "attn_scale must be a finite number > 0"),
        ("logit_softcap", 0, r"logit_softcap must be a finite number > 0 .*or None for none"),
        ("logit_softcap", -30.0, "logit_softcap must be a finite number > 0"),
        ("logit_softcap", float("inf"), "logit_softcap must be a finite number > 0"),
        ("logit_softcap", "50", "logit_softcap must be a finite number > 0"),
        ("sliding_window", 0, r"sliding_window must be an int >= 1 .* or None"),
        ("sliding_window", -4, "sliding_window must be an int >= 1"),
        ("sliding_window", 4.0, "sliding_window must be an int >= 1"),
        ("sliding_window", True, "sliding_window must be an int >= 1"),
        ("qk_norm", "group", r"qk_norm must be one of \['none', 'rms', 'l2', 'layer'\]"),
        ("qk_norm", None, r"qk_norm must be one of"),
        ("qk_norm_eps", 0.0, "qk_norm_eps must be a finite number > 0"),
        ("qk_norm_eps", None, "qk_norm_eps must be a finite number > 0"),
        ("out_bias", 1, "out_bias must be True or False"),
    ],
)
def test_attention_options_refuse_bad_values(field: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AttentionConfig(**{field: value})
