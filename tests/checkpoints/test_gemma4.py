"""Gemma 4 (posenc.checkpoints.families.gemma4): p-RoPE full layers with their own head width and keys as values,
sliding layers with default RoPE, per-head q/k norms, a value norm without weights, score scale 1.

On the tiny seeded sample (``posenc.checkpoints.samples`` ``gemma4-*``: two sliding layers 16 wide, then a full layer
32 wide with one kv head and ``attention_k_eq_v``), each layer kind's block equals transformers'
``Gemma4TextAttention`` within 1e-5 (a prompt, a prompt at 100, a decode step, the context's end against the module
fed float64 angles: tests/checkpoints/parity.py ``block_errors``), and that reference reproduces the module as
``Gemma4TextModel`` drives it (forward hooks, tests/checkpoints/whole_model.py). The checks can fail: each feature
left out of the block (the value norm, the score scale, the window, the full layers' theta) is caught against the
module. tests/checkpoints/test_families.py and test_sample_targets.py export the samples through the CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from posenc.checkpoints import load_layer
from posenc.checkpoints.families.gemma4 import geometry, kv_producer
from posenc.checkpoints.reference import hf_config
from posenc.errors import ConfigError
from posenc.export import load_manifest
from posenc.graphs import load_model, optimize_model
from posenc.graphs.cache import CacheFacts
from tests.checkpoints.parity import ATOL, block_errors, changed_block_error, export_layer, sample_case
from tests.checkpoints.whole_model import model_steps, reference_error

transformers = pytest.importorskip("transformers")

KINDS = {
    "sliding_attention": (0, "rope", 16, 2, 4, False),
    "full_attention": (2, "rope_proportional", 32, 1, None, True),
}
"""layer kind -> (the sample's first layer of it, scheme, head width, kv heads, window, values from keys)."""


@pytest.fixture
def checkpoint(export_cache: Path) -> Path:
    """The sample, built once per session (shared with test_families.py and test_sample_targets.py)."""
    return sample_case("gemma4-full", export_cache).folder


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_layer_is_its_own_module(checkpoint: Path, kind: str) -> None:
    loaded = load_layer(checkpoint, None, kind)
    layer, scheme, width, kv_heads, window, from_keys = KINDS[kind]
    plan, config = loaded.plan, loaded.plan.attention
    assert (plan.layer, plan.scheme, config.head_dim, config.num_kv_heads) == (layer, scheme, width, kv_heads)
    assert (config.sliding_window, config.values_from_keys, config.v_norm) == (window, from_keys, True)
    assert (config.attn_scale, config.qk_norm, config.causal) == (1.0, "rms", True)
    assert ("v_proj.weight" in loaded.state) != from_keys
    errors = block_errors(loaded)
    assert max(errors.values()) <= ATOL, errors
    assert reference_error(loaded.reference(), model_steps(checkpoint, layer, None)) <= ATOL


def test_each_feature_left_out_is_caught(checkpoint: Path) -> None:
    full = load_layer(checkpoint, None, "full_attention")
    assert changed_block_error(full) <= ATOL
    for change in ({"v_norm": False}, {"attn_scale": None}, {"rope_theta": 10000.0}):
        assert changed_block_error(full, **change) > 100 * ATOL, change
    sliding = load_layer(checkpoint, None, "sliding_attention")
    assert changed_block_error(sliding) <= ATOL
    assert changed_block_error(sliding, sliding_window=None) > 100 * ATOL


def _text_config(**settings: Any) -> Any:
    return hf_config({"model_type": "gemma4_text", "hidden_size": 64, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32, "num_hidden_layers": 6,
                      "sliding_window": 4, **settings})  # fmt: skip


def test_layers_sharing_keys_and_values_are_refused_naming_the_layer_they_read() -> None:
    """transformers' kv_sharing_modes: the last non-shared layer of each type stores, the shared ones reuse it."""
    kinds = ["sliding_attention", "full_attention"] * 3
    hf = _text_config(num_kv_shared_layers=2, layer_types=kinds)
    assert list(hf.kv_sharing_modes) == [None, None, "store", "store", "reuse", "reuse"]
    assert [kv_producer(hf, layer) for layer in range(6)] == [None, None, None, None, 2, 3]
    assert geometry(hf, 3, None).attention.head_dim == 32  # a layer that stores its keys loads as any other
    with pytest.raises(ConfigError, match=r"layer 5 of this gemma4 checkpoint shares its keys.*Export layer 3"):
        geometry(hf, 5, None)


def test_a_released_config_json_plans_every_layer() -> None:
    """The default Gemma 4 text config (five sliding layers to one full one, global head width 512 here 32, no k = v)
    and the bidirectional option refused."""
    hf = _text_config()
    plans = [geometry(hf, layer, None) for layer in range(6)]
    assert [p.attention.head_dim for p in plans] == [16] * 5 + [32]
    assert [p.scheme for p in plans] == ["rope"] * 5 + ["rope_proportional"]
    assert [p.attention.sliding_window for p in plans] == [4] * 5 + [None]
    assert not any(p.attention.values_from_keys for p in plans)
    assert plans[5].params == {"rope_theta": 1e6, "partial_rotary_factor": 0.25}
    with pytest.raises(ConfigError, match="use_bidirectional_attention='all'"):
        geometry(_text_config(use_bidirectional_attention="all"), 0, None)


@pytest.mark.slow  # exports the sample through the CLI; tests/features.py's gemma4 block fuses in the default run
@pytest.mark.parametrize("target", ["ort-cpu", "trt"], ids=["ort-cpu", "tensorrt-graph"])  # a graph rewrite: no GPU
def test_rotation_and_attention_fuse(export_cache: Path, target: str) -> None:
    """The full layer's proportional rotation (zero-frequency pairs: cos 1, sin 0) fuses for q and k, and its
    attention (scale 1, normalised values of the key projection) fuses; on ort-cpu the prompt runs on
    GroupQueryAttention."""
    case = sample_case("gemma4-full", export_cache)
    path = export_layer(case, case.folder.parent, "precomputed")
    result = optimize_model(load_model(path), target, facts=CacheFacts.of(load_manifest(path)))
    counts = result.counts
    assert (counts["fuse_rope"], counts["fuse_attention"]) == (2, 1)
    if target == "ort-cpu":
        assert counts["prefill_over_gqa"] == 1
