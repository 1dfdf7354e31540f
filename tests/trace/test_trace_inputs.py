"""Models whose forward needs more than token ids to reach the layer's attention (``posenc.trace.inputs``).

The capture passes what :data:`posenc.trace.inputs.CAPTURE_INPUTS` declares (a language, boxes, ids per codebook);
an argument of the attention computed from those inputs is refused, saying what it is. References: the checkpoint's
own transformers attention module called as its model calls it (``hf-fp32``, ``hf-fp64``) and posenc's float64
rebuild of the traced graph (``eager-fp64``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from posenc.errors import ConfigError, ExportError
from posenc.export.trace import export_traced
from posenc.graphs.trace_rewrite import replace_positions
from posenc.trace import inputs
from posenc.trace.capture import capture_layer
from posenc.validate.checkpoint import validate_against_checkpoint

_SMALL = { "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32,
          "vocab_size": 64, "max_position_embeddings": 40}  # fmt: skip


def _save(config_class: str, model_class: str, folder: Path, **settings: object) -> Path:
    import torch
    import transformers

    config = getattr(transformers, config_class)(**{"hidden_size": 32, **_SMALL, **settings})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        getattr(transformers, model_class)(config).save_pretrained(folder)
    return folder


def test_a_model_that_needs_a_language_is_captured_with_its_declared_input(tmp_path: Path) -> None:
    """X-MOD refuses to run without a language; with the table's ``lang_ids`` its first layer's call is captured
    (its embedding step and attention; the slow sweep below exports it and holds it to its own module). Without the
    entry the capture fails."""
    folder = _save("XmodConfig", "XmodModel", tmp_path / "xmod", languages=["en_XX", "de_DE"])
    captured = capture_layer(folder, 0)
    assert captured.attention_ref.path == "encoder.layer.0.attention"
    assert captured.embedding is not None
    assert captured.embedding.record.position.path == "embeddings"
    table = {k: v for k, v in inputs.CAPTURE_INPUTS.items() if k != "xmod"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(inputs, "CAPTURE_INPUTS", table)
        with pytest.raises(ExportError, match="Input language unknown"):
            capture_layer(folder, 0)


def test_an_argument_computed_from_another_layer_s_stream_is_refused_saying_what_it_is(tmp_path: Path) -> None:
    """LiLT's first layer takes its layout stream computed from the boxes (the unit's ``bbox``, test_trace_boxes);
    a later layer takes the stream the layer before it returned, which the unit cannot rebuild: refused by name."""
    folder = _save("LiltConfig", "LiltModel", tmp_path / "lilt", hidden_size=48, channel_shrink_ratio=2,
                   num_hidden_layers=2)  # fmt: skip
    with pytest.raises(ExportError, match=r"'layout_inputs' \(\[1, 8, 24\]\), the layout stream's states"):
        capture_layer(folder, 1)


def test_encodings_a_module_computed_from_other_data_than_the_hidden_states_are_not_called_again() -> None:
    """A relative-encodings module is called again by the unit on its hidden states only where it read nothing else
    floating: SpeechT5's ``embed_positions(hidden)`` is; BROS's box embeddings of its scaled boxes ``[B, S, 8]`` and
    UDOP's bias of its mask ``[B, S]`` and boxes are not (they are computed from the unit's boxes instead,
    ``posenc.trace.boxes``). The attention forward's first keyword is its hidden states where nothing is passed
    positionally (PEGASUS-X's ``token_hidden_states``, beside the global tokens' ``global_hidden_states``)."""
    import torch

    from posenc.trace.calls import Call, _reads_hidden_only
    from posenc.trace.capture import _hidden_key

    hidden = torch.zeros(1, 8, 32)
    assert _reads_hidden_only(Call((hidden,), {}), hidden)
    assert _reads_hidden_only(Call((torch.ones(1, 8, 32), 8), {}), hidden)
    assert not _reads_hidden_only(Call((torch.zeros(1, 8, 8),), {}), hidden)  # BROS's boxes
    assert not _reads_hidden_only(Call((), {"attention_mask": torch.ones(1, 8), "bbox": torch.zeros(1, 8, 4)}), hidden)
    keywords = Call((), {"token_hidden_states": hidden, "global_hidden_states": torch.zeros(1, 4, 32)})
    assert (
        _hidden_key(keywords, ["token_hidden_states", "global_hidden_states", "attention_mask"])
        == "token_hidden_states"
    )
    assert _hidden_key(Call((hidden,), {}), ["hidden_states"]) is None
    assert _hidden_key(Call((), {"hidden_states": hidden}), ["x", "hidden_states"]) == "hidden_states"


def test_a_wrapper_with_a_tower_per_stack_traces_its_encoder(tmp_path: Path) -> None:
    """T5Gemma holds a ``t5_gemma_module`` as its encoder and as its decoder: the capture takes the encoder's (the
    default stack), and refuses the decoder's with the reason."""
    import torch
    import transformers

    module = {
        **_SMALL,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "pad_token_id": 63,
        "layer_types": ["full_attention"],
        "hidden_size": 32,
    }  # pad: an id the capture's tokens do not hold (a padding mask hides no key)
    config = transformers.T5GemmaConfig(encoder=dict(module), decoder=dict(module), vocab_size=64, pad_token_id=63)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformers.T5GemmaForConditionalGeneration(config).save_pretrained(tmp_path / "t5gemma")
    captured = capture_layer(tmp_path / "t5gemma", 0)
    assert captured.tower is not None
    assert captured.tower.path == "model.encoder"
    assert captured.cacheless
    with pytest.raises(ConfigError, match=r"not its decoder's \(model.decoder\) yet"):
        capture_layer(tmp_path / "t5gemma", 0, "decoder")


