"""MiMo-V2-Flash (posenc.checkpoints.families.mimo): values narrower than keys, sinks and twice the kv heads on sliding
layers, partial RoPE per layer type, values scaled by ``attention_value_scale``.

On the tiny seeded sample (``posenc.checkpoints.samples`` ``mimo-v2-flash-*``: a full layer with one kv head, then a
sliding layer with two, 24-wide keys of which 8 features rotate, 16-wide values, q/k/v biases), each layer kind's
block equals transformers' ``MiMoV2FlashAttention`` within 1e-5 (a prompt, a prompt at 100, a decode step, the
context's end against the module fed float64 angles: tests/checkpoints/parity.py ``block_errors``), and that
reference reproduces the module as ``MiMoV2FlashModel`` drives it (forward hooks, tests/checkpoints/whole_model.py).
The checks can fail: each feature left out of the block (the value scale, the sinks, the window, the layer type's
theta) is caught against the module. The slow run exports both kinds through the CLI in both cache layouts, optimizes
them for ONNX Runtime CPU and TensorRT and validates them against the module (tests/checkpoints/test_families.py and
test_sample_targets.py run the samples' matrix there too).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from posenc.blocks import AttentionBlock
from posenc.checkpoints import load_layer
from posenc.checkpoints.families.mimo import geometry
from posenc.checkpoints.load import load_state
from posenc.checkpoints.reference import hf_config
from posenc.cli import main
from posenc.graphs import inspect_model
from tests.checkpoints.parity import ATOL, block_errors, changed_block_error, sample_case
from tests.checkpoints.whole_model import model_steps, reference_error

transformers = pytest.importorskip("transformers")

KINDS = {
    "full_attention": (0, 1, 5e6, None, False),
    "sliding_attention": (1, 2, 1e4, 4, True),
}
"""layer kind -> (the sample's layer of it, kv heads, RoPE theta, window, sinks)."""


@pytest.fixture
def checkpoint(export_cache: Path) -> Path:
    """The sample, built once per session (shared with test_families.py and test_sample_targets.py)."""
    return sample_case("mimo-v2-flash-sliding", export_cache).folder


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_layer_is_its_own_module(checkpoint: Path, kind: str) -> None:
    loaded = load_layer(checkpoint, None, kind)
    layer, kv_heads, theta, window, sinks = KINDS[kind]
    plan, config = loaded.plan, loaded.plan.attention
    assert (plan.layer, plan.scheme, plan.params) == (
        layer,
        "rope",
        {"rope_theta": theta, "partial_rotary_factor": 0.334},
    )
    assert (config.head_dim, config.v_head_dim, config.value_dim, config.num_kv_heads) == (24, 16, 16, kv_heads)
    assert (config.sliding_window, config.attention_sinks, config.qkv_bias, config.out_bias) == (
        window,
        sinks,
        True,
        False,
    )
    assert tuple(loaded.state["v_proj.weight"].shape) == (kv_heads * 16, 64)
    assert tuple(loaded.state["o_proj.weight"].shape) == (64, 4 * 16)
    errors = block_errors(loaded)
    assert max(errors.values()) <= ATOL, errors
    assert reference_error(loaded.reference(), model_steps(checkpoint, layer, None)) <= ATOL


def _error_with(loaded, **state) -> float:
    """Max |block - module| at positions 100..106 with some of the block's tensors replaced."""
    block = AttentionBlock(loaded.plan.attention, loaded.plan.scheme, loaded.plan.params).eval()
    load_state(block, {**loaded.state, **state}, loaded.location)
    hidden = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(3))
    positions = torch.arange(100, 107).expand(2, 7)
    with torch.no_grad():
        got = block(hidden, positions)[0]
    return float((got - loaded.reference()(hidden, positions)[0]).abs().max())


def test_each_feature_left_out_is_caught(checkpoint: Path) -> None:
    sliding = load_layer(checkpoint, None, "sliding_attention")
    assert changed_block_error(sliding) <= ATOL
    assert changed_block_error(sliding, sliding_window=None) > 100 * ATOL
    assert changed_block_error(sliding, rope_theta=5e6) > 100 * ATOL
    stored = {name: loaded for name, loaded in sliding.tensors.items() if name.startswith("v_proj.")}
    assert _error_with(sliding, **stored) > 100 * ATOL  # v_proj as stored: the value scale left out
    assert _error_with(sliding, sinks=torch.full((4,), -1e4)) > 100 * ATOL  # sinks that take no weight
    full = load_layer(checkpoint, None, "full_attention")
    assert changed_block_error(full, rope_theta=1e4) > 100 * ATOL


