"""Second streams of their own length: T5Gemma 2's decoder attends its encoder's states in the same softmax as its
own tokens (merged self- and cross-attention), ``encoder_hidden_states [B, S_enc, E]`` with ``S_enc`` its own;
PEGASUS-X's encoder attention reads and returns its global tokens' states ``[B, G, E]`` beside the tokens'.

T5Gemma 2's decoder ("T5Gemma 2: Seeing, Reading, and Understanding Longer", Zhang et al., 2025,
https://arxiv.org/abs/2512.14856) concatenates the keys and values it projects from the encoder's states after its
own (cached) keys and values, and its mask after its own causal (or sliding) mask. The unit takes the states as the
graph input ``encoder_hidden_states [batch, source, E]`` after the others, rebuilds the merged mask from positions
(the encoder's columns all visible) and projects the encoder's keys and values at every call (not cached).

PEGASUS-X ("Investigating Efficiently Extending Transformers for Long Input Summarization", Phang, Zhao and Liu,
2022, https://arxiv.org/abs/2208.04347) pads its encoder's sequence to whole blocks before its layers; its global-local
attention lets each block's tokens attend their block and the global tokens, and the global tokens attend everything.
The unit takes ``global_hidden_states [batch, G, E]`` as a graph input and returns them updated
(``global_hidden_states_out``), padding its input to whole blocks as the encoder does.

References: the checkpoint's own transformers decoder / encoder run on its own (hooked at the layer's attention; for
T5Gemma 2 a prompt, then a decode step with its cache; for PEGASUS-X a sequence that is not whole blocks), and
``validate --against-hf`` / ``--decode`` in the slow run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from posenc.errors import ExportError
from posenc.trace.build import plan_trace, traced_module
from posenc.trace.capture import capture_layer


def _decoder(folder: Path) -> None:
    from posenc.census.tiny import save_tiny_model, tiny_config

    save_tiny_model(tiny_config("t5gemma2_decoder").config, "T5Gemma2Decoder", folder)


def _model_steps(folder: Path, layer: int, encoder: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Layer ``layer``'s attention in the decoder's own forward: a 6-token prompt, then one token with the model's
    cache; per call its hidden input and output, and the self-attention cache before the step."""
    from transformers.models.t5gemma2.modeling_t5gemma2 import T5Gemma2Decoder

    model = T5Gemma2Decoder.from_pretrained(folder, attn_implementation="eager").eval()
    seen: list[dict[str, torch.Tensor]] = []

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: tuple) -> None:
        seen.append({"hidden": kwargs.get("hidden_states", args[0] if args else None), "out": output[0]})

    ids = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(3))
    cache = transformers.EncoderDecoderCache(
        transformers.DynamicCache(config=model.config), transformers.DynamicCache()
    )
    handle = model.layers[layer].self_attn.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=ids[:, :6], encoder_hidden_states=encoder, past_key_values=cache, use_cache=True)
            own = cache.self_attention_cache.layers[layer]
            seen[0]["past"] = (own.keys.clone(), own.values.clone())
            model(input_ids=ids[:, 6:], encoder_hidden_states=encoder, past_key_values=cache, use_cache=True)
    finally:
        handle.remove()
    return seen


@pytest.mark.slow
def test_merged_attention_takes_the_encoder_states_as_a_stream_of_their_own_length(tmp_path: Path) -> None:
    """T5Gemma 2's full-attention decoder layer: the capture names ``encoder_hidden_states`` a stream of length
    ``source`` and the mask's encoder columns joined to it; the unit matches the decoder's own attention within 1e-5
    on a prompt and on a decode step over its cache (posenc's float64 angles), with 9 encoder states to the 6
    tokens; other encoder states move it."""
    folder = tmp_path / "t5gemma2_decoder"
    _decoder(folder)
    captured = capture_layer(folder, 5)
    assert captured.call.keywords["encoder_hidden_states"] == "stream"
    assert captured.call.constants["encoder_hidden_states"] == ["source", 64]
    assert captured.mask.joined == "encoder_hidden_states"
    assert captured.mask.causal
    unit = traced_module(plan_trace(captured), angles="exact")
    encoder = torch.randn(1, 9, 64, generator=torch.Generator().manual_seed(5))
    prompt, step = _model_steps(folder, 5, encoder)
    with torch.no_grad():
        got = unit(prompt["hidden"], torch.arange(6).unsqueeze(0), None, None, encoder)[0]
        past_key, past_value = prompt["past"]
        stepped = unit(step["hidden"], torch.tensor([[6]]), past_key, past_value, encoder)[0]
        other = unit(prompt["hidden"], torch.arange(6).unsqueeze(0), None, None, encoder[:, :4])[0]
    assert torch.allclose(got, prompt["out"], atol=1e-5, rtol=1e-5), float((got - prompt["out"]).abs().max())
    assert torch.allclose(stepped, step["out"], atol=1e-5, rtol=1e-5), float((stepped - step["out"]).abs().max())
    assert not torch.allclose(other, prompt["out"], atol=1e-3)


