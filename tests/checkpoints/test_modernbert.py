"""ModernBERT (posenc.checkpoints.families.modernbert): a rotary encoder with a fused ``Wqkv``, bidirectional
sliding-window layers between global ones, and a RoPE theta per layer kind.

On the tiny seeded sample (``posenc.checkpoints.samples`` ``modernbert-*``: a global layer, then two local ones of
±2 tokens), each layer kind's block equals transformers' ``ModernBertAttention`` within 1e-5 (a prompt, a prompt at
100, the context's end against the module fed float64 angles: tests/checkpoints/parity.py ``block_errors``), and that
reference reproduces the module as ``ModernBertModel`` drives it (forward hooks, tests/checkpoints/whole_model.py).
The checks can fail: the other kind's theta, or transformers' half-window read as the block's exclusive bound, are
caught against the module and the whole model. tests/checkpoints/test_families.py exports the samples through the
CLI and ONNX Runtime (both table modes, positions near the context length).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from posenc.checkpoints import load_layer
from posenc.checkpoints.families.modernbert import geometry
from posenc.checkpoints.reference import hf_config
from posenc.engine.build import engine_profiles
from posenc.errors import ConfigError
from posenc.export import load_manifest
from posenc.graphs import load_model, optimize_model
from posenc.graphs.cache import CacheFacts
from tests.checkpoints.parity import ATOL, block_errors, changed_block_error, export_layer, sample_case
from tests.checkpoints.whole_model import model_steps, reference_error

transformers = pytest.importorskip("transformers")

KINDS = {"full_attention": (0, 160000.0, None), "sliding_attention": (1, 10000.0, 3)}
"""layer kind -> (its first layer in the sample, RoPE theta, the block's window: |q - k| < 3 is transformers'
|q - k| <= local_attention // 2 = 2)."""


@pytest.fixture
def checkpoint(export_cache: Path) -> Path:
    """The sample, built once per session (shared with test_families.py and test_sample_targets.py)."""
    return sample_case("modernbert-local", export_cache).folder


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_layer_is_its_own_module(checkpoint: Path, kind: str) -> None:
    loaded = load_layer(checkpoint, None, kind)
    layer, theta, window = KINDS[kind]
    plan, config = loaded.plan, loaded.plan.attention
    assert (plan.layer, plan.scheme, plan.params["rope_theta"], config.sliding_window) == (layer, "rope", theta, window)
    assert (config.causal, plan.decoder, config.qkv_bias, config.out_bias) == (False, False, True, True)
    errors = block_errors(loaded)
    assert max(errors.values()) <= ATOL, errors
    assert reference_error(loaded.reference(), model_steps(checkpoint, layer, None)) <= ATOL


def test_the_other_kinds_theta_and_an_exclusive_half_window_are_caught(checkpoint: Path) -> None:
    full = load_layer(checkpoint, None, "full_attention")
    assert changed_block_error(full) <= ATOL
    assert changed_block_error(full, rope_theta=10000.0) > 100 * ATOL
    local = load_layer(checkpoint, None, "sliding_attention")
    assert changed_block_error(local) <= ATOL
    assert changed_block_error(local, rope_theta=160000.0) > 100 * ATOL
    assert changed_block_error(local, sliding_window=2) > 100 * ATOL
    # the window as the model masks it, not only as posenc's reference does
    half = dataclasses.replace(local.plan, config=dataclasses.replace(local.plan.attention, sliding_window=2))
    steps = model_steps(checkpoint, 1, None)
    assert reference_error(local.reference(), steps) <= ATOL
    assert reference_error(dataclasses.replace(local, plan=half).reference(), steps) > 100 * ATOL


def test_a_released_config_json_plans_every_layer() -> None:
    """ModernBERT-base's config.json keys (global_attn_every_n_layers, global/local_rope_theta, local_attention)."""
    hf = hf_config({"model_type": "modernbert", "hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 6,
                    "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0, "local_rope_theta": 10000.0,
                    "local_attention": 128, "max_position_embeddings": 8192})  # fmt: skip
    plans = [geometry(hf, layer, None) for layer in range(6)]
    assert [p.attention.sliding_window for p in plans] == [None, 65, 65, None, 65, 65]
    assert [p.params["rope_theta"] for p in plans] == [160000.0, 10000.0, 10000.0] * 2
    assert {(p.attention.head_dim, p.attention.max_position_embeddings, p.attention.causal) for p in plans} == {
        (64, 8192, False)
    }
    with pytest.raises(ConfigError, match="not 'full_attention'"):
        geometry(hf, 1, "full_attention")


def test_an_encoder_layer_takes_no_cache(checkpoint: Path) -> None:
    loaded = load_layer(checkpoint, 1)
    past = torch.zeros(1, 4, 3, 16)
    with pytest.raises(ConfigError, match="encoder layers: they take no cache"):
        loaded.reference()(torch.zeros(1, 1, 64), torch.full((1, 1), 3), past, past)


@pytest.mark.parametrize("target", ["ort-cpu", "trt"], ids=["ort-cpu", "tensorrt-graph"])  # a graph rewrite: no GPU
def test_rotation_and_windowed_attention_fuse(export_cache: Path, target: str) -> None:
    """Both rotations and the attention (its window as the mask) fuse; ONNX Runtime's causal GroupQueryAttention
    prompt path is declined with the reason, and an engine of the layer has no decode profile."""
    case = sample_case("modernbert-local", export_cache)
    path = export_layer(case, case.folder.parent, "precomputed")
    manifest = load_manifest(path)
    result = optimize_model(load_model(path), target, facts=CacheFacts.of(manifest))
    counts = result.counts
    assert (counts["fuse_rope"], counts["fuse_attention"]) == (2, 1)
    declined = {record.name: record.skipped for record in result.passes if record.skipped}
    if target == "ort-cpu":
        assert counts["prefill_over_gqa"] == 0
        assert "bidirectional" in declined["prefill_over_gqa"]
    assert list(engine_profiles(manifest)) == ["prefill"]
