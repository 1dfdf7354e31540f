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


# --------------------------------------------------------------------------------------------------
# Every encoder-decoder type of transformers, on the census's tiny checkpoint (slow)
# --------------------------------------------------------------------------------------------------

BOTH = (
    "blenderbot",
    "blenderbot-small",
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
    "switch_transformers",
    "umt5",
    "whisper",
)
"""Types both of whose stacks trace and match."""
DECODER_ONLY = {
    "bigbird_pegasus": "attention_type from 'block_sparse' to 'original_full'",
    "led": "argument 'attention_mask'",
    "longt5": "argument 'mask'",
    "pegasus_x": "argument 'token_hidden_states'",
    "udop": "Bbox is required",
}
"""Types whose decoder traces and whose encoder is refused, with the reason's words: an attention posenc cannot
call from positions alone (local/global windows, block-sparse, a layout's boxes)."""


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
def test_decode_steps_carry_an_encoder_decoder_cache(mbart: Path, tmp_path: Path) -> None:
    """The decoder's ``EncoderDecoderCache`` through several decode steps, each held to the checkpoint's module."""
    result = export_traced(tmp_path / "decoder0.onnx", mbart, layer=0, layer_type="decoder", rewrite=replace_positions)
    report = decode_against_checkpoint(result.path, mbart)
    assert report.passed, report.to_markdown()
