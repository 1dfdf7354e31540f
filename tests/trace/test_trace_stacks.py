"""The traced path over the two stacks of an encoder-decoder model (``--layer-type encoder|decoder``): each stack's
self-attention exports and matches the checkpoint's own transformers module; the decoder's cross-attention is left
out.

References: the checkpoint's own attention modules (``MBartAttention`` of the decoder stack, and of every
encoder-decoder type's stacks in the slow sweep, called as their model calls them, ``hf-fp32`` / ``hf-fp64``), and
posenc's float64 rebuild of the traced graph (``eager-fp64``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from posenc.checkpoints.samples import Sample
from posenc.errors import ConfigError, ExportError
from posenc.export.shapes import FeedShape
from posenc.export.trace import export_traced
from posenc.graphs.trace_rewrite import replace_positions
from posenc.trace.capture import capture_layer
from posenc.validate.checkpoint import decode_against_checkpoint, validate_against_checkpoint

_MBART = {"d_model": 64, "encoder_layers": 2, "decoder_layers": 3, "encoder_attention_heads": 4,
          "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "vocab_size": 96,
          "max_position_embeddings": 128}  # fmt: skip
MBART = Sample("mbart", "MBart: pre-norm BART-like, learned positions", "MBartConfig",
               "MBartForConditionalGeneration", _MBART, layer=1, layer_type="decoder")  # fmt: skip


@pytest.fixture(scope="module")
def mbart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return MBART.build(tmp_path_factory.mktemp("mbart") / "checkpoint", shard=None)


def test_a_decoder_stack_layer_traces_and_matches_its_own_module(mbart: Path, tmp_path: Path) -> None:
    """Layer 1 of MBart's decoder stack: its self-attention (not the cross-attention beside it) with the decoder's
    cache, held to the checkpoint's ``MBartAttention`` on prefill and cached feeds."""
    result = export_traced(tmp_path / "decoder1.onnx", mbart, layer=1, layer_type="decoder", rewrite=replace_positions)
    manifest = result.manifest
    record = manifest.trace
    assert record is not None
    assert (record.layer, record.layer_type) == (1, "decoder")
    assert record.attention.path == "decoder.layers.1.self_attn"
    assert not record.cacheless
    assert record.cache == "encoder-decoder"
    tensors = manifest.weights.source.tensors
    assert tensors
    assert all(".decoder.layers.1.self_attn." in name for name in tensors)
    report = validate_against_checkpoint(result.path, mbart, shapes=[FeedShape(2, 3, 4)])
    assert report.passed, report.to_markdown()
    assert {row.reference for row in report.rows} >= {"eager-fp64", "hf-fp32"}


def test_a_stack_out_of_range_or_unknown_is_refused_by_name(mbart: Path) -> None:
    with pytest.raises(ConfigError, match=r"the checkpoint's encoder has 2 layers \(0 \.\. 1\)"):
        capture_layer(mbart, 2, "encoder")
    with pytest.raises(ConfigError, match=r"one of \['encoder', 'decoder'\], not 'middle'"):
        capture_layer(mbart, 0, "middle")


def test_the_stack_a_layer_type_picks() -> None:
    """Encoder-decoder configs pick a stack (default the encoder, as the BART family); a model with one stack, or an
    encoder-decoder config that counts no stack's layers (a composite: its towers hold them), picks none."""
    import transformers

    from posenc.trace.stacks import stack_layer_count, stack_of

    mbart = MBART.config()
    assert [stack_of(mbart, kind) for kind in (None, "encoder", "decoder")] == ["encoder", "encoder", "decoder"]
    assert (stack_layer_count(mbart, "encoder"), stack_layer_count(mbart, "decoder")) == (2, 3)
    t5 = transformers.T5Config(num_layers=2, num_decoder_layers=4)
    assert (stack_layer_count(t5, "encoder"), stack_layer_count(t5, "decoder")) == (2, 4)
    assert stack_of(transformers.LlamaConfig(), "decoder") is None
    composite = transformers.PretrainedConfig(is_encoder_decoder=True)
    assert stack_of(composite, None) is None


_FORMULA = {"d_model": 64, "encoder_layers": 1, "decoder_layers": 2, "decoder_attention_heads": 4,
            "encoder_attention_heads": 4, "decoder_ffn_dim": 64, "encoder_ffn_dim": 64, "vocab_size": 96,
            "max_position_embeddings": 64}  # fmt: skip
