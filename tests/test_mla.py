"""Multi-head latent attention (posenc.blocks.mla.MLABlock): against transformers' DeepseekV2Attention /
DeepseekV3Attention, its cache layout, the YaRN mscale² softmax scale, export in both table modes at other shapes
with polygraphy parity, the graph passes (RoPE fused on the rope slice; Attention fused for ONNX Runtime, declined
for TensorRT with the reason in the manifest and ``posenc inspect``) and an engine built ahead of time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from posenc import ConfigError, MLABlock, MLAConfig
from posenc.blocks import attention_config_from_dict
from posenc.blocks.mla import mla_score_scale
from posenc.export import FeedShape, export_scheme
from tests.conftest import decode_in_steps

transformers = pytest.importorskip("transformers")

GEOMETRY = {"hidden_size": 64, "num_heads": 4, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
            "v_head_dim": 12, "max_position_embeddings": 4096}  # fmt: skip
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 1024,
        "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}  # fmt: skip
VARIANTS = {
    "v2-lite": ("deepseek_v2", {"q_lora_rank": None}),
    "v3-interleave": ("deepseek_v3", {"q_lora_rank": 24, "rope_interleave": True}),
    "v3-half": ("deepseek_v3", {"q_lora_rank": 24, "rope_interleave": False}),
}


def _transformers_pair(variant: str, rope: dict[str, Any] = YARN) -> tuple[Any, Any, MLABlock]:
    """transformers' attention and rotary module (float64) with random weights, and posenc's block holding them."""
    module, extra = VARIANTS[variant]
    prefix = "DeepseekV2" if module == "deepseek_v2" else "DeepseekV3"
    config_class = getattr(transformers, f"{prefix}Config")
    hf = config_class(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=12, max_position_embeddings=4096, rope_parameters=dict(rope), **extra,
    )  # fmt: skip
    hf._attn_implementation = "eager"
    path = f"transformers.models.{module}.modeling_{module}"
    classes = __import__(path, fromlist=["_"])
    attention = getattr(classes, f"{prefix}Attention")(hf, layer_idx=0).double().eval()
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_(0.0, 0.1)
    rotary = getattr(classes, f"{prefix}RotaryEmbedding")(hf)
    config = MLAConfig(
        **GEOMETRY, q_lora_rank=extra["q_lora_rank"], rope_interleave=extra.get("rope_interleave", False)
    )
    params = {k: v for k, v in rope.items() if k not in ("rope_type", "beta_fast", "beta_slow")}
    params["layout"] = "interleaved" if module == "deepseek_v2" else "half"
    scheme = "rope" if rope["rope_type"] == "default" else f"rope_{rope['rope_type']}"
    block = MLABlock(config, scheme, params, table_dtype=torch.float64).double()
    block.load_state_dict(attention.state_dict(), strict=False)
    return attention, rotary, block


def _transformers_step(attention: Any, rotary: Any, x: torch.Tensor, positions: torch.Tensor, past=None):
    """The module as DeepseekV2/V3DecoderLayer calls it: (out, cached latent, cached rope key)."""
    cache = transformers.DynamicCache()
    if past is not None:
        cache.update(past[0], past[1], 0)
    total = positions.shape[1] + (0 if past is None else past[0].shape[2])
    q_pos = positions[0].unsqueeze(-1)
    keys = torch.arange(total).unsqueeze(0)
    mask = torch.zeros(q_pos.shape[0], total, dtype=torch.float64).masked_fill(keys > q_pos, float("-inf"))
    out = attention(x, position_embeddings=rotary(x.float(), positions), attention_mask=mask[None, None],
                    past_key_values=cache)[0]  # fmt: skip
    return out, cache.layers[0].keys, cache.layers[0].values


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_block_matches_the_deepseek_attention_and_its_cache(variant: str) -> None:
    """Output and cache (normalised latent, rotated shared key) equal transformers' module, for a prefill and a
    decode step after it; transformers' float32 angles and RMSNorm bound the difference."""
    attention, rotary, block = _transformers_pair(variant)
    x = torch.randn(2, 7, 64, dtype=torch.float64)
    positions = torch.arange(7).unsqueeze(0).expand(2, 7)
    want = _transformers_step(attention, rotary, x[:, :5], positions[:, :5])
    got = block(x[:, :5], positions[:, :5])
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert got[1].shape == (2, 1, 5, 32)
    assert got[2].shape == (2, 1, 5, 8)
    step_want = _transformers_step(attention, rotary, x[:, 5:], positions[:, 5:], past=want[1:])
    step_got = block(x[:, 5:], positions[:, 5:], got[1], got[2])
    for a, b in zip(step_got, step_want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_softmax_scale_carries_yarns_mscale_squared() -> None:
    attention, _, block = _transformers_pair("v3-interleave")
    assert block.score_scale() == pytest.approx(attention.scaling, rel=1e-12)
    assert block.score_scale() != pytest.approx(24**-0.5, rel=1e-3)  # mscale(4, 0.707)² ≈ 1.20
    plain_attention, _, plain = _transformers_pair("v2-lite", {"rope_type": "default", "rope_theta": 10000.0})
    assert plain.score_scale() == pytest.approx(plain_attention.scaling) == pytest.approx(24**-0.5)


def test_a_block_without_mscale_squared_or_with_the_wrong_pairing_is_caught() -> None:
    """The checks can fail: dropping the mscale² factor, or rotating V3's interleaved pairs in place (V2's form),
    moves the output far beyond 1e-5."""
    attention, rotary, block = _transformers_pair("v3-interleave")
    x = torch.randn(1, 6, 64, dtype=torch.float64)
    positions = torch.arange(6).unsqueeze(0)
    want, _, _ = _transformers_step(attention, rotary, x, positions)
    unscaled = MLABlock(dataclass_replace(block.config, attn_scale=24**-0.5), block.scheme)
    unscaled.load_state_dict(block.state_dict())
    assert (unscaled.double()(x, positions)[0] - want).abs().max() > 1e-4
    flat = dataclass_replace(block.config, rope_interleave=False)
    params = {**block.scheme.params, "layout": "interleaved"}
    in_place = MLABlock(flat, "rope_yarn", params, table_dtype=torch.float64).double()
    in_place.load_state_dict(block.state_dict())
    _, _, rope_key = in_place(x, positions)
    _, _, want_key = _transformers_step(attention, rotary, x, positions)
    assert (rope_key - want_key).abs().max() > 1e-2  # same scores, but the cache holds the pairs in another order


def dataclass_replace(config: MLAConfig, **changes: Any) -> MLAConfig:
    import dataclasses

    return dataclasses.replace(config, **changes)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_block_and_long_positions(dtype: torch.dtype) -> None:
    _, _, block = _transformers_pair("v2-lite")
    x = torch.randn(1, 4, 64, dtype=torch.float64)
    positions = torch.arange(4090, 4094).unsqueeze(0)
    want = block(x, positions)
    half = MLABlock(block.config, "rope_yarn", block.scheme.params).to(dtype)
    half.load_state_dict({k: v.to(dtype) for k, v in block.state_dict().items()}, strict=False)
    got = half(x.to(dtype), positions)
    tolerance = {torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b, atol=tolerance, rtol=tolerance)


def test_decode_in_steps_equals_full_recompute() -> None:
    _, _, block = _transformers_pair("v3-half")
    x = torch.randn(2, 9, 64, dtype=torch.float64)
    torch.testing.assert_close(decode_in_steps(block, x, 4), block(x)[0], atol=1e-10, rtol=1e-10)


def test_bad_geometry_and_schemes_raise() -> None:
    with pytest.raises(ConfigError, match="qk_rope_head_dim must be even"):
        MLAConfig(**{**GEOMETRY, "qk_rope_head_dim": 7})
    with pytest.raises(ConfigError, match="one-axis RoPE scheme"):
        MLABlock(MLAConfig(**GEOMETRY), "alibi")
    with pytest.raises(ConfigError, match="one-axis RoPE scheme"):
        MLABlock(MLAConfig(**GEOMETRY), "rope_mrope")
    block = MLABlock(MLAConfig(**GEOMETRY))
    with pytest.raises(ConfigError, match="together, or neither"):
        block(torch.randn(1, 2, 64), past_key=torch.zeros(1, 1, 3, 32))
    with pytest.raises(ConfigError, match="unknown MLAConfig field"):
        attention_config_from_dict({**MLAConfig(**GEOMETRY).to_dict(), "head_dim": 24})
    assert attention_config_from_dict(MLAConfig(**GEOMETRY).to_dict()) == MLAConfig(**GEOMETRY)
    assert mla_score_scale(MLAConfig(**GEOMETRY, attn_scale=0.5), block.scheme) == 0.5


# --------------------------------------------------------------------------------------------------
# ONNX, graph passes, engine
# --------------------------------------------------------------------------------------------------

EXPORT_CONFIG = MLAConfig(**{**GEOMETRY, "max_position_embeddings": 64}, q_lora_rank=24, rope_interleave=True)
EXPORT_PARAMS = {"rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 0.707,
                 "mscale_all_dim": 0.707}  # fmt: skip


def _export(folder: Path, mode: str, dtype: str) -> Path:
    path = folder / f"mla-{mode}-{dtype}.onnx"
    if not path.exists():
        export_scheme("rope_yarn", path, unit="block", params=EXPORT_PARAMS, config=EXPORT_CONFIG, table_mode=mode,
                    dtype=dtype)  # fmt: skip
    return path


@pytest.mark.parametrize(("mode", "dtype"), [("precomputed", "float32"), ("dynamic", "float16")])
def test_export_runs_at_other_shapes_and_matches_the_eager_block(export_cache, mode: str, dtype: str) -> None:
    from posenc.export import load_manifest
    from posenc.validate import validate_onnx

    path = _export(export_cache, mode, dtype)
    manifest = load_manifest(path)
    assert manifest.attention_config() == EXPORT_CONFIG
    assert [(i.name, i.shape) for i in manifest.inputs][2:] == [
        ("past_key", ("batch", 1, "past", 32)),
        ("past_value", ("batch", 1, "past", 8)),
    ]
    report = validate_onnx(path, shapes=[FeedShape(1, 1, 0), FeedShape(3, 7, 0), FeedShape(2, 1, 9),
                                         FeedShape(2, 13, 5)])  # fmt: skip
    assert report.passed, report.to_markdown()


@pytest.mark.parametrize("target", [pytest.param("ort-cpu", id="onnxruntime"), pytest.param("trt", id="tensorrt")])
def test_rope_fuses_on_the_slice_and_tensorrt_declines_the_unequal_head_dims(export_cache, target: str) -> None:
    from posenc.graphs import inspect_model, optimize_file
    from posenc.validate import check_ort_parity

    source = _export(export_cache, "precomputed", "float16")
    out = source.with_name(f"{source.stem}.{target}.onnx")
    result = optimize_file(source, out, target, check=check_ort_parity)
    counts = result.counts
    assert counts["fuse_rope"] == 2  # q's rope slice and the shared key slice
    declined = [reason for record in result.passes for reason in record.declined]
    if target == "ort-cpu":
        assert counts["fuse_attention"] == 1
        assert not declined
    else:
        assert counts["fuse_attention"] == 0
        assert declined == [
            "attention: q/k head dim 24 differs from v's 12, and TensorRT's Attention needs one head dim for q, k and v"
        ]
        assert f"left decomposed: {declined[0]}" in inspect_model(out).to_text()
    assert result.parity is not None


def test_engine_builds_ahead_of_time(export_cache) -> None:
    pytest.importorskip("tensorrt_rtx", reason="tensorrt_rtx not installed")
    from posenc.engine import build_engine
    from posenc.graphs import optimize_file

    source = _export(export_cache, "precomputed", "float16")
    fused = source.with_name(f"{source.stem}.engine-trt.onnx")
    optimize_file(source, fused, "trt")
    result = build_engine(fused, export_cache / "mla.engine", targets=["sm89"])
    assert result.manifest.layers.get("ROTARY_EMBEDDING") == 2
    assert result.manifest.engine_bytes > 0