def test_a_joined_stream_whose_keys_the_mask_hides_is_refused() -> None:
    """A merged mask that hides some of the encoder's keys (padding) is refused naming the stream; one that shows
    them all is split into the tokens' part and the stream's name."""
    from posenc.trace.calls import split_joined

    positions = torch.arange(4).unsqueeze(0)
    causal = torch.zeros(1, 1, 4, 4).masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), torch.finfo().min)
    encoder = {"encoder_hidden_states": torch.randn(1, 3, 8)}
    mask, joined = split_joined(torch.cat((causal, torch.zeros(1, 1, 4, 3)), dim=-1), encoder, positions)
    assert joined == "encoder_hidden_states"
    assert torch.equal(mask, causal)
    padded = torch.zeros(1, 1, 4, 3)
    padded[..., -1] = torch.finfo().min
    with pytest.raises(ExportError, match="hides some of 'encoder_hidden_states'"):
        split_joined(torch.cat((causal, padded), dim=-1), encoder, positions)
    assert split_joined(causal, encoder, positions) == (causal, None)


def test_the_unit_rebuilds_the_merged_mask_with_every_encoder_key_visible() -> None:
    """The unit's mask of a joined stream: the tokens' causal mask over ``P + S`` keys, then ``S_enc`` columns every
    query sees (additive: 0), as T5Gemma 2's decoder concatenates its bidirectional encoder mask."""
    from posenc.trace.module import TracedAttention
    from posenc.trace.record import CallRecipe, MaskRecipe

    call = CallRecipe((), {"hidden_states": "hidden", "encoder_hidden_states": "stream"}, {"encoder_hidden_states":
                      ["source", 8]})  # fmt: skip
    recipe = MaskRecipe("additive", causal=True, joined="encoder_hidden_states")
    unit = TracedAttention(torch.nn.Identity(), None, 0, call, None, recipe)
    assert unit.stream_keys == ["encoder_hidden_states"]
    hidden, encoder = torch.zeros(1, 2, 8), torch.zeros(1, 5, 8)
    mask = unit._mask(hidden, torch.tensor([[3, 4]]), 3, {"encoder_hidden_states": encoder})
    assert mask is not None
    assert tuple(mask.shape) == (1, 1, 2, 3 + 2 + 5)
    hidden_keys = mask < 0
    assert hidden_keys[0, 0, 0].tolist() == [False] * 4 + [True] + [False] * 5  # query 3 does not see key 4
    assert not hidden_keys[..., 5:].any()


def test_a_stream_of_its_own_length_is_told_from_one_over_the_tokens() -> None:
    """``value_embeds`` must cover the tokens; ``encoder_hidden_states`` may have any length of the batch; a feed's
    ``source`` length is its own (not ``seq``), and the rule is the same one the exporter declares."""
    from posenc.export.feeds import SOURCE, dim_size
    from posenc.export.shapes import Shape
    from posenc.trace.arguments import classify
    from posenc.trace.inputs import STREAM_LENGTHS

    positions = torch.arange(8).unsqueeze(0)
    assert classify("encoder_hidden_states", torch.randn(1, 5, 16), positions, None, transformers.Cache, False) == (
        "stream"
    )
    with pytest.raises(ExportError, match="the encoder's states"):
        classify("encoder_hidden_states", torch.randn(2, 5, 16), positions, None, transformers.Cache, False)
    with pytest.raises(ExportError, match="value embeddings"):
        classify("value_embeds", torch.randn(1, 5, 16), positions, None, transformers.Cache, False)
    assert STREAM_LENGTHS["encoder_hidden_states"] == SOURCE
    assert [dim_size(SOURCE, Shape(1, seq, past)) for seq, past in ((1, 0), (4, 3), (1, 60))] == [3, 6, 33]