FORMULA = Sample("pp_formulanet_text", "PP-FormulaNet's text model: the decoder stack alone",
                 "PPFormulaNetTextConfig", "PPFormulaNetTextModel", _FORMULA, layer=1)  # fmt: skip


def test_a_decoder_alone_whose_config_says_encoder_decoder_traces_its_one_stack() -> None:
    """PP-FormulaNet's text model is the decoder stack alone, its config an encoder-decoder's (``encoder_layers``
    1, ``decoder_layers`` 2): the model built on the meta device says it is the decoder, whose layer list the stack
    search finds at the model's root; the encoder stack it lacks is refused by name. (Capture and parity with the
    checkpoint's module: the slow ``test_every_one_stack_text_model_traces_its_decoder``.)"""
    import torch
    import transformers

    from posenc.trace.model import one_stack
    from posenc.trace.stacks import stack_layers

    hf, cls = FORMULA.config(), transformers.PPFormulaNetTextModel  # the class its config.json's architectures name
    assert one_stack(hf, "encoder", None, cls) == "decoder"
    with torch.device("meta"):
        model = cls(hf)
    assert stack_layers(model, "decoder", 2)[0] == "layers"
    with pytest.raises(ConfigError, match=r"its decoder stack alone .* pass --layer-type decoder"):
        one_stack(hf, "encoder", "encoder", cls)
    mbart = MBART.config()
    assert one_stack(mbart, "encoder", None, transformers.MBartModel) == "encoder"  # both stacks, named: as asked


def test_a_stack_counted_in_its_own_sub_config() -> None:
    """ASR models count their encoder's layers in ``encoder_config`` (Parakeet's RNN-T: no top-level count; Cohere
    ASR: a top-level ``num_hidden_layers`` that is its decoder's); the stack's cut sets that field."""
    import transformers

    from posenc.trace.stacks import cut_stack, stack_layer_count

    rnnt = transformers.ParakeetRNNTConfig(encoder_config={"num_hidden_layers": 3}, num_decoder_layers=2)
    assert stack_layer_count(rnnt, "encoder") == 3
    cohere = transformers.CohereAsrConfig(encoder_config={"num_hidden_layers": 5}, num_hidden_layers=4)
    assert (stack_layer_count(cohere, "encoder"), stack_layer_count(cohere, "decoder")) == (5, 4)
    cut_stack(cohere, "encoder", 2)
    assert (cohere.encoder_config.num_hidden_layers, cohere.num_hidden_layers) == (2, 1)


_RNNT = {"encoder_config": {"hidden_size": 32, "intermediate_size": 32, "num_attention_heads": 2,
                            "num_key_value_heads": 2, "num_hidden_layers": 1, "num_mel_bins": 16,
                            "subsampling_conv_channels": 8, "max_position_embeddings": 512},
         "num_decoder_layers": 1, "decoder_hidden_size": 32, "vocab_size": 32, "pad_token_id": 2,
         "blank_token_id": 31}  # fmt: skip
RNNT = Sample("parakeet_rnnt", "Parakeet RNN-T: a conformer encoder with Transformer-XL relative encodings",
              "ParakeetRNNTConfig", "ParakeetForRNNT", _RNNT, layer_type="encoder")  # fmt: skip


@pytest.fixture(scope="module")
def rnnt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return RNNT.build(tmp_path_factory.mktemp("rnnt") / "checkpoint", shard=None)


def test_relative_encodings_a_module_computes_are_called_again_by_the_unit(rnnt: Path) -> None:
    """Parakeet's encoder attention reads one tensor of sinusoidal relative encodings ``[B, 2T - 1, E]`` that its
    ``encode_positions`` module computes from the length (its encoder's layer count and mel bins in
    ``encoder_config``): the capture names that module, and the unit that calls it again on the attention's input
    reproduces the model's own call (the plan's wrapper check; the relative part is named)."""
    from posenc.trace.build import plan_trace, relative_parts

    plan = plan_trace(capture_layer(rnnt, 0, "encoder"))
    captured = plan.captured
    assert captured.cacheless
    assert captured.rotary_ref is not None
    assert captured.rotary_ref.path == "encoder.encode_positions"
    assert "position_embeddings" in captured.call.keywords.values() or "position_embeddings" in captured.call.positional
    (part,) = relative_parts(captured)
    assert (part.part, part.status) == ("relative position encodings", "kept")
    assert "[1, 7, 32] for 4 tokens" in part.detail


