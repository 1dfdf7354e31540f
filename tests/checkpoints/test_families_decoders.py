"""GPT-NeoX, Falcon, BLOOM and MPT: their references against the whole transformers model, and mistakes caught.

Their samples (``posenc.checkpoints.samples``) are proven against their transformers modules by
tests/checkpoints/test_families.py. Here the references themselves are checked against the whole transformers
model (the attention module's inputs and outputs captured while the model runs a prompt and a decode step), so a
reference that calls its module differently from the model fails. Other tests show the checks catch a wrong
fused-qkv split and the wrong ALiBi form, and that configs posenc cannot express are refused with the option named.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from posenc.checkpoints import load_layer
from posenc.checkpoints.families.phi3 import split_qkv
from posenc.checkpoints.family import family_for
from posenc.checkpoints.load import LoadedLayer
from posenc.checkpoints.reference import hf_config
from posenc.checkpoints.samples import get_sample
from posenc.errors import ConfigError
from tests.checkpoints.whole_model import model_steps, reference_error

transformers = pytest.importorskip("transformers")

FALCON = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 96, "bos_token_id": None, "eos_token_id": None}
NAMES = ("gpt-neox", "falcon-new-arch-rope", "falcon-multi-query-rope", "falcon-alibi-bias", "falcon-new-arch-alibi",
         "bloom", "mpt")  # fmt: skip
"""Their samples (posenc.checkpoints.samples) are proven by tests/checkpoints/test_families.py."""


@pytest.mark.parametrize("name", NAMES)
def test_reference_calls_its_module_as_the_model_does(name: str, tmp_path: Path) -> None:
    """Falcon runs sdpa: its eager model adds ALiBi twice (next test)."""
    sample = get_sample(name)
    folder = sample.build(tmp_path / "ckpt")
    implementation = "sdpa" if sample.config_class == "FalconConfig" else "eager"
    steps = model_steps(folder, sample.layer or 0, sample.layer_type, implementation)
    assert reference_error(load_layer(folder, sample.layer).reference(), steps) <= 1e-5


def test_falcon_eager_model_adds_alibi_twice(tmp_path: Path) -> None:
    """Upstream (transformers 5.23): FalconModel folds alibi/√D into the mask and eager FalconAttention adds alibi
    again; the reference follows the sdpa path. When this fails, transformers fixed it: update falcon.py."""
    sample = get_sample("falcon-alibi-bias")
    folder = sample.build(tmp_path / "ckpt")
    steps = model_steps(folder, sample.layer or 0, sample.layer_type, "eager")
    assert reference_error(load_layer(folder, sample.layer).reference(), steps) > 1e-3


def _block_error(loaded: LoadedLayer) -> float:
    """Largest |block - transformers module| (fp32) over a prompt at positions 0..6 and one at 100..106."""
    block, reference = loaded.block(), loaded.reference()
    hidden = torch.randn(2, 7, loaded.plan.config.hidden_size, generator=torch.Generator().manual_seed(1))
    errors = []
    for start in (0, 100):
        positions = torch.arange(start, start + 7).expand(2, 7)
        with torch.no_grad():
            ours = block(hidden, positions)
        theirs = reference(hidden, positions)
        errors += [float((a - b).abs().max()) for a, b in zip(ours, theirs, strict=True)]
    return max(errors)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    names = ("gpt-neox", "falcon-new-arch-alibi", "falcon-alibi-bias", "bloom")
    return {name: get_sample(name).build(tmp_path_factory.mktemp(name)) for name in names}


@pytest.mark.parametrize("name", ["gpt-neox", "falcon-new-arch-alibi", "bloom"])
def test_a_wrong_qkv_split_is_caught(name: str, checkpoints: dict[str, Path]) -> None:
    """The fused rows read as ``q | k | v`` blocks (Phi-3's, MPT's layout) instead of per (kv) head: far off."""
    loaded = load_layer(checkpoints[name], get_sample(name).layer)
    assert _block_error(loaded) <= 1e-5
    wrong = dict(loaded.state)
    wrong["q_proj.weight"], wrong["k_proj.weight"], wrong["v_proj.weight"] = split_qkv(
        [loaded.tensors["query_key_value.weight"]], loaded.plan
    )
    assert _block_error(dataclasses.replace(loaded, state=wrong)) > 1e-2


@pytest.mark.parametrize(("name", "scaled"), [("falcon-alibi-bias", False), ("bloom", True)])
def test_the_wrong_alibi_form_is_caught(name: str, scaled: bool, checkpoints: dict[str, Path]) -> None:
    """Falcon's ``(q·k + alibi)·scale`` read as BLOOM's ``q·k·scale + alibi``, and the other way round: far off."""
    loaded = load_layer(checkpoints[name], get_sample(name).layer)
    assert loaded.plan.params.get("scaled", False) is not scaled
    assert _block_error(loaded) <= 1e-5
    params = {**loaded.plan.params, "scaled": scaled}
    if not scaled:
        params.pop("bf16_rounding")
    wrong = dataclasses.replace(loaded, plan=dataclasses.replace(loaded.plan, params=params))
    assert _block_error(wrong) > 1e-3


def test_bloom_sliced_dense_drops_its_bias_like_the_module(tmp_path: Path) -> None:
    """``pretraining_tp > 1`` with ``slow_but_exact``: BloomAttention computes ``dense`` in slices without its bias."""
    folder = get_sample("bloom").with_settings(pretraining_tp=2, slow_but_exact=True).build(tmp_path / "ckpt")
    loaded = load_layer(folder, 0)
    assert not loaded.plan.config.out_bias
    assert "dense.bias" in loaded.tensors
    assert _block_error(loaded) <= 1e-5


MPT_REFUSED: dict[str, dict[str, Any]] = {
    "attn_config.clip_qkv": {"attn_config": {"clip_qkv": 6.0}},
    "attn_config.qk_ln": {"attn_config": {"qk_ln": True}},
    "attn_config.prefix_lm": {"attn_config": {"prefix_lm": True}},
    "attn_config.attn_uses_sequence_id": {"attn_config": {"attn_uses_sequence_id": True}},
    "attn_config.alibi": {"attn_config": {"alibi": False}},
    "attn_config.alibi_bias_max": {"attn_config": {"alibi_bias_max": 4}},
    "attn_config.attn_type": {"attn_config": {"attn_type": "multiquery_attention"}},
    "no_bias": {"no_bias": False},
}
"""MPT options transformers' module does not run as configured (or the block cannot express), as config arguments."""


