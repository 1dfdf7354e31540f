"""Masks and call recipes of the traced path beyond causal / bidirectional / sliding: attention by chunks
(Nemotron ASR streaming's cache-aware conformer), an attention implementation other than eager where eager does not
compute the model, a stack whose input has its own name, and relative encodings returned inside a tuple
(FastSpeech2-Conformer).

References: transformers' own mask functions (``chunked_limited_mask_function`` through ``create_bidirectional_mask``,
``chunked_overlay``), and the checkpoints' own attention modules called as their models call them (the capture's
wrapper check; ``hf-fp32`` / ``hf-fp64`` of ``validate --against-hf`` in the slow tests).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from posenc.checkpoints.samples import Sample
from posenc.errors import ExportError
from posenc.export.shapes import FeedShape
from posenc.trace.calls import _mask_recipe
from posenc.trace.masks import chunk_candidates, chunk_span, visible
from tests.trace.test_trace_stacks import _tiny

_STREAMING = {"encoder_config": {"hidden_size": 32, "intermediate_size": 32, "num_attention_heads": 2,
                                 "num_hidden_layers": 1, "num_mel_bins": 16, "subsampling_conv_channels": 8,
                                 "max_position_embeddings": 512, "sliding_window": 7,
                                 "default_num_lookahead_tokens": 2},
              "num_decoder_layers": 1, "decoder_hidden_size": 32, "vocab_size": 32, "pad_token_id": 2,
              "blank_token_id": 31}  # fmt: skip
STREAMING = Sample("nemotron_asr_streaming", "Nemotron ASR streaming: chunked attention (chunks of 3, 2 chunks back)",
                   "NemotronAsrStreamingConfig", "NemotronAsrStreamingForRNNT", _STREAMING,
                   layer_type="encoder")  # fmt: skip


def _transformers_chunked(config: Any, length: int) -> torch.Tensor:
    """The mask Nemotron ASR streaming's encoder gives its attention over ``length`` frames (sdpa: boolean)."""
    from transformers.masking_utils import create_bidirectional_mask
    from transformers.models.nemotron_asr_streaming import modeling_nemotron_asr_streaming as modeling

    left = config.sliding_window - 1
    rule = modeling.chunked_limited_mask_function(left, config.default_num_lookahead_tokens)
    config._attn_implementation = "sdpa"
    mask = create_bidirectional_mask(config=config, inputs_embeds=torch.zeros(1, length, 8), attention_mask=None,
                                     and_mask_function=rule)  # fmt: skip
    assert mask is not None
    assert mask.dtype == torch.bool
    return mask


def test_chunked_masks_follow_transformers_rule_at_every_length() -> None:
    """Chunks of ``lookahead + 1`` frames, ``(sliding_window - 1) // chunk`` chunks back: the capture finds the rule
    in the encoder's config, and posenc's rebuild equals transformers' mask at lengths of one to eight chunks; a
    capture of ``chunk_span`` frames tells it from the rule one chunk shorter or longer back."""
    import transformers

    config = transformers.NemotronAsrStreamingEncoderConfig(sliding_window=7, default_num_lookahead_tokens=2)
    outer = transformers.NemotronAsrStreamingConfig(encoder_config=config.to_dict())
    span = chunk_span(outer)
    assert span == (2 + 2) * 3 + 1
    positions = torch.arange(span).unsqueeze(0)
    recipe = _mask_recipe(_transformers_chunked(config, span), outer, "encoder", positions)
    assert (recipe.kind, recipe.causal, recipe.window, recipe.chunk, recipe.chunk_left) == ("bool", False, None, 3, 2)
    for length in (1, 2, 5, 13, 24):
        q = torch.arange(length).unsqueeze(0)
        assert torch.equal(visible(q, q, recipe), _transformers_chunked(config, length)), length
    for other in (4, 10):  # one chunk fewer / more back than the config declares
        wrong = transformers.NemotronAsrStreamingEncoderConfig(sliding_window=other, default_num_lookahead_tokens=2)
        with pytest.raises(ExportError, match="the chunks its config declares"):
            _mask_recipe(_transformers_chunked(wrong, span), outer, "encoder", positions)