@pytest.mark.slow
def test_relative_encodings_a_module_computes_are_traced_with_the_attention(rnnt: Path, tmp_path: Path) -> None:
    """The exported unit: the relative shift exports for every length (torch.export's guards deferred) and the
    graph matches the checkpoint's own ``ParakeetEncoderAttention`` (``hf-fp32``) at lengths 1 and 5."""
    folder = rnnt
    result = export_traced(tmp_path / "encoder0.onnx", folder, layer=0, layer_type="encoder", rewrite=replace_positions)
    record = result.manifest.trace
    assert record is not None
    assert record.cacheless
    assert record.rotary is not None
    assert record.rotary.path == "encoder.encode_positions"
    assert {part.part: part.status for part in record.parts}["relative position encodings"] == "kept"
    shapes = [FeedShape(1, 1, 0), FeedShape(2, 5, 0)]
    report = validate_against_checkpoint(result.path, folder, shapes=shapes, long_positions=False)
    assert report.passed, report.to_markdown()
    assert "hf-fp32" in {row.reference for row in report.rows}


# --------------------------------------------------------------------------------------------------
# Every encoder-decoder type of transformers, on the census's tiny checkpoint (slow)
# --------------------------------------------------------------------------------------------------

BOTH = (
    "bigbird_pegasus",  # in its full-attention mode (the census's tiny config: posenc.census.tiny.MODES)
    "blenderbot",
    "blenderbot-small",
    "cohere_asr",  # encoder: relative encodings; decoder: fed seeded encoder states (its cross-attention needs them)
    "led",  # encoder: Longformer's sliding chunks, padded to the window (trace.windows), its length guards deferred
    "longt5",  # encoder: local attention over 128-token blocks, exported with its length guards deferred
    "m2m_100",
    "mbart",
    "moonshine",
    "mvp",
    "nllb-moe",
    "pegasus",
    "plbart",
    "pop2piano",
    "seamless_m4t",
    "seamless_m4t_v2",
    "speech_to_text",
    "speecht5",  # both stacks fed hidden states (their prenets sit outside them); the encoder's relative encodings
    "switch_transformers",
    "umt5",
    "whisper",
)
"""Types both of whose stacks trace and match."""
DECODER_ONLY = {
    "pegasus_x": "argument 'global_hidden_states'",
    "udop": "argument 'position_bias'",
}
"""Types whose decoder traces and whose encoder is refused, with the reason's words: an attention posenc cannot
call from positions alone (local/global windows, block-sparse, a bias computed before the layers from positions
and boxes)."""


def test_a_stack_is_built_only_in_a_model_that_holds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """LED's per-layer ``attention_window`` ties its stacks' counts, so transformers refuses the config cut to one
    encoder layer as an ``LEDModel`` but builds it as an ``LEDDecoder`` (one of the config's own model classes):
    once taken for the encoder, whose layer 0 then was the decoder's attention (the census's LED row passed both kinds
    on one module). The encoder is now built in the uncut ``LEDModel``; a config whose every build lacks the stack is
    refused, naming what was built."""
    from posenc.census.tiny import tiny_config
    from posenc.trace import model as trace_model
    from posenc.trace.model import build_base_model
    from posenc.trace.stacks import stack_layers

    hf = tiny_config("led").config  # the census's tiny LED config: attention_window [8, 8], two layers per stack
    path, layers = stack_layers(build_base_model(hf, 1, None, "encoder"), "encoder", 1)
    assert path == "encoder.layers", path
    assert type(layers[0].self_attn).__name__ == "LEDEncoderAttention"
    import transformers

    only_decoder = [transformers.models.led.modeling_led.LEDDecoder._from_config]
    monkeypatch.setattr(trace_model, "_builders", lambda hf, model_class: only_decoder)
    monkeypatch.setattr(trace_model, "lone_of", lambda hf, model_class=None: None)
    refused = r"no led model holding its encoder stack .*it builds LEDDecoder, which holds no module named 'encoder'"
    with pytest.raises(ConfigError, match=refused):
        build_base_model(hf, 1, None, "encoder")


