"""AttentionBlock options against transformers' own modules: projection biases, score scale, soft-cap,
sliding window and q/k RMSNorm (Gemma 2, Gemma 3, Qwen3), and their properties for every registered scheme."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from posenc import AttentionBlock, AttentionConfig, ConfigError, functional, get_spec, scheme_names
from posenc.schemes import Placement, TableMode
from posenc.schemes.base import attention_mask
from tests.conftest import decode_in_steps

GQA = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=64)
SELF_SCALED = ("deberta", "tupe", "transformer_xl")
"""Score schemes whose own position terms are multiplied by the score scale."""


def _transformers():
    return pytest.importorskip("transformers", reason="transformers is the upstream reference")


def _hf_additive_mask(mask_function, length: int) -> torch.Tensor:
    """transformers' mask function evaluated on the (query, key) grid as an additive ``[1, 1, S, S]`` mask."""
    q_idx, kv_idx = torch.arange(length).view(-1, 1), torch.arange(length).view(1, -1)
    allowed = mask_function(0, 0, q_idx, kv_idx)
    return torch.zeros(length, length).masked_fill(~allowed, float("-inf")).view(1, 1, length, length)


def _cos_sin(positions: torch.Tensor, head_dim: int = 16, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``cos, sin [B, S, D]`` in transformers' rotate_half layout (RoPE itself is checked in test_rope)."""
    inv_freq, _ = functional.rope_inv_freq(head_dim, {"rope_theta": theta})
    cos, sin = functional.rope_cos_sin(positions, inv_freq, dtype=torch.float64)
    return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)


def _assert_equals_hf_attention(block: AttentionBlock, hf, length: int, window: int | None) -> None:
    """``block`` and a transformers attention module (float64, eager) on one prefill with transformers' mask."""
    from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function

    x = torch.randn(2, length, 64, dtype=torch.float64)
    cos, sin = _cos_sin(torch.arange(length).expand(2, length))
    function = sliding_window_causal_mask_function(window) if window else causal_mask_function
    with torch.no_grad():
        expected, _ = hf(x, position_embeddings=(cos, sin), attention_mask=_hf_additive_mask(function, length))
        got, _, _ = block(x)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)  # transformers: float32 softmax and norm


def _mode(name: str) -> TableMode:
    return sorted(get_spec(name).table_modes, key=lambda m: m.value)[0]


# --------------------------------------------------------------------------------------------------
# transformers references
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("softcap", "window"), [(0.5, 5), (50.0, None), (None, 3)])
def test_block_equals_gemma2_attention(softcap: float | None, window: int | None) -> None:
    """query_pre_attn_scalar scale, attn_logit_softcapping, sliding window, attention_bias as Gemma 2 has them."""
    transformers = _transformers()
    from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention

    hf_config = transformers.Gemma2Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
        attn_logit_softcapping=softcap, sliding_window=window or 4096, attention_bias=True, num_hidden_layers=1,
        layer_types=["sliding_attention" if window else "full_attention"], max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    hf_config._attn_implementation = "eager"
    hf = Gemma2Attention(hf_config, layer_idx=0).double().eval()
    config = dataclasses.replace(
        GQA, qkv_bias=True, out_bias=True, attn_scale=24**-0.5, logit_softcap=softcap, sliding_window=window
    )
    block = AttentionBlock(config, "rope", {"rope_theta": 10000.0}).double()
    missing, unexpected = block.load_state_dict(hf.state_dict(), strict=False)
    assert not unexpected
    assert all(key.startswith("scheme.") for key in missing)
    assert block.o_proj.bias is not None

    _assert_equals_hf_attention(block, hf, 11, window)


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_qk_rms_norm_equals_qwen3_and_gemma3_attention(family: str) -> None:
    """Per-head RMSNorm of q and k before RoPE; Gemma 3's ``(1 + w)`` weight is stored as ``1 + w``."""
    transformers = _transformers()
    common = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}  # fmt: skip
    if family == "qwen3":
        from transformers.models.qwen3 import modeling_qwen3 as modeling

        hf_config = transformers.Qwen3Config(**common, layer_types=["full_attention"])
        attention, window, scale = modeling.Qwen3Attention, None, None
    else:
        from transformers.models.gemma3 import modeling_gemma3 as modeling

        hf_config = transformers.Gemma3TextConfig(
            **common, layer_types=["sliding_attention"], sliding_window=4, query_pre_attn_scalar=32
        )
        attention, window, scale = modeling.Gemma3Attention, 4, 32**-0.5
    hf_config._attn_implementation = "eager"
    hf = attention(hf_config, layer_idx=0).double().eval()
    with torch.no_grad():
        for norm in (hf.q_norm, hf.k_norm):
            norm.weight.normal_(mean=0.5 if family == "qwen3" else 0.0, std=0.3)
    config = dataclasses.replace(GQA, qk_norm="rms", qk_norm_eps=1e-5, attn_scale=scale, sliding_window=window)
    block = AttentionBlock(config, "rope").double()
    state = hf.state_dict()
    if family == "gemma3":
        state = {k: (1.0 + v if k.endswith("_norm.weight") else v) for k, v in state.items()}
    missing, unexpected = block.load_state_dict(state, strict=False)
    assert not unexpected
    assert all(key.startswith("scheme.") for key in missing)
    assert set(block.state_dict()) >= {"q_norm.weight", "k_norm.weight"}

    _assert_equals_hf_attention(block, hf, 9, window)