def test_chunked_attention_of_a_config_is_transformers_chunked_overlay() -> None:
    """``attention_chunk_size`` (Llama 4's chunked attention): a query sees keys of its own chunk, causally."""
    import transformers
    from transformers.masking_utils import and_masks, causal_mask_function, chunked_overlay

    config = transformers.Llama4TextConfig(attention_chunk_size=4)
    recipe = next(r for r in chunk_candidates("bool", config) if r.causal)
    rule = and_masks(causal_mask_function, chunked_overlay(4, torch.zeros(1, dtype=torch.long)))
    q = torch.arange(11).unsqueeze(0)
    zero, index = torch.tensor(0), torch.arange(11)
    want = torch.stack([torch.stack([rule(zero, zero, i, j) for j in index]) for i in index])
    assert torch.equal(visible(q, q, recipe)[0, 0], want)


def test_the_capture_builds_a_model_with_the_attention_its_mask_is_made_for() -> None:
    """Nemotron ASR streaming's attention reads its mask as boolean; eager's additive mask would be inverted, so the
    capture builds it with sdpa (the model's default); every other model eager."""
    import transformers

    from posenc.trace.counts import attention_implementation

    assert attention_implementation(transformers.NemotronAsrStreamingConfig()) == "sdpa"
    assert attention_implementation(transformers.Nemotron3_5AsrConfig()) == "sdpa"  # the same encoder config
    assert attention_implementation(transformers.ParakeetRNNTConfig()) == "eager"
    assert attention_implementation(transformers.LlamaConfig()) == "eager"


def test_a_chunked_conformer_encoder_is_captured_with_its_chunks(tmp_path: Path) -> None:
    """The tiny streaming encoder: captured over enough frames to see its left context end (``chunk_span``), its
    chunk rule read from ``encoder_config``, and the unit that rebuilds it reproduces the model's own call of the
    attention (the plan's wrapper check)."""
    from posenc.trace.build import plan_trace
    from posenc.trace.capture import capture_layer

    folder = STREAMING.build(tmp_path / "checkpoint", shard=None)
    plan = plan_trace(capture_layer(folder, 0, "encoder"))
    mask = plan.captured.mask
    assert (mask.kind, mask.chunk, mask.chunk_left) == ("bool", 3, 2)
    assert plan.captured.probe[0].shape[1] >= chunk_span(plan.captured.hf)


def test_encodings_returned_inside_a_tuple_are_read_from_that_entry() -> None:
    """FastSpeech2-Conformer's ``pos_enc`` returns ``(scaled hidden, dropout(encodings))``: the module called again is
    ``pos_enc`` (not its dropout, which would return whatever it is given), and the recipe says which entry."""
    from posenc.trace.calls import Call, _outer_producer, _rotary_recipe

    hidden, encodings = torch.randn(1, 4, 8), torch.randn(1, 7, 8)
    calls = {
        "encoder.pos_enc": Call((hidden,), {}, output=(hidden * 2, encodings)),
        "encoder.pos_enc.dropout": Call((encodings,), {}, output=encodings),
    }
    found = _outer_producer(calls, encodings)
    assert found is not None
    name, call = found
    assert (name, call.item) == ("encoder.pos_enc", 1)
    assert _rotary_recipe(call, torch.arange(4).unsqueeze(0), type(None)).item == 1


def test_a_stack_whose_input_has_its_own_name_gets_it() -> None:
    """FastSpeech2-Conformer's stacks take ``input_tensor``: token ids for the encoder (it embeds them), seeded
    hidden states ``[1, T, E]`` for the decoder."""
    import transformers

    from posenc.trace.stacks import stack_inputs

    config = transformers.FastSpeech2ConformerConfig(hidden_size=16, vocab_size=20)
    with torch.device("meta"):
        model = transformers.FastSpeech2ConformerModel(config)
    (encoder,) = stack_inputs(model.encoder, config, 5)
    (decoder,) = stack_inputs(model.decoder, config, 5)
    assert (encoder["input_tensor"].dtype, encoder["input_tensor"].shape) == (torch.int64, (1, 5))
    assert (decoder["input_tensor"].dtype, decoder["input_tensor"].shape) == (torch.float32, (1, 5, 16))