def test_a_weight_used_twice_is_one_initializer_of_its_name() -> None:
    """A module that multiplies two inputs by one weight folds into two equal initializers; linked to the weights
    file they become one value named after the weight (an ONNX graph's names are unique), read by both nodes."""
    import onnx
    from onnx import helper, numpy_helper

    from posenc.export.external import drop_duplicates, match_initializers, rename_values

    weight = np.arange(64, dtype=np.float32).reshape(8, 8)
    nodes = [helper.make_node("MatMul", [x, w], [y]) for x, w, y in (("a", "w0", "ya"), ("b", "w1", "yb"))]
    inputs = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, 8]) for n in "ab"]
    outputs = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, 8]) for n in ("ya", "yb")]
    inits = [numpy_helper.from_array(weight.T.copy(), name) for name in ("w0", "w1")]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits))
    links = match_initializers(model, {"k_proj.weight": torch.from_numpy(weight)}, min_bytes=0)
    assert links == {"w0": "k_proj.weight.T", "w1": "k_proj.weight.T"}
    drop_duplicates(model, links)
    rename_values(model, links)
    onnx.checker.check_model(model)
    assert [init.name for init in model.graph.initializer] == ["k_proj.weight.T"]
    assert [node.input[1] for node in model.graph.node] == ["k_proj.weight.T", "k_proj.weight.T"]


@pytest.mark.slow
@pytest.mark.parametrize("layer", [0, 5], ids=["sliding", "full"])
def test_t5gemma2_decoder_layers_export_with_encoder_states_and_match_the_module(layer: int, tmp_path: Path) -> None:
    """Both layer kinds of T5Gemma 2's decoder export with ``encoder_hidden_states [batch, source, 64]`` as the last
    graph input; ``validate --against-hf`` (the transformers module fed the same encoder states) and the decode
    sequence against the checkpoint's module carrying its own cache pass."""
    from posenc.export.trace import export_traced
    from posenc.graphs.trace_rewrite import replace_positions
    from posenc.validate.checkpoint import decode_against_checkpoint, validate_against_checkpoint

    folder = tmp_path / "t5gemma2_decoder"
    _decoder(folder)
    result = export_traced(tmp_path / f"l{layer}.onnx", folder, layer=layer, rewrite=replace_positions)
    assert result.manifest.input_names[-1] == "encoder_hidden_states"
    assert tuple(result.manifest.input("encoder_hidden_states").shape) == ("batch", "source", 64)
    assert "source" in result.manifest.dynamic_dims
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, report.to_markdown()
    decode = decode_against_checkpoint(result.path, folder, quiet=True)
    assert decode.passed, decode.to_markdown()


def test_a_padding_mask_hiding_no_token_is_rebuilt_over_whole_blocks() -> None:
    """A float ``[B, S]`` mask of zeros is kind ``padding``; over a sequence padded to whole blocks the rebuilt mask
    hides exactly the padding (the dtype's minimum), and the states are padded with zeros to ``ceil(S / block)``
    blocks."""
    from posenc.trace.arguments import classify, pad_blocks, padding_block, padding_mask
    from posenc.trace.record import CallRecipe

    positions = torch.arange(8).unsqueeze(0)
    assert classify("attention_mask", torch.zeros(1, 8), positions, None, transformers.Cache, False) == "padding"
    # not over the tokens: not a padding mask (an all-zero additive mask, kind zeros: Longformer's over its window)
    assert classify("attention_mask", torch.zeros(1, 12), positions, None, transformers.Cache, False) == "zeros"
    states = torch.randn(2, 7, 3)
    padded = pad_blocks(states, 4)
    assert tuple(padded.shape) == (2, 8, 3)
    assert torch.equal(padded[:, :7], states)
    assert not padded[:, 7:].any()
    mask = padding_mask(8, 7, states, "float32")
    assert tuple(mask.shape) == (2, 8)
    assert (mask[:, 7] == torch.finfo(torch.float32).min).all()
    assert not mask[:, :7].any()
    recipe = CallRecipe((), {"token_hidden_states": "hidden", "attention_mask": "padding"}, {"attention_mask":
                        ["float32", 4]})  # fmt: skip
    assert padding_block(recipe) == 4


