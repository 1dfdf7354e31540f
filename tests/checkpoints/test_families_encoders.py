"""DeBERTa, BERT, RoBERTa, XLM-RoBERTa, Marian and BART layers, proven against their own transformers modules.

Each case builds a tiny seeded checkpoint with transformers' config and model classes (``save_pretrained``), exports
one layer with ``posenc export --hf-model`` and compares ONNX Runtime with transformers (tests/checkpoints/parity.py):
short positions, decode steps with a cache for decoder layers, positions near the context length. Learned tables
are precomputed only; DeBERTa and the sinusoidal table are checked in both table modes.

The other tests show that the comparison catches a wrong mapping (a missing embedding LayerNorm, BERT's offset on
a RoBERTa table, a wrong split of DeBERTa v1's fused projection, a missing rel-embedding norm, the wrong sinusoidal
layout) and that configs posenc cannot express are refused with a ConfigError naming the option.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from posenc.blocks import AttentionBlock
from posenc.checkpoints import LoadedLayer, load_layer
from posenc.checkpoints.load import load_state
from posenc.errors import ConfigError
from tests.checkpoints import tiny
from tests.checkpoints.parity import ATOL, Case, check_case

transformers = pytest.importorskip("transformers")

ENCODER = {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "vocab_size": 96}  # fmt: skip
"""BERT-style geometry: hidden 64, 4 heads of 16."""
PRECOMPUTED = ("precomputed",)
"""Learned tables have no dynamic mode."""


def _deberta_v2(folder: Path, **options: Any) -> Path:
    config = transformers.DebertaV2Config(
        **{**ENCODER, "max_position_embeddings": 256, "relative_attention": True, **options}
    )
    return tiny.save_tiny(transformers.DebertaV2ForMaskedLM, config, folder)


def _deberta_shared(folder: Path) -> Case:
    options = {"pos_att_type": "p2c|c2p", "share_att_key": True, "position_buckets": 8, "max_relative_positions": 16,
               "norm_rel_ebd": "layer_norm", "position_biased_input": False}  # fmt: skip
    return Case(_deberta_v2(folder, **options), layer=1)


def _deberta_c2p(folder: Path) -> Case:
    options = {"pos_att_type": "c2p", "share_att_key": False, "max_relative_positions": 4}
    return Case(_deberta_v2(folder, **options), layer=0)


def _deberta_v1(folder: Path) -> Path:
    config = transformers.DebertaConfig(**ENCODER, max_position_embeddings=128, relative_attention=True,
                                        pos_att_type="c2p|p2c", max_relative_positions=5)  # fmt: skip
    return tiny.save_tiny(transformers.DebertaModel, config, folder)


def _bert(folder: Path, **options: Any) -> Path:
    config = transformers.BertConfig(**ENCODER, max_position_embeddings=80, **options)
    return tiny.save_tiny(transformers.BertForMaskedLM, config, folder)


def _roberta(folder: Path, **options: Any) -> Path:
    config = transformers.RobertaConfig(**ENCODER, max_position_embeddings=82, pad_token_id=1, type_vocab_size=1,
                                        **options)  # fmt: skip
    return tiny.save_tiny(transformers.RobertaForMaskedLM, config, folder)


def _xlm_roberta_decoder(folder: Path) -> Case:
    config = transformers.XLMRobertaConfig(**ENCODER, max_position_embeddings=82, pad_token_id=1, is_decoder=True)
    return Case(tiny.save_tiny(transformers.XLMRobertaForCausalLM, config, folder), table_modes=PRECOMPUTED)


def _seq2seq(kind: str, folder: Path) -> Path:
    """A 2 + 2 layer BART or Marian checkpoint; Marian's width is odd (45 = 3 heads of 15)."""
    sizes = {"encoder_layers": 2, "decoder_layers": 2, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32, "vocab_size": 96}
    if kind == "marian":
        config = transformers.MarianConfig(**sizes, d_model=45, encoder_attention_heads=3, decoder_attention_heads=3,
                                           max_position_embeddings=2048, pad_token_id=0, decoder_start_token_id=0,
                                           scale_embedding=True)  # fmt: skip
        return tiny.save_tiny(transformers.MarianMTModel, config, folder)
    config = transformers.BartConfig(**sizes, d_model=64, encoder_attention_heads=4, decoder_attention_heads=2,
                                     max_position_embeddings=96)  # fmt: skip
    return tiny.save_tiny(transformers.BartForConditionalGeneration, config, folder)


def _stack(kind: str, stack: str, layer: int = 0) -> Callable[[Path], Case]:
    modes = PRECOMPUTED if kind == "bart" else ("precomputed", "dynamic")
    return lambda folder: Case(_seq2seq(kind, folder), layer=layer, layer_type=stack, table_modes=modes)


CASES: dict[str, Callable[[Path], Case]] = {
    "deberta-v2-shared-both-buckets-relnorm": _deberta_shared,
    "deberta-v2-c2p-own-proj-clipped": _deberta_c2p,
    "deberta-v1-fused-in-proj": lambda folder: Case(_deberta_v1(folder), layer=1),
    "bert-embeddings-layer0": lambda folder: Case(_bert(folder), table_modes=PRECOMPUTED),
    "roberta-offset-layer0": lambda folder: Case(_roberta(folder), table_modes=PRECOMPUTED),
    "xlm-roberta-decoder-cache": _xlm_roberta_decoder,
    "marian-encoder-odd-width": _stack("marian", "encoder"),
    "marian-decoder-cache": _stack("marian", "decoder"),
    "bart-encoder": _stack("bart", "encoder"),
    "bart-decoder-cache": _stack("bart", "decoder"),
    "bart-decoder-layer1-no-positions": _stack("bart", "decoder", layer=1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_encoder_family_layer_matches_its_transformers_module(name: str, tmp_path: Path) -> None:
    case = CASES[name](tmp_path / "ckpt")
    measured: Any = check_case(case, tmp_path)
    assert measured  # check_case asserts every claim; the errors are returned for debugging


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
    loaded = load_layer(_deberta_shared(tmp_path / "v2").folder, 1)
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
    config = transformers.DebertaConfig(**ENCODER, relative_attention=True, pos_att_type="c2p", talking_head=True)
    folder = tiny.save_tiny(transformers.DebertaModel, config, tmp_path / "v1")
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
    loaded = load_layer(_deberta_c2p(tmp_path / "v2").folder, 0)
    hidden = torch.randn(1, 3, 64)
    with pytest.raises(ConfigError, match="consecutive position ids"):
        loaded.reference()(hidden, torch.tensor([[0, 2, 5]]))