def test_ids_per_codebook_and_one_stream_inputs() -> None:
    class Config:
        model_type = "musicgen_decoder"
        num_codebooks = 4
        num_channels = 3
        image_size = 64

    assert inputs.capture_inputs(Config(), 8) == ((4, 8), {})
    assert inputs.capture_refusal(Config()) is None
    Config.model_type = "llama"
    assert inputs.capture_inputs(Config(), 8) == ((1, 8), {})
    Config.model_type = "vilt"  # text and image patches in one sequence: captured on a zero image, not refused
    assert inputs.capture_refusal(Config()) is None
    shape, extra = inputs.capture_inputs(Config(), 8)
    assert (shape, list(extra), extra["pixel_values"].shape) == ((1, 8), ["pixel_values"], (1, 3, 64, 64))


def test_text_and_image_patches_in_one_sequence_are_captured_as_the_attention_over_it(tmp_path: Path) -> None:
    """ViLT's layers attend over its text tokens and image patches joined (8 tokens, then a class patch and the
    4 patches of a 64 px image of 32 px patches): the capture, on the table's zero image, takes the attention over
    that whole sequence, with no embedding step, and the manifest's part says what the sequence is and that its
    positions enter outside the unit. (The slow sweep below exports ViLT and TVP and holds them to their module.)"""
    from posenc.trace.stacks import outside_parts

    folder = _save("ViltConfig", "ViltModel", tmp_path / "vilt", image_size=64, patch_size=32)
    captured = capture_layer(folder, 0)
    assert captured.attention_ref.path == "encoder.layer.0.attention"
    assert captured.embedding is None
    assert captured.cacheless
    hidden, _, out = captured.probe
    assert hidden.shape[1] == out.shape[1] == 8 + 1 + 4
    (part,) = outside_parts(captured.outside, captured.model_type)
    assert (part.part, part.status) == ("stack embeddings", "absent")
    assert "text tokens (learned positions) and the image patches" in part.detail
    assert "attention over the whole sequence" in part.detail
    assert "image patches" not in outside_parts(captured.outside, "albert")[0].detail