def test_a_released_config_plans_every_layer() -> None:
    """transformers' default MiMo-V2-Flash config (its released geometry: 64 heads of 192, values 128, 4 kv heads on
    full layers and 8 on sliding ones, window 129, 64 of 192 features rotate, thetas 5e6 / 1e4), cut to 6 layers."""
    hf = hf_config({"model_type": "mimo_v2_flash", "num_hidden_layers": 6})
    plans = [geometry(hf, layer, None) for layer in range(6)]
    full = [0, 5]
    assert [p.layer_type == "full_attention" for p in plans] == [layer in full for layer in range(6)]
    for layer, plan in enumerate(plans):
        config, sliding = plan.attention, layer not in full
        assert (config.num_heads, config.head_dim, config.value_dim) == (64, 192, 128)
        assert (config.num_kv_heads, config.attention_sinks) == ((8, True) if sliding else (4, False))
        assert config.sliding_window == (129 if sliding else None)
        assert plan.params == {"rope_theta": 1e4 if sliding else 5e6, "partial_rotary_factor": 0.334}
        assert plan.layout == ("v_scale=0.707",)


@pytest.mark.slow  # CLI exports (about 20 s each on 2 shared cores); the eager tests above prove the block by default
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_exports_fuse_and_validate_against_the_module(checkpoint: Path, kind: str, tmp_path: Path) -> None:
    """Both cache layouts: the concatenated graph validates against the module (``--against-hf``); on ort-cpu the
    partial rotations fuse, the attention fuses (the sliding layer's sinks as a zero key), a first prompt runs on
    GroupQueryAttention with the values zero-padded to the keys' width (validated against the module), the in-place
    graph decodes over its cache (``decode_over_cache``) and passes ``validate --decode``; on TensorRT the rotations
    fuse and the attention stays decomposed, the reason named (its Attention layer takes one head width)."""
    layer = str(KINDS[kind][0])
    concat, inplace = tmp_path / "concat.onnx", tmp_path / "inplace.onnx"
    assert main(["export", "--hf-model", str(checkpoint), "--layer", layer, "-o", str(concat)]) == 0
    assert main(["validate", str(concat), "--against-hf", str(checkpoint)]) == 0
    assert (
        main(["export", "--hf-model", str(checkpoint), "--layer", layer, "--kv-cache", "inplace", "-o", str(inplace)])
        == 0
    )
    for source in (concat, inplace):
        for target in ("ort-cpu", "trt"):
            out = source.with_suffix(f".{target}.onnx")
            if source == inplace and target == "trt" and kind == "sliding_attention":  # a ring: TensorRT refuses
                assert main(["optimize", str(source), "--target", target, "-o", str(out)]) == 2
                continue
            assert main(["optimize", str(source), "--target", target, "-o", str(out)]) == 0
            text = inspect_model(out).to_text()
            assert "fuse_rope 2" in text, text
            assert "fuse_partial_rope 2" in text, text
            if target == "trt":
                assert "fuse_attention" not in text, text
                assert "TensorRT's Attention needs one head dim" in text, text
            elif source == concat:  # the first prompt on GroupQueryAttention, the values zero-padded to 24
                assert "fuse_attention 1" in text, text
                assert "prefill_over_gqa 1" in text, text
            else:
                assert "decode_over_cache 1" in text, text
    assert main(["validate", str(concat.with_suffix(".ort-cpu.onnx")), "--against-hf", str(checkpoint)]) == 0
    fused = str(inplace.with_suffix(".ort-cpu.onnx"))
    assert main(["validate", fused, "--decode", "--against-hf", str(checkpoint)]) == 0  # the sliding layer's ring
    ring = json.loads(inplace.with_suffix(".manifest.json").read_text()).get("cache_ring", False)  # absent: off
    assert ring is (kind == "sliding_attention")