def test_a_layer_masked_by_chunks_is_validated_across_them() -> None:
    """The default feeds of a traced layer masked by chunks hold a prompt of ``(L + 2) · c + 1`` tokens."""
    from posenc.trace.record import MaskRecipe
    from posenc.validate.feeds import chunk_span_of

    def manifest(mask: MaskRecipe | None) -> Any:  # the one field chunk_span_of reads
        return SimpleNamespace(trace=SimpleNamespace(mask=mask) if mask is not None else None)

    assert chunk_span_of(manifest(MaskRecipe("bool", causal=False, chunk=14, chunk_left=5))) == 99
    assert chunk_span_of(manifest(MaskRecipe("bool", causal=False))) is None
    assert chunk_span_of(manifest(None)) is None


def test_calls_posenc_cannot_rebuild_are_refused_with_what_they_need() -> None:
    """ProphetNet's decoder is refused by its predicting streams' mask. (CPM-Ant traces: test_trace_inputs; Longformer
    too: its sliding chunks, tests/trace/test_trace_windows.py.)"""
    import transformers

    from posenc.trace.inputs import argument_meaning, capture_refusal

    assert capture_refusal(transformers.LongformerConfig()) is None
    assert capture_refusal(transformers.CpmAntConfig()) is None
    assert "n-gram predicting streams" in argument_meaning("extended_predict_attention_mask")
    assert capture_refusal(transformers.LlamaConfig()) is None


# --------------------------------------------------------------------------------------------------
# On the census's tiny checkpoints (slow)
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nemotron_asr_streaming", "nemotron3_5_asr"])
def test_every_chunked_conformer_encoder_traces_and_matches_its_module(name: str, tmp_path: Path) -> None:
    """The released chunking (chunks of 14 frames, 5 back): the graph against the model's module, on the default
    feeds, which hold a prompt of 99 frames across the chunks (``validate.feeds.chunk_span_of``)."""
    from posenc.export.trace import export_traced
    from posenc.graphs.trace_rewrite import replace_positions
    from posenc.validate.checkpoint import validate_against_checkpoint

    folder = _tiny(name, tmp_path)
    result = export_traced(tmp_path / "encoder.onnx", folder, layer=0, layer_type="encoder", rewrite=replace_positions)
    record = result.manifest.trace
    assert record is not None
    assert (record.mask.chunk, record.mask.chunk_left) == (14, 5)
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, f"{name}\n{report.to_markdown()}"
    assert FeedShape(1, 99, 0) in {row.shape for row in report.rows if row.reference == "hf-fp32"}


@pytest.mark.slow
@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_fastspeech2_conformer_stacks_trace_and_match_their_module(stack: str, tmp_path: Path) -> None:
    from posenc.export.trace import export_traced
    from posenc.graphs.trace_rewrite import replace_positions
    from posenc.validate.checkpoint import validate_against_checkpoint

    folder = _tiny("fastspeech2_conformer", tmp_path)
    result = export_traced(tmp_path / f"{stack}.onnx", folder, layer=0, layer_type=stack, rewrite=replace_positions)
    record = result.manifest.trace
    assert record is not None
    assert record.rotary is not None
    assert record.rotary_call is not None
    assert (record.rotary.path, record.rotary_call.item) == (f"{stack}.pos_enc", 1)
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, f"{stack}\n{report.to_markdown()}"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "stack", "words"),
    [
        ("prophetnet", "decoder", "n-gram predicting streams"),
    ],
)
def test_attention_calls_posenc_cannot_rebuild_are_refused_at_export(
    name: str, stack: str | None, words: str, tmp_path: Path
) -> None:
    from posenc.export.trace import export_traced

    folder = _tiny(name, tmp_path)
    with pytest.raises(ExportError, match=words):
        export_traced(tmp_path / "layer.onnx", folder, layer=0, layer_type=stack)