def _tiny(name: str, root: Path) -> Path:
    from posenc.census.tiny import save_tiny_model, tiny_config
    from posenc.census.types import model_type_info

    info = model_type_info(name)
    folder = root / name
    save_tiny_model(tiny_config(name).config, info.model_class, folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("name", [*BOTH, *DECODER_ONLY])
def test_every_encoder_decoder_stack_traces_or_is_refused_by_name(name: str, tmp_path: Path) -> None:
    folder = _tiny(name, tmp_path)
    for stack in ("encoder", "decoder"):
        if stack == "encoder" and name in DECODER_ONLY:
            with pytest.raises(ExportError, match=DECODER_ONLY[name]):
                export_traced(tmp_path / f"{stack}.onnx", folder, layer=0, layer_type=stack)
            continue
        result = export_traced(tmp_path / f"{stack}.onnx", folder, layer=0, layer_type=stack, rewrite=replace_positions)
        record = result.manifest.trace
        assert record is not None
        assert record.layer_type == stack
        assert record.cacheless == (stack == "encoder")
        parts = {part.part: part.status for part in record.parts}
        if (name, stack) == ("mbart", "encoder"):  # layernorm_embedding after the sum: the positions stay outside
            assert parts["stack embeddings"] == "absent"
        if name in ("umt5", "switch_transformers", "pop2piano"):  # T5's bucketed bias, computed in the module
            assert parts["relative position bias"] == "kept"
        if name == "moonshine":  # RoPE from the stack's own head counts (decoder_num_attention_heads): posenc's
            assert (parts["rotary angles"], parts["rotation"]) == ("replaced", "replaced")
        report = validate_against_checkpoint(result.path, folder)
        assert report.passed, f"{name} {stack}\n{report.to_markdown()}"


@pytest.mark.slow
def test_a_local_attention_over_blocks_matches_its_own_module_across_blocks(tmp_path: Path) -> None:
    """LongT5's encoder attends within blocks of ``local_radius + 1`` tokens and their neighbours, the sequence padded
    to whole blocks (torch.export's guards on that padding deferred, said in the manifest's notes): with blocks of 5,
    the graph matches the model's own ``LongT5LocalAttention`` at one token, one block, two blocks and across five."""
    from posenc.census.tiny import save_tiny_model, tiny_config

    folder = tmp_path / "longt5"
    save_tiny_model(tiny_config("longt5", overrides={"local_radius": 4}).config, "LongT5ForConditionalGeneration",
                    folder)  # fmt: skip
    result = export_traced(tmp_path / "encoder.onnx", folder, layer=0, layer_type="encoder", rewrite=replace_positions)
    assert any("padding to blocks" in note for note in result.manifest.notes)
    shapes = [FeedShape(1, 1, 0), FeedShape(2, 5, 0), FeedShape(1, 10, 0), FeedShape(2, 11, 0), FeedShape(1, 23, 0)]
    report = validate_against_checkpoint(result.path, folder, shapes=shapes)
    assert report.passed, report.to_markdown()
    assert {row.shape.seq for row in report.rows if row.reference == "hf-fp32"} >= {1, 5, 10, 11, 23}


ONE_STACK = ("canary", "dia", "pix2struct", "pp_formulanet", "pp_formulanet_text")
"""Types whose text model (a wrapper's tower, or the type itself) is a decoder stack alone under an encoder-decoder
config (Dia's reads token ids ``[B, S, channels]``: posenc.trace.stacks.TOKEN_AXES)."""


@pytest.mark.slow
@pytest.mark.parametrize("name", ONE_STACK)
def test_every_one_stack_text_model_traces_its_decoder(name: str, tmp_path: Path) -> None:
    folder = _tiny(name, tmp_path)
    result = export_traced(tmp_path / "layer0.onnx", folder, layer=0, rewrite=replace_positions)
    record = result.manifest.trace
    assert record is not None
    assert record.layer_type == "decoder"
    assert not record.cacheless
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, f"{name}\n{report.to_markdown()}"


ENCODER_ONLY = ("parakeet_rnnt", "parakeet_tdt")
"""ASR types whose one attention stack is the conformer encoder (the RNN-T / TDT decoder is an LSTM)."""


@pytest.mark.slow
@pytest.mark.parametrize("name", ENCODER_ONLY)
def test_every_conformer_encoder_traces_with_its_relative_encodings(name: str, tmp_path: Path) -> None:
    folder = _tiny(name, tmp_path)
    result = export_traced(tmp_path / "encoder.onnx", folder, layer=0, layer_type="encoder", rewrite=replace_positions)
    record = result.manifest.trace
    assert record is not None
    assert {part.part: part.status for part in record.parts}["relative position encodings"] == "kept"
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, f"{name}\n{report.to_markdown()}"


def test_a_decoder_whose_cross_attention_runs_regardless_is_fed_seeded_encoder_states() -> None:
    """The encoder states a decoder stack's capture forward may take: the encoder's width, seeded; none for a stack
    that takes none."""
    from types import SimpleNamespace

    import torch

    from posenc.trace.stacks import encoder_states

    class Decoder(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None) -> None:
            return None

    class Encoder(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor) -> None:
            return None

    config = SimpleNamespace(encoder_config=SimpleNamespace(hidden_size=24), hidden_size=32)  # Cohere ASR's fields
    states = encoder_states(Decoder(), config, 5)["encoder_hidden_states"]
    assert states.shape == (1, 5, 24)
    assert torch.equal(states, encoder_states(Decoder(), config, 5)["encoder_hidden_states"])  # seeded
    assert encoder_states(Encoder(), config, 5) == {}


@pytest.mark.slow
def test_decode_steps_carry_an_encoder_decoder_cache(mbart: Path, tmp_path: Path) -> None:
    """The decoder's ``EncoderDecoderCache`` through several decode steps, each held to the checkpoint's module."""
    result = export_traced(tmp_path / "decoder0.onnx", mbart, layer=0, layer_type="decoder", rewrite=replace_positions)
    report = decode_against_checkpoint(result.path, mbart)
    assert report.passed, report.to_markdown()


def test_a_model_whose_layer_list_counts_by_its_own_field() -> None:
    """HRM's two recurrent stacks hold ``num_layers_per_stack`` layers each; ``num_hidden_layers`` counts its cache
    slots (layers x cycles). Its tiny config keeps both consistent, and the capture counts and cuts the stack's
    field, leaving the slots."""
    from posenc.census.tiny import tiny_config
    from posenc.trace.counts import layer_count, reduced_config

    hf = tiny_config("hrm_text").config
    slots = hf.num_layers_per_stack * hf.H_cycles * (hf.L_cycles + 1)
    assert (layer_count(hf), hf.num_hidden_layers) == (hf.num_layers_per_stack, slots)
    cut = reduced_config(hf, 1)
    assert (cut.num_layers_per_stack, cut.num_hidden_layers) == (1, slots)


@pytest.mark.slow
def test_a_recurrent_stack_layer_traces_and_matches_its_module(tmp_path: Path) -> None:
    folder = _tiny("hrm_text", tmp_path)
    result = export_traced(tmp_path / "layer0.onnx", folder, layer=0, rewrite=replace_positions)
    record = result.manifest.trace
    assert record is not None
    assert record.attention.path == "L_module.layers.0.self_attn"
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, report.to_markdown()


def test_a_stack_fed_hidden_states_or_multi_channel_ids_gets_seeded_inputs() -> None:
    """The capture's main input of a stack that takes no plain token ids: seeded hidden states of the model's width
    (SpeechT5's stacks, their prenets outside), or ids ``[1, S, channels]`` (Dia's decoder: ``TOKEN_AXES``)."""
    from types import SimpleNamespace

    import torch

    from posenc.trace.stacks import stack_inputs

    class Stack(torch.nn.Module):
        def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> None:
            return None

    class Codes(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, past_key_values: object = None) -> None:
            return None

    (first, plain) = stack_inputs(Stack(), SimpleNamespace(hidden_size=24), 5)
    assert first["hidden_states"].shape == plain["hidden_states"].shape == (1, 5, 24)
    dia = SimpleNamespace(model_type="dia_decoder", num_channels=3, vocab_size=40)
    ids = stack_inputs(Codes(), dia, 5)[0]["input_ids"]
    assert ids.shape == (1, 5, 3)
    assert int(ids.max()) < 40
    assert stack_inputs(Codes(), SimpleNamespace(model_type="bart", vocab_size=40), 5) == []