@pytest.mark.parametrize("option", sorted(MPT_REFUSED))
def test_mpt_options_posenc_cannot_prove_are_refused(option: str) -> None:
    hf = hf_config(transformers.MptConfig(d_model=48, n_heads=6, n_layers=2, **MPT_REFUSED[option]))
    with pytest.raises(ConfigError, match=rf"MPT {re.escape(option)}=.* not supported: .*export the scheme by hand"):
        family_for("mpt").geometry(hf, 0, None)


def test_mpt_softmax_scale_is_the_block_scale() -> None:
    hf = hf_config(transformers.MptConfig(d_model=48, n_heads=6, n_layers=2, attn_config={"softmax_scale": 0.2}))
    assert family_for("mpt").geometry(hf, 1, None).config.attn_scale == 0.2


def test_falcon_classic_layout_needs_a_kv_head_per_head() -> None:
    hf = hf_config(transformers.FalconConfig(**FALCON, num_attention_heads=4, multi_query=False, num_kv_heads=2))
    with pytest.raises(ConfigError, match="num_kv_heads is 2, not 4"):
        family_for("falcon").geometry(hf, 0, None)


def test_falcon_partial_rotary_is_refused() -> None:
    """FalconRotaryEmbedding's default RoPE ignores partial_rotary_factor and rotates the whole head."""
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    hf = hf_config(transformers.FalconConfig(**FALCON, num_attention_heads=4, rope_parameters=rope))
    with pytest.raises(ConfigError, match="partial_rotary_factor"):
        family_for("falcon").geometry(hf, 0, None)
