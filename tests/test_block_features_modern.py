"""Block options of today's models against transformers' modules: Llama 4's chunked attention, L2 q/k norm after
complex RoPE and attention-temperature tuning of NoPE layers (``Llama4TextAttention``), HunYuan's weighted q/k
norms after the rotation (``HunYuanDenseV1Attention``), and the options' checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from posenc import AttentionBlock, AttentionConfig, ConfigError, functional
from posenc.schemes.base import attention_mask
from tests.conftest import decode_in_steps

transformers = pytest.importorskip("transformers", reason="transformers is the upstream reference")

BASE = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=64)


def _llama4(layer: int, **settings):
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    hf = transformers.Llama4TextConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=4,
        intermediate_size=64, intermediate_size_mlp=64, vocab_size=96, attention_chunk_size=4, floor_scale=3,
        attn_scale=0.25, **settings,
    )  # fmt: skip
    hf._attn_implementation = "eager"
    attention = Llama4TextAttention(hf, layer_idx=layer).double().eval()
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_(0.0, 0.2)
    return hf, attention


def _mask(q_pos: torch.Tensor, k_pos: torch.Tensor, chunk: int | None) -> torch.Tensor:
    from transformers.masking_utils import and_masks, causal_mask_function, chunked_overlay

    function = causal_mask_function
    if chunk is not None:
        function = and_masks(chunked_overlay(chunk, torch.zeros(1, dtype=torch.int64)), causal_mask_function)
    allowed = function(0, 0, q_pos.view(-1, 1), k_pos.view(1, -1))
    return torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, float("-inf"))[None, None]


def test_chunked_mask_is_transformers_chunked_overlay() -> None:
    positions = torch.arange(11)
    for chunk in (1, 3, 4, 16):
        ours = attention_mask(positions[None], positions[None], True, None, chunk)[0, 0]
        theirs = _mask(positions, positions, chunk)[0, 0] == 0
        assert torch.equal(ours, theirs), chunk
    window_and_chunk = attention_mask(positions[None], positions[None], True, 2, 4)[0, 0]
    assert window_and_chunk.sum(-1).tolist() == [1, 2, 2, 2, 1, 2, 2, 2, 1, 2, 2]  # both limits hold


def test_llama4_rope_layer_equals_the_module() -> None:
    """Complex RoPE (interleaved pairs), L2 q/k norm after it, chunks of 4: the block equals Llama4TextAttention
    on a prefill past a chunk boundary and on decode steps; without the chunks or the norm it does not."""
    hf, attention = _llama4(0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    config = dataclasses.replace(BASE, qk_norm="l2", qk_norm_eps=hf.rms_norm_eps, qk_norm_after_rope=True,
                                 attention_chunk_size=4)  # fmt: skip
    block = AttentionBlock(config, "rope", {"layout": "interleaved"}, table_dtype=torch.float64).double()
    block.load_state_dict(attention.state_dict(), strict=False)
    x = torch.randn(2, 9, 64, dtype=torch.float64)
    positions = torch.arange(9)
    inv_freq, _ = functional.rope_inv_freq(16)
    cos, sin = functional.rope_cos_sin(positions.expand(2, 9), inv_freq, dtype=torch.float64)
    with torch.no_grad():
        want = attention(x, torch.complex(cos, sin), _mask(positions, positions, 4))[0]
    got, _, _ = block(x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)  # transformers: float32 complex rotation
    torch.testing.assert_close(decode_in_steps(block, x, 5), got, atol=1e-10, rtol=1e-10)
    for change in ({"attention_chunk_size": None}, {"qk_norm": "none"}):
        other = AttentionBlock(dataclasses.replace(config, **change), "rope", {"layout": "interleaved"}).double()
        other.load_state_dict(block.state_dict(), strict=False)
        assert (other(x)[0] - want).abs().max() > 1e-3, change


def test_llama4_nope_layer_temperature_equals_the_module() -> None:
    """q scaled by 1 + attn_scale · ln(1 + floor((p + 1) / floor_scale)) before the scores, by position (cache
    length + i in the module), for a prefill and a decode step after a cache."""
    _, attention = _llama4(3)
    assert not attention.use_rope
    config = dataclasses.replace(BASE, temperature_floor_scale=3, temperature_scale=0.25)
    block = AttentionBlock(config, "nope").double()
    block.load_state_dict(attention.state_dict(), strict=False)
    x = torch.randn(2, 10, 64, dtype=torch.float64)
    positions = torch.arange(10)
    with torch.no_grad():
        want = attention(x, None, _mask(positions, positions, None))[0]
        cache = transformers.DynamicCache()
        attention(x[:, :7], None, _mask(positions[:7], positions[:7], None), past_key_values=cache)
        step = attention(x[:, 7:], None, _mask(positions[7:], positions, None), past_key_values=cache)[0]
    got, key, value = block(x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    _, key, value = block(x[:, :7])
    torch.testing.assert_close(block(x[:, 7:], past_key=key, past_value=value)[0], step, atol=1e-6, rtol=1e-6)
    plain = AttentionBlock(BASE, "nope").double()
    plain.load_state_dict(block.state_dict())
    assert (plain(x)[0] - want).abs().max() > 1e-3  # the temperature matters from position 2 on


def test_hunyuan_norms_after_the_rotation_equal_the_module_and_the_order_matters() -> None:
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import HunYuanDenseV1Attention

    hf = transformers.HunYuanDenseV1Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=2,
        intermediate_size=64, vocab_size=96, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    hf._attn_implementation = "eager"
    attention = HunYuanDenseV1Attention(hf, layer_idx=0).double().eval()
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_(0.0, 0.2)
    state = dict(attention.state_dict())
    state["q_norm.weight"], state["k_norm.weight"] = state["query_layernorm.weight"], state["key_layernorm.weight"]
    config = dataclasses.replace(BASE, qk_norm="rms", qk_norm_eps=hf.rms_norm_eps, qk_norm_after_rope=True)
    block = AttentionBlock(config, "rope", table_dtype=torch.float64).double()
    block.load_state_dict(state, strict=False)
    x = torch.randn(2, 8, 64, dtype=torch.float64)
    positions = torch.arange(8)
    inv_freq, _ = functional.rope_inv_freq(16)
    cos, sin = functional.rope_cos_sin(positions.expand(2, 8), inv_freq, dtype=torch.float64)
    embeddings = (torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))
    with torch.no_grad():
        want = attention(x, embeddings, _mask(positions, positions, None))[0]
    torch.testing.assert_close(block(x)[0], want, atol=1e-6, rtol=1e-6)
    before = AttentionBlock(dataclasses.replace(config, qk_norm_after_rope=False), "rope").double()
    before.load_state_dict(block.state_dict(), strict=False)
    assert (before(x)[0] - want).abs().max() > 1e-4  # weighted norms do not commute with the rotation


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("attention_chunk_size", 0, r"attention_chunk_size must be an int >= 1"),
        ("temperature_floor_scale", 2.5, r"temperature_floor_scale must be an int >= 1"),
        ("temperature_scale", -0.1, r"temperature_scale must be a finite number > 0"),
        ("qk_norm_after_rope", 1, r"qk_norm_after_rope must be True or False"),
    ],
)
def test_bad_options_raise(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(BASE, **{field: value})


# --------------------------------------------------------------------------------------------------
# Sinks, output gates, full-width q/k norms, position-scaled queries, q/k LayerNorm (issue 22)
# --------------------------------------------------------------------------------------------------


def _module(path: str, config, layer: int = 0, **arguments):
    """A transformers attention module (float64, eager) with N(0, 0.2) weights."""
    import importlib

    module_name, _, name = path.rpartition(".")
    config._attn_implementation = "eager"
    attention = getattr(importlib.import_module(f"transformers.models.{module_name}"), name)(
        config, layer_idx=layer, **arguments
    )
    attention = attention.double().eval()
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_(0.0, 0.2)
        if getattr(attention, "sinks", None) is not None:
            attention.sinks.normal_(0.0, 1.0)
    return attention


_TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "num_hidden_layers": 2, "intermediate_size": 64, "vocab_size": 96}  # fmt: skip


def _embeddings(positions: torch.Tensor, rotary: int = 16, half: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq, _ = functional.rope_inv_freq(rotary)
    cos, sin = functional.rope_cos_sin(positions.expand(2, -1), inv_freq, dtype=torch.float64)
    return (cos, sin) if half else (torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))


def _block(config: AttentionConfig, state: dict, scheme: str = "rope", **params: object) -> AttentionBlock:
    block = AttentionBlock(config, scheme, params or None, table_dtype=torch.float64).double()
    missing = [k for k in block.state_dict() if k not in state and not k.startswith("scheme.")]
    assert not missing, missing
    block.load_state_dict(state, strict=False)
    return block.eval()


def _changed(block: AttentionBlock, x: torch.Tensor, want: torch.Tensor, params=None, **change: object) -> float:
    """How far a block with one option changed (same weights where they exist) lands from ``want``."""
    other = AttentionBlock(dataclasses.replace(block.config, **change), "rope", params).double()
    other.load_state_dict(block.state_dict(), strict=False)
    with torch.no_grad():
        return float((other(x)[0] - want).abs().max())


def test_sinks_equal_gpt_oss_and_granite_swa_forms_and_every_cache_path() -> None:
    """gpt-oss appends the sink column to the logits; Granite SWA scales the output by sigmoid(lse - sink): one
    block option equals both modules (sliding window 4, past it), decode in steps and the in-place cache alike."""
    hf = transformers.GptOssConfig(**_TINY, num_local_experts=2, sliding_window=4, attention_bias=True,
                                   layer_types=["sliding_attention", "full_attention"])  # fmt: skip
    gpt_oss = _module("gpt_oss.modeling_gpt_oss.GptOssAttention", hf)
    config = dataclasses.replace(BASE, qkv_bias=True, out_bias=True, sliding_window=4, attention_sinks=True)
    block = _block(config, gpt_oss.state_dict())
    x = torch.randn(2, 9, 64, dtype=torch.float64)
    positions = torch.arange(9)
    mask = (
        _mask(positions, positions, None)
        + torch.where(  # transformers' sliding-window overlay: q - k < 4
            positions[None, :] > positions[:, None] - 4, 0.0, float("-inf")
        ).double()[None, None]
    )
    with torch.no_grad():
        want = gpt_oss(x, _embeddings(positions, half=True), mask)[0]
        got = block(x)[0]
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(decode_in_steps(block, x, 5), got, atol=1e-10, rtol=1e-10)
    cache = torch.zeros(2, 2, 12, 16, dtype=torch.float64)
    with torch.no_grad():
        first, keys, values = block.forward_in_place(x[:, :5], None, cache, cache.clone(), torch.tensor([0, 0]))
        rest, _, _ = block.forward_in_place(x[:, 5:], None, keys, values, torch.tensor([5, 5]))
    torch.testing.assert_close(torch.cat((first, rest), 1), got, atol=1e-10, rtol=1e-10)
    assert _changed(block, x, want, attention_sinks=False) > 1e-2

    granite = transformers.GraniteSWAConfig(**_TINY, attention_multiplier=0.25, sliding_window=4,
                                            layer_types=["sliding_attention", "full_attention"])  # fmt: skip
    swa = _module("granite_swa.modeling_granite_swa.GraniteSWAAttention", granite)
    block = _block(dataclasses.replace(BASE, attn_scale=0.25, sliding_window=4, attention_sinks=True),
                   swa.state_dict())  # fmt: skip
    with torch.no_grad():
        want = swa(x, _embeddings(positions), mask)[0]
    torch.testing.assert_close(block(x)[0], want, atol=1e-6, rtol=1e-6)  # transformers: float32 softmax


@pytest.mark.parametrize("gating", ["per-head", "per-element"])
def test_softplus_gate_equals_laguna(gating: str) -> None:
    """Laguna's softplus gate (one value per head, or per output element), from g_proj of the block's input."""
    hf = transformers.LagunaConfig(**_TINY, gating=gating, num_experts=2, moe_intermediate_size=32,
                                   shared_expert_intermediate_size=32)  # fmt: skip
    laguna = _module("laguna.modeling_laguna.LagunaAttention", hf, num_heads=4)
    state = dict(laguna.state_dict())
    state["gate_proj.weight"] = state.pop("g_proj.weight")
    config = dataclasses.replace(BASE, qk_norm="rms", qk_norm_eps=hf.rms_norm_eps, output_gate="softplus",
                                 output_gate_per_head=gating == "per-head")  # fmt: skip
    block = _block(config, state, partial_rotary_factor=0.5)  # Laguna's full layers rotate half of each head
    x = torch.randn(2, 7, 64, dtype=torch.float64)
    positions = torch.arange(7)
    with torch.no_grad():
        want = laguna(x, _embeddings(positions, rotary=8), _mask(positions, positions, None))[0]
    # transformers: the gate's softplus and the q/k norms in float32
    torch.testing.assert_close(block(x)[0], want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(decode_in_steps(block, x, 4), block(x)[0], atol=1e-10, rtol=1e-10)
    half = {"partial_rotary_factor": 0.5}
    assert _changed(block, x, want, half, output_gate="sigmoid") > 1e-2  # the activation matters


def test_sigmoid_gate_in_q_proj_equals_qwen3_next() -> None:
    """Qwen3-Next's q_proj holds each head's query rows, then its gate rows: split by the checkpoint rule, the block's
    sigmoid gate equals the module."""
    from posenc.checkpoints.plan import LayerPlan
    from posenc.checkpoints.rotary import split_packed_gate

    hf = transformers.Qwen3NextConfig(**_TINY, attention_bias=True, layer_types=["full_attention"] * 2,
                                      num_experts=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                       "partial_rotary_factor": 1.0})  # fmt: skip
    qwen = _module("qwen3_next.modeling_qwen3_next.Qwen3NextAttention", hf)
    config = dataclasses.replace(BASE, qkv_bias=True, out_bias=True, qk_norm="rms", qk_norm_eps=hf.rms_norm_eps,
                                 output_gate="sigmoid")  # fmt: skip
    state = dict(qwen.state_dict())
    plan = LayerPlan(config, "rope", {}, 0)
    state["q_proj.weight"], state["gate_proj.weight"] = split_packed_gate([state["q_proj.weight"]], plan)
    state["q_proj.bias"], state["gate_proj.bias"] = split_packed_gate([state["q_proj.bias"]], plan)
    state["q_norm.weight"], state["k_norm.weight"] = 1.0 + state["q_norm.weight"], 1.0 + state["k_norm.weight"]
    block = _block(config, state)
    x = torch.randn(2, 7, 64, dtype=torch.float64)
    positions = torch.arange(7)
    with torch.no_grad():
        want = qwen(x, _embeddings(positions), _mask(positions, positions, None))[0]
    torch.testing.assert_close(block(x)[0], want, atol=1e-6, rtol=1e-6)  # transformers: q/k norms in float32
    assert _changed(block, x, want, output_gate="none") > 1e-2


def test_full_width_qk_norm_equals_olmo2_and_differs_from_per_head() -> None:
    hf = transformers.Olmo2Config(**_TINY)
    olmo = _module("olmo2.modeling_olmo2.Olmo2Attention", hf)
    config = dataclasses.replace(BASE, qk_norm="rms", qk_norm_eps=hf.rms_norm_eps, qk_norm_full_width=True)
    block = _block(config, olmo.state_dict())
    x = torch.randn(2, 7, 64, dtype=torch.float64)
    positions = torch.arange(7)
    with torch.no_grad():
        want = olmo(x, _embeddings(positions), _mask(positions, positions, None))[0]
    torch.testing.assert_close(block(x)[0], want, atol=1e-6, rtol=1e-6)  # transformers: q/k norms in float32
    assert tuple(block.state_dict()["q_norm.weight"].shape) == (64,)
    assert tuple(block.state_dict()["k_norm.weight"].shape) == (32,)
    per_head = AttentionBlock(dataclasses.replace(config, qk_norm_full_width=False), "rope").double()
    per_head.load_state_dict({k: v for k, v in block.state_dict().items() if "norm" not in k}, strict=False)
    assert (per_head(x)[0] - want).abs().max() > 1e-3


def test_llama_4_scaling_equals_ministral3_from_position_zero() -> None:
    """Ministral 3 scales q by 1 + β·ln(1 + floor(p / original)): Llama 4's temperature with offset 0 (offset 1
    moves the step one position earlier)."""
    rope = {"rope_type": "default", "rope_theta": 10000.0, "original_max_position_embeddings": 3,
            "llama_4_scaling_beta": 0.5}  # fmt: skip
    hf = transformers.Ministral3Config(**_TINY, rope_parameters=rope)
    ministral = _module("ministral3.modeling_ministral3.Ministral3Attention", hf)
    config = dataclasses.replace(BASE, temperature_floor_scale=3, temperature_scale=0.5, temperature_offset=0)
    block = _block(config, ministral.state_dict())
    x = torch.randn(2, 10, 64, dtype=torch.float64)
    positions = torch.arange(10)
    with torch.no_grad():
        want = ministral(x, _embeddings(positions), _mask(positions, positions, None), positions.expand(2, 10))[0]
    torch.testing.assert_close(block(x)[0], want, atol=1e-6, rtol=1e-6)  # transformers: float32 softmax
    torch.testing.assert_close(decode_in_steps(block, x, 6), block(x)[0], atol=1e-10, rtol=1e-10)
    assert _changed(block, x, want, temperature_offset=1) > 1e-3


def test_qk_layernorm_equals_phi() -> None:
    hf = transformers.PhiConfig(**{**_TINY, "num_key_value_heads": 4}, qk_layernorm=True,
                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                 "partial_rotary_factor": 0.5})  # fmt: skip
    phi = _module("phi.modeling_phi.PhiAttention", hf)
    state = {k.replace("dense", "o_proj").replace("_layernorm", "_norm"): v for k, v in phi.state_dict().items()}
    config = dataclasses.replace(BASE, num_kv_heads=4, qkv_bias=True, out_bias=True, qk_norm="layer",
                                 qk_norm_eps=hf.layer_norm_eps)  # fmt: skip
    block = _block(config, state, partial_rotary_factor=0.5)
    x = torch.randn(2, 7, 64, dtype=torch.float64)
    positions = torch.arange(7)
    with torch.no_grad():
        want = phi(x, _embeddings(positions, rotary=8), _mask(positions, positions, None))[0]
    torch.testing.assert_close(block(x)[0], want, atol=1e-6, rtol=1e-6)  # transformers: float32 softmax
    assert _changed(block, x, want, {"partial_rotary_factor": 0.5}, qk_norm="rms") > 1e-3  # mean removed, bias added


def test_value_norm_and_values_from_keys_equal_gemma4_and_every_cache_path() -> None:
    """Gemma 4's attention_k_eq_v layer: the values are k_proj's output before k_norm and the rotation, normalised by
    an RMSNorm without weights; scale 1. The block (no v_proj) equals the module, decode in steps and the in-place
    cache alike, and without the value norm it does not."""
    hf = transformers.Gemma4TextConfig(**_TINY, global_head_dim=16, attention_k_eq_v=True,
                                       layer_types=["sliding_attention", "full_attention"],
                                       vocab_size_per_layer_input=96, hidden_size_per_layer_input=16)  # fmt: skip
    gemma4 = _module("gemma4.modeling_gemma4.Gemma4TextAttention", hf, layer=1)
    assert gemma4.v_proj is None
    config = dataclasses.replace(BASE, attn_scale=1.0, qk_norm="rms", qk_norm_eps=hf.rms_norm_eps, v_norm=True,
                                 values_from_keys=True)  # fmt: skip
    block = _block(config, gemma4.state_dict())
    assert "v_proj.weight" not in block.state_dict()
    x = torch.randn(2, 7, 64, dtype=torch.float64)
    positions = torch.arange(7)
    with torch.no_grad():
        want = gemma4(x, _embeddings(positions), _mask(positions, positions, None), shared_kv_states={})[0]
        got = block(x)[0]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)  # transformers: the norms in float32
    torch.testing.assert_close(decode_in_steps(block, x, 4), got, atol=1e-10, rtol=1e-10)
    cache = torch.zeros(2, 2, 9, 16, dtype=torch.float64)
    with torch.no_grad():
        first, keys, values = block.forward_in_place(x[:, :4], None, cache, cache.clone(), torch.tensor([0, 0]))
        rest, _, _ = block.forward_in_place(x[:, 4:], None, keys, values, torch.tensor([4, 4]))
    torch.testing.assert_close(torch.cat((first, rest), 1), got, atol=1e-10, rtol=1e-10)
    assert _changed(block, x, want, v_norm=False) > 1e-2


def test_values_narrower_than_keys_equal_mimo_v2_flash_and_every_cache_path() -> None:
    """MiMo-V2-Flash's full layer: values 8 wide against 16-wide keys (``v_proj [Hkv·8, E]``, ``o_proj [E, H·8]``);
    the block with ``v_head_dim=8`` equals the module (its value scale 1, full rotation), decode in steps and the
    in-place cache (a value cache 8 wide) alike; the value width cannot differ from the keys' where values are keys."""
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}
    kinds = {"layer_types": ["full_attention", "sliding_attention"],
             "rope_parameters": {"full_attention": rope, "sliding_attention": rope}}  # fmt: skip
    hf = transformers.MiMoV2FlashConfig(**_TINY, **kinds, v_head_dim=8, attention_value_scale=None, n_routed_experts=2)
    mimo = _module("mimo_v2_flash.modeling_mimo_v2_flash.MiMoV2FlashAttention", hf)
    config = dataclasses.replace(BASE, v_head_dim=8)
    block = _block(config, mimo.state_dict())
    assert tuple(block.v_proj.weight.shape) == (16, 64)
    x = torch.randn(2, 7, 64, dtype=torch.float64)
    positions = torch.arange(7)
    with torch.no_grad():
        want = mimo(x, _embeddings(positions), _mask(positions, positions, None))[0]
        got, key, value = block(x)
    assert (key.shape[-1], value.shape[-1]) == (16, 8)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(decode_in_steps(block, x, 4), got, atol=1e-10, rtol=1e-10)
    keys, values = torch.zeros(2, 2, 9, 16, dtype=torch.float64), torch.zeros(2, 2, 9, 8, dtype=torch.float64)
    with torch.no_grad():
        first, keys, values = block.forward_in_place(x[:, :4], None, keys, values, torch.tensor([0, 0]))
        rest, _, _ = block.forward_in_place(x[:, 4:], None, keys, values, torch.tensor([4, 4]))
    torch.testing.assert_close(torch.cat((first, rest), 1), got, atol=1e-10, rtol=1e-10)
    with pytest.raises(ConfigError, match=r"v_head_dim 8 cannot differ from head_dim there"):
        dataclasses.replace(config, values_from_keys=True)
    with pytest.raises(ConfigError, match=r"v_head_dim must be a positive int"):
        dataclasses.replace(config, v_head_dim=0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"v_norm": 1}, r"v_norm must be True or False"),
        ({"values_from_keys": "yes"}, r"values_from_keys must be True or False"),
        ({"output_gate": "tanh"}, r"output_gate must be one of \['none', 'sigmoid', 'softplus'\]"),
        ({"output_gate_per_head": True}, r"output_gate_per_head needs an output_gate"),
        ({"qk_norm": "l2", "qk_norm_full_width": True}, r"qk_norm_full_width .* needs qk_norm='rms'"),
        ({"qk_norm": "rms", "qk_norm_after_rope": True, "qk_norm_full_width": True}, r"without qk_norm_after_rope"),
        ({"temperature_offset": -1}, r"temperature_offset must be an int >= 0"),
        ({"attention_sinks": 1}, r"attention_sinks must be True or False"),
        ({"qk_norm": "group"}, r"qk_norm must be one of \['none', 'rms', 'l2', 'layer'\]"),
    ],
)
def test_bad_new_options_raise(change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(BASE, **change)


def test_a_gated_block_needs_its_gate_input() -> None:
    block = AttentionBlock(dataclasses.replace(BASE, output_gate="sigmoid"), "rope")
    q = torch.randn(1, 4, 3, 16)
    kv = torch.randn(1, 2, 3, 16)
    with pytest.raises(ConfigError, match=r"pass gate=block.gate\(hidden, position_ids\)"):
        block.attend(q, kv, kv, torch.arange(3)[None], torch.arange(3)[None])