def test_segments_split_by_position_and_open_square_masks_are_read_as_kinds() -> None:
    """CPM-Ant's call arguments, as kinds the unit rebuilds: its ``int32`` mask ``[B, S, S]`` of ones is a mask (one
    with a zero, a padded call, is not), its ``int32`` positions are the position ids in that dtype, and its segments
    ``[0] * P + [2] * T`` a split at ``P`` (a padding segment among the text is no split); each rebuilt as captured."""
    import torch

    from posenc.trace import arguments

    positions = torch.arange(12).unsqueeze(0)
    hidden = torch.zeros(1, 12, 8)
    ones = torch.ones(1, 12, 12, dtype=torch.int32)
    assert arguments.classify("attention_mask", ones, positions, hidden, type(None), False) == "mask"
    padded = ones.clone()
    padded[0, :, 5] = 0
    assert not arguments.is_open_square(padded)
    assert not arguments.is_open_square(torch.ones(1, 12, 11, dtype=torch.int32))
    recast = positions.to(torch.int32)
    assert arguments.classify("#0", recast, positions, hidden, type(None), False) == "position_ids"
    segments = torch.tensor([[0] * 4 + [2] * 8], dtype=torch.int32)
    assert arguments.segments_of(segments, positions) == (4, 0, 2)
    gap = segments.clone()
    gap[0, 7] = 0  # a padding id among the text
    assert arguments.segments_of(gap, positions) is None
    constants: dict[str, object] = {}
    arguments.keep(constants, "#0", "position_ids", recast)
    arguments.keep(constants, "#2", "segments", segments)
    assert constants == {"#0": "int32", "#2": [4, 0, 2, "int32"]}
    assert torch.equal(arguments.rebuild("#0", "position_ids", constants, hidden, positions, 0), recast)
    assert torch.equal(arguments.rebuild("#2", "segments", constants, hidden, positions, 0), segments)
    later = positions[:, 3:6]  # positions 3 .. 5: the prompt's last, then text
    made = arguments.rebuild("#2", "segments", constants, hidden[:, :3], later, 0)
    assert made.tolist() == [[0, 2, 2]]


PASS = (
    "xmod",
    "musicgen_decoder",
    "musicgen_melody_decoder",
    "step3p5",
    "step3p7",
    "hunyuan_vl",
    "hunyuan_vl_text",
    "kyutai_speech_to_text",
    "t5gemma",
    "idefics",
    "clvp_encoder",  # its angles of positions 0 .. S - 1 called on the context's length (test_trace_derived)
    "vilt",  # the attention over text and image patches joined, fed a zero image (stack embeddings: absent)
    "tvp",  # the same over a text prompt, the text and the video frames' grid
    "cpmant",  # prompt and text in one call without padding, segments from the positions, traced without a cache
    "bros",  # the box-derived arguments computed from the unit's bbox input (test_trace_boxes)
    "layoutlmv3",
    "lilt",
    "udop",  # its encoder (the default stack)
)
"""Census types that trace and match their own module once the capture has their inputs (or the tiny config the
fields their model needs)."""
REFUSED = {
    "t5gemma2": "'encoder_hidden_states'",
    "bailing_hybrid": "layer 0 of this bailing_hybrid model has no softmax attention",
}
"""Census types whose forward now runs, refused with the attention argument the unit cannot rebuild (or, for a
linear-attention layer, as having no softmax attention)."""


@pytest.mark.slow
@pytest.mark.parametrize("name", [*PASS, *REFUSED])
def test_every_type_with_declared_inputs_traces_or_is_refused_by_name(name: str, tmp_path: Path) -> None:
    import shutil

    from posenc.census.tiny import save_tiny_model, tiny_configs
    from posenc.census.types import model_type_info

    folder = tmp_path / name
    for tiny in tiny_configs(name):  # the first tiny config the model builds from, as the census takes it
        try:
            save_tiny_model(tiny.config, model_type_info(name).model_class, folder)  # type: ignore[union-attr]
            break
        except ValueError:  # widths its convolutions refuse (Kyutai's codec groups): the next config
            shutil.rmtree(folder, ignore_errors=True)
    if name in REFUSED:
        with pytest.raises((ConfigError, ExportError), match=REFUSED[name]):
            export_traced(tmp_path / f"{name}.onnx", folder, layer=0)
        return
    result = export_traced(tmp_path / f"{name}.onnx", folder, layer=0, rewrite=replace_positions)
    parts = {part.part: part.status for part in result.manifest.trace.parts}
    if name.startswith("musicgen") or name in inputs.ONE_STREAM:  # positions added before layer 0, outside the unit
        assert parts["stack embeddings"] == "absent"
    if name == "cpmant":  # its segment-and-position bias, by its own module, segments rebuilt from the positions
        assert result.manifest.trace.cacheless
        details = [part.detail for part in result.manifest.trace.parts if part.part == "stack position tensor"]
        assert any("0 below position 32 and 2 from it" in detail for detail in details)
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, f"{name}\n{report.to_markdown()}"