def _pegasus_x(folder: Path) -> None:
    from posenc.census.tiny import save_tiny_model, tiny_config

    save_tiny_model(tiny_config("pegasus_x", overrides={"block_size": 4}).config, "PegasusXModel", folder)


@pytest.mark.slow
def test_global_tokens_are_a_second_input_and_output_that_match_the_encoder(tmp_path: Path) -> None:
    """PEGASUS-X's encoder layer 0 (blocks of 4): the unit takes the global tokens' states as a stream of fixed
    length 32 and returns them updated; on 7 tokens (the encoder pads them to 8) it matches the encoder's own
    attention on the tokens and on the global tokens within 1e-5; other global states move both."""
    from transformers.models.pegasus_x.modeling_pegasus_x import PegasusXModel

    folder = tmp_path / "pegasus_x"
    _pegasus_x(folder)
    captured = capture_layer(folder, 0, "encoder")
    assert captured.call.keywords["global_hidden_states"] == "stream"
    assert captured.call.constants["global_hidden_states"] == [32, 64]
    assert captured.call.constants["attention_mask"] == ["float32", 4]
    unit = traced_module(plan_trace(captured), angles="native")
    assert unit.stream_outputs == ["global_hidden_states"]
    model = PegasusXModel.from_pretrained(folder, attn_implementation="eager").eval()
    seen: dict[str, torch.Tensor] = {}

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: tuple) -> None:
        seen.update(hidden=kwargs["token_hidden_states"], states=kwargs["global_hidden_states"])
        seen.update(out=output[0], updated=output[1])

    handle = model.encoder.layers[0].self_attn.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model.encoder(input_ids=torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(2)))
    finally:
        handle.remove()
    assert tuple(seen["hidden"].shape) == (1, 8, 64)  # the encoder padded 7 tokens to two blocks
    positions = torch.arange(7).unsqueeze(0)
    with torch.no_grad():
        out, updated = unit(seen["hidden"][:, :7], positions, seen["states"])
        other = unit(seen["hidden"][:, :7], positions, torch.zeros_like(seen["states"]))
    assert torch.allclose(out, seen["out"][:, :7], atol=1e-5, rtol=1e-5), float((out - seen["out"][:, :7]).abs().max())
    assert torch.allclose(updated, seen["updated"], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(other[0], seen["out"][:, :7], atol=1e-3)
    assert not torch.allclose(other[1], seen["updated"], atol=1e-3)


@pytest.mark.slow
def test_pegasus_x_encoder_layer_exports_with_its_global_tokens_and_matches_the_module(tmp_path: Path) -> None:
    """PEGASUS-X's encoder layer 0 exports with ``global_hidden_states [batch, 32, 64]`` as its last input and
    ``global_hidden_states_out`` as its last output; ``validate --against-hf`` (lengths across blocks of 4) passes,
    and the manifest says the sequence is padded to whole blocks."""
    from posenc.export.trace import export_traced
    from posenc.graphs.trace_rewrite import replace_positions
    from posenc.validate.checkpoint import validate_against_checkpoint

    folder = tmp_path / "pegasus_x"
    _pegasus_x(folder)
    result = export_traced(tmp_path / "enc0.onnx", folder, layer=0, layer_type="encoder", rewrite=replace_positions)
    assert result.manifest.input_names[-1] == "global_hidden_states"
    assert tuple(result.manifest.input("global_hidden_states").shape) == ("batch", 32, 64)
    assert result.manifest.output_names == ["out", "global_hidden_states_out"]
    assert any(part.part == "sequence padding" for part in result.manifest.trace.parts)
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, report.to_markdown()
    assert {row.output for row in report.rows} == {"out", "global_hidden_states_out"}