def test_head_rms_norm_runs_in_float32_for_half_inputs() -> None:
    block = AttentionBlock(dataclasses.replace(GQA, qk_norm="rms"), "rope")
    with torch.no_grad():
        block.q_norm.weight.normal_()
    x = torch.randn(3, 5, 16) * 300  # fp16 squares overflow (300² · 16 > 65504) unless widened
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + block.q_norm.eps) * block.q_norm.weight.detach()
    half = block.half()
    got = half.q_norm(x.half())
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), want, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("causal", [True, False])
def test_sliding_window_mask_equals_transformers_overlays(causal: bool) -> None:
    _transformers()
    from transformers.masking_utils import sliding_window_causal_mask_function
    from transformers.models.gemma3.modeling_gemma3 import _bidirectional_window_overlay

    for window in (1, 2, 5, 40):
        q_pos, k_pos = torch.arange(30).unsqueeze(0), torch.arange(30).unsqueeze(0)
        got = attention_mask(q_pos, k_pos, causal, window)[0, 0]
        reference = sliding_window_causal_mask_function(window) if causal else _bidirectional_window_overlay(window)
        expected = reference(0, 0, torch.arange(30).view(-1, 1), torch.arange(30).view(1, -1))
        assert torch.equal(got, expected), window
    decode = attention_mask(torch.tensor([[12]]), torch.arange(13).unsqueeze(0), True, 4)
    assert decode[0, 0, 0].nonzero().flatten().tolist() == [9, 10, 11, 12]


# --------------------------------------------------------------------------------------------------
# Every scheme
# --------------------------------------------------------------------------------------------------

SOFTMAX_SCHEMES = [name for name in scheme_names() if name != "rope_linear_attention"]


def _pair(name: str, params: dict | None = None, **options) -> tuple[AttentionBlock, AttentionBlock]:
    """A float64 block without and one with ``options``, same weights (new weights: biases 0.1, norms random)."""
    config = dataclasses.replace(GQA, **options.pop("geometry", {}))
    params = get_spec(name).cases["default"] if params is None else params
    plain = AttentionBlock(config, name, params, _mode(name)).double()
    other = AttentionBlock(dataclasses.replace(config, **options), name, params, _mode(name)).double()
    missing, unexpected = other.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected
    assert all(key in ("o_proj.bias", "q_norm.weight", "k_norm.weight") for key in missing)
    with torch.no_grad():
        for key in missing:
            other.get_parameter(key).normal_(mean=1.0 if "norm" in key else 0.0, std=0.2)
    return plain, other


