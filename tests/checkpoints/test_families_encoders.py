"""DeBERTa, BERT, RoBERTa, XLM-RoBERTa, Marian and BART: what the loader plans, and that mistakes are caught.

Their samples (``posenc.checkpoints.samples``) are proven against their transformers modules by
tests/checkpoints/test_families.py. These tests show that the comparison catches a wrong mapping (a missing
embedding LayerNorm, BERT's offset on a RoBERTa table, a wrong split of DeBERTa v1's fused projection, a missing
rel-embedding norm, the wrong sinusoidal layout) and that configs posenc cannot express are refused with a
ConfigError naming the option.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from posenc.blocks import AttentionBlock
from posenc.checkpoints import LoadedLayer, load_layer
from posenc.checkpoints.load import load_state
from posenc.checkpoints.samples import get_sample
from posenc.errors import ConfigError
from tests.checkpoints.parity import ATOL

transformers = pytest.importorskip("transformers")


def _deberta_v2(folder: Path, **options: Any) -> Path:
    return get_sample("deberta-v2-c2p").with_settings(**options).build(folder)


def _deberta_shared(folder: Path) -> Path:
    return get_sample("deberta-v2-shared").build(folder)


def _deberta_v1(folder: Path, **options: Any) -> Path:
    return get_sample("deberta-v1").with_settings(**options).build(folder)


def _bert(folder: Path, **options: Any) -> Path:
    return get_sample("bert").with_settings(**options).build(folder)


def _roberta(folder: Path) -> Path:
    return get_sample("roberta").build(folder)


def _seq2seq(kind: str, folder: Path) -> Path:
    return get_sample(f"{kind}-encoder").build(folder)


def test_plans_follow_the_modules(tmp_path: Path) -> None:
    """What the loader reads off each config (the parity cases above prove the numbers)."""
    bert = load_layer(_bert(tmp_path / "bert"), 0)
    assert (bert.plan.scheme, bert.plan.params["position_offset"], bert.plan.decoder) == ("learned", 0, False)
    roberta = load_layer(_roberta(tmp_path / "roberta"), 1)
    assert (roberta.plan.scheme, roberta.plan.config.max_position_embeddings) == ("nope", 80)  # 82 rows - offset 2
    deberta = load_layer(_deberta_v1(tmp_path / "v1"), 0)
    assert (deberta.plan.params["share_att_key"], deberta.plan.config.causal) == (False, False)


# --------------------------------------------------------------------------------------------------
# The comparison catches a wrong mapping
# --------------------------------------------------------------------------------------------------


def _error_vs_transformers(
    loaded: LoadedLayer, plan: Any = None, state: dict[str, torch.Tensor] | None = None
) -> float:
    """Max |block - transformers module| of the output at positions 0..6 (eager, float32)."""
    plan = plan or loaded.plan
    block = AttentionBlock(plan.config, plan.scheme, plan.params).eval()
    load_state(block, loaded.state if state is None else state, loaded.location)
    hidden = torch.randn(2, 7, plan.config.hidden_size, generator=torch.Generator().manual_seed(3))
    positions = torch.arange(7).expand(2, 7)
    with torch.no_grad():
        got = block(hidden, positions)[0]
    return float((got - loaded.reference()(hidden, positions)[0]).abs().max())


def _with_params(loaded: LoadedLayer, **params: Any) -> Any:
    return dataclasses.replace(loaded.plan, params={**loaded.plan.params, **params})


def test_forgetting_the_embedding_layernorm_is_caught(tmp_path: Path) -> None:
    loaded = load_layer(_bert(tmp_path / "bert"), 0)
    state = {k: v for k, v in loaded.state.items() if not k.startswith("scheme.embedding_norm")}
    assert _error_vs_transformers(loaded) <= ATOL
    assert _error_vs_transformers(loaded, _with_params(loaded, embedding_norm=False), state) > 100 * ATOL


def test_reading_roberta_with_berts_offset_is_caught(tmp_path: Path) -> None:
    loaded = load_layer(_roberta(tmp_path / "roberta"), 0)
    rows = loaded.state["scheme.weight"].shape[0]
    plan = _with_params(loaded, position_offset=0)
    plan = dataclasses.replace(plan, config=dataclasses.replace(plan.config, max_position_embeddings=rows))
    assert _error_vs_transformers(loaded) <= ATOL
    assert _error_vs_transformers(loaded, plan) > 100 * ATOL


def test_a_wrong_split_of_debertas_fused_projection_is_caught(tmp_path: Path) -> None:
    loaded = load_layer(_deberta_v1(tmp_path / "v1"), 0)
    q, k, v = loaded.tensors["self.in_proj.weight"].chunk(3, dim=0)  # q rows, then k, then v: not per head
    state = {**loaded.state, "q_proj.weight": q, "k_proj.weight": k, "v_proj.weight": v}
    assert _error_vs_transformers(loaded) <= ATOL
    assert _error_vs_transformers(loaded, state=state) > 100 * ATOL


def test_forgetting_the_rel_embedding_norm_is_caught(tmp_path: Path) -> None:
    loaded = load_layer(_deberta_shared(tmp_path / "v2"), 1)
    state = {k: v for k, v in loaded.state.items() if not k.startswith("scheme.rel_norm")}
    assert _error_vs_transformers(loaded) <= ATOL
    assert _error_vs_transformers(loaded, _with_params(loaded, rel_norm=False), state) > 100 * ATOL


def test_the_wrong_sinusoidal_layout_is_caught(tmp_path: Path) -> None:
    loaded = load_layer(_seq2seq("marian", tmp_path / "marian"), 0, "decoder")
    assert _error_vs_transformers(loaded) <= ATOL
    assert _error_vs_transformers(loaded, _with_params(loaded, layout="interleaved")) > 100 * ATOL


# --------------------------------------------------------------------------------------------------
# What posenc cannot express is refused
# --------------------------------------------------------------------------------------------------


def test_bert_relative_key_is_refused(tmp_path: Path) -> None:
    folder = _bert(tmp_path / "bert", position_embedding_type="relative_key")
    with pytest.raises(ConfigError, match="position_embedding_type='relative_key'"):
        load_layer(folder, 0)


def test_deberta_talking_head_is_refused(tmp_path: Path) -> None:
    folder = _deberta_v1(tmp_path / "v1", pos_att_type="c2p", talking_head=True)
    with pytest.raises(ConfigError, match="talking_head"):
        load_layer(folder, 0)


def test_deberta_without_relative_attention_is_refused(tmp_path: Path) -> None:
    folder = _deberta_v2(tmp_path / "v2", relative_attention=False)
    with pytest.raises(ConfigError, match="relative_attention=False"):
        load_layer(folder, 0)


def test_cross_attention_is_not_a_positional_block(tmp_path: Path) -> None:
    folder = _seq2seq("bart", tmp_path / "bart")
    with pytest.raises(ConfigError, match=r"cross-attention .* not a positional block"):
        load_layer(folder, 0, "cross_attention")


def test_debertas_reference_takes_token_order_only(tmp_path: Path) -> None:
    loaded = load_layer(_deberta_v2(tmp_path / "v2"), 0)
    hidden = torch.randn(1, 3, 64)
    with pytest.raises(ConfigError, match="consecutive position ids"):
        loaded.reference()(hidden, torch.tensor([[0, 2, 5]]))