@pytest.mark.parametrize("name", SOFTMAX_SCHEMES)
def test_attn_scale_replaces_the_scale_of_every_score_term(name: str) -> None:
    """``attn_scale = c · default`` equals scaling q by c (q-linear scores) or scales the scheme's own terms by c."""
    params = {"relative": False} if name == "tupe" else None  # TUPE's T5 term is added unscaled
    default = AttentionBlock(GQA, name, params, _mode(name)).scheme.score_scale()
    plain, scaled = _pair(name, params, attn_scale=1.33 * default)
    factor = scaled.scheme.score_scale() / plain.scheme.score_scale()
    assert factor == pytest.approx(1.33)
    x = torch.randn(2, 8, 64, dtype=torch.float64)
    if name in SELF_SCALED:
        q = torch.randn(2, 4, 8, 16, dtype=torch.float64)
        k = torch.randn(2, 4, 8, 16, dtype=torch.float64)
        positions = torch.arange(8).expand(2, 8)
        torch.testing.assert_close(
            scaled.scheme.bias(q, k, positions, positions), plain.scheme.bias(q, k, positions, positions) * factor
        )
        return
    with torch.no_grad():
        plain.q_proj.weight.mul_(factor)  # scores q·k·scale (and q·(k + a^K), ReRoPE's rotated q·k) are linear in q
    torch.testing.assert_close(scaled(x)[0], plain(x)[0], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", SOFTMAX_SCHEMES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_sliding_window_hides_exactly_the_keys_outside_it(name: str, causal: bool) -> None:
    """Output i depends on token j iff j is inside the window (gradients of the float64 block)."""
    window, length = 3, 9
    _, block = _pair(name, geometry={"causal": causal}, sliding_window=window)
    x = torch.randn(1, length, 64, dtype=torch.float64, requires_grad=True)
    out, probe = block(x)[0], torch.randn(64, dtype=torch.float64)
    rows = [torch.autograd.grad((out[0, i] * probe).sum(), x, retain_graph=True)[0][0] for i in range(length)]
    depends = torch.stack(rows).abs().sum(-1) > 0  # [S (out i), S (in j)]
    i, j = torch.arange(length).view(-1, 1), torch.arange(length).view(1, -1)
    visible = ((j <= i) & (i - j < window)) if causal else ((i - j).abs() < window)
    assert torch.equal(depends, visible)


@pytest.mark.parametrize("name", SOFTMAX_SCHEMES)
def test_soft_cap_bounds_the_logits_and_a_huge_cap_changes_nothing(name: str) -> None:
    plain, huge = _pair(name, logit_softcap=1e9)
    _, capped = _pair(name, logit_softcap=0.5)
    x = torch.randn(2, 8, 64, dtype=torch.float64) * 4
    expected = plain(x)[0]
    torch.testing.assert_close(huge(x)[0], expected, atol=1e-9, rtol=1e-9)
    assert not torch.allclose(capped(x)[0], expected, atol=1e-4)


@pytest.mark.parametrize("name", SOFTMAX_SCHEMES)
def test_decode_with_all_options_equals_full_recompute(name: str) -> None:
    if get_spec(name).length_dependent:
        pytest.skip("length-dependent frequencies: cached keys were encoded for a shorter length by design")
    options = {"sliding_window": 4, "logit_softcap": 2.0, "attn_scale": 0.3, "qk_norm": "rms", "out_bias": True}
    _, block = _pair(name, geometry={"qkv_bias": True}, **options)
    x = torch.randn(2, 10, 64, dtype=torch.float64)
    full, _, _ = block(x)
    torch.testing.assert_close(decode_in_steps(block, x, 6), full, atol=1e-10, rtol=1e-10)


def test_soft_cap_follows_the_score_bias() -> None:
    """cap · tanh((q·k·scale + bias) / cap), then the mask (ALiBi as the bias), written out."""
    config = dataclasses.replace(GQA, num_kv_heads=4, logit_softcap=0.7, attn_scale=0.4)
    block = AttentionBlock(config, "alibi").double()
    x = torch.randn(1, 6, 64, dtype=torch.float64)
    q, k, v = (proj(x).view(1, 6, 4, 16).transpose(1, 2) for proj in (block.q_proj, block.k_proj, block.v_proj))
    i, j = torch.arange(6).view(-1, 1), torch.arange(6).view(1, -1)
    slopes = torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8], dtype=torch.float64).view(-1, 1, 1)
    scores = 0.7 * torch.tanh((q @ k.transpose(-1, -2) * 0.4 + slopes * (j - i)) / 0.7)
    probs = torch.softmax(scores.masked_fill(j > i, float("-inf")), dim=-1)
    expected = block.o_proj((probs @ v).transpose(1, 2).reshape(1, 6, 64))
    torch.testing.assert_close(block(x)[0], expected)


def test_linear_attention_refuses_softmax_options() -> None:
    for option in ({"attn_scale": 0.1}, {"logit_softcap": 30.0}, {"sliding_window": 8}):
        with pytest.raises(ConfigError, match=r"rope_linear_attention has no softmax scores for .*leave them unset"):
            AttentionBlock(dataclasses.replace(GQA, **option), "rope_linear_attention")
    AttentionBlock(dataclasses.replace(GQA, qk_norm="rms", out_bias=True), "rope_linear_attention")


def test_out_bias_and_norm_weights_are_state_dict_keys() -> None:
    block = AttentionBlock(dataclasses.replace(GQA, out_bias=True, qkv_bias=True, qk_norm="rms"), "alibi")
    keys = set(block.state_dict())
    assert {"o_proj.bias", "q_proj.bias", "k_proj.bias", "v_proj.bias", "q_norm.weight", "k_norm.weight"} <= keys
    assert block.q_norm.weight.shape == (16,)
    plain = set(AttentionBlock(GQA, "alibi").state_dict())
    assert not {key for key in plain if key.endswith("bias") or "norm" in key}
    assert math.isclose(block.scheme.score_scale(), 0.25)
    assert get_spec("alibi").placement is Placement.SCORE
