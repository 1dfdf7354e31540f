"""Attentions fed their hidden states in another axis order (SqueezeBERT's channels-first ``[B, E, S]``, XLNet's and
FSMT's time-major ``[S, B, E]``) and attentions whose inputs a module of the layer computes (MobileBERT's bottleneck):
the unit keeps ``hidden [B, S, E] -> out [B, S, E]``, transposes around the module (``posenc.trace.orders``) and calls
the layer's stem first (``posenc.trace.stems``).

References: the checkpoint's own transformers model run on its own (whole forward, hooked at the layer's attention)
at another batch and length than the capture's (8 tokens, batch 1), and ``validate --against-hf`` in the slow run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from posenc.export.shapes import Shape
from posenc.export.trace import export_traced
from posenc.graphs.trace_rewrite import replace_positions
from posenc.trace.build import plan_trace, trace_record
from posenc.trace.capture import capture_layer
from posenc.trace.orders import ORDER_PART, from_model, order_of, to_model
from posenc.trace.stems import STEM_PART
from posenc.validate.checkpoint import decode_against_checkpoint, validate_against_checkpoint
from tests.trace.samples import unit_and_rebuilt

_TINY = {"vocab_size": 96, "pad_token_id": 0}
CASES: dict[str, tuple[str, dict[str, Any], str]] = {
    "squeezebert": (
        "SqueezeBertForMaskedLM",
        {
            "hidden_size": 64,
            "embedding_size": 64,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "q_groups": 2,
            "k_groups": 2,
            "v_groups": 2,
            "post_attention_groups": 2,
            "intermediate_groups": 2,
            "output_groups": 2,
            **_TINY,
        },
        "channels-first",
    ),
    "xlnet": (
        "XLNetLMHeadModel",
        {"d_model": 64, "n_layer": 2, "n_head": 4, "d_head": 16, "d_inner": 64, **_TINY},
        "time-major",
    ),
    "mobilebert": (
        "MobileBertForMaskedLM",
        {
            "hidden_size": 64,  # the layers' input; MobileBERT's real checkpoints: 512, 128, 128, 128
            "embedding_size": 32,
            "true_hidden_size": 32,
            "intra_bottleneck_size": 32,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_feedforward_networks": 2,
            **_TINY,
        },
        "batch-major",
    ),
}
"""Per model type: the class saved, the tiny config, the order its attention takes the hidden states in."""
CONFIGS = {"squeezebert": "SqueezeBertConfig", "xlnet": "XLNetConfig", "mobilebert": "MobileBertConfig"}


def _checkpoint(name: str, root: Path) -> Path:
    folder = root / name
    if not (folder / "config.json").exists():
        cls, settings, _ = CASES[name]
        torch.manual_seed(0)
        config = getattr(transformers, CONFIGS[name])(**settings)
        getattr(transformers, cls)(config).eval().save_pretrained(folder)
    return folder


def _attention_call(model: torch.nn.Module, attention: torch.nn.Module, ids: torch.Tensor) -> tuple[Any, Any]:
    """The attention's positional arguments and output in the model's own forward on ``ids``."""
    seen: dict[str, Any] = {}

    def after(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        seen["args"], seen["out"] = args, output

    handle = attention.register_forward_hook(after, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        handle.remove()
    return seen["args"], seen["out"]


def test_orders_are_read_from_the_shape_and_undone() -> None:
    positions = torch.arange(8).unsqueeze(0)
    hidden = torch.randn(1, 8, 64)
    for order, shape in (("batch-major", (1, 8, 64)), ("channels-first", (1, 64, 8)), ("time-major", (8, 1, 64))):
        model_side = to_model(hidden, order)
        assert tuple(model_side.shape) == shape
        assert order_of(model_side, positions, 64) == order
        assert torch.equal(from_model(model_side, order), hidden)


LAYER_INPUT = {"squeezebert": 0, "xlnet": 0, "mobilebert": 2}
"""Which positional argument of the attention is the layer's input (MobileBERT's ``value_tensor``)."""
OUTPUTS: dict[str, Callable[[Any], torch.Tensor]] = {
    "squeezebert": lambda out: out["context_layer"].permute(0, 2, 1),
    "xlnet": lambda out: out[0].transpose(0, 1),
    "mobilebert": lambda out: out[0],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_unit_matches_the_model_s_own_attention_in_its_order(name: str, tmp_path: Path) -> None:
    """Layer 1's unit (no embedding step), fed the layer's input as ``[B, S, E]`` at batch 2 and 11 tokens, gives the
    attention's output of the model's own forward (taken back to ``[B, S, E]``); so does the unit rebuilt from its
    manifest record. MobileBERT's unit starts at the layer's input (64 wide) and calls its bottleneck first (its
    attention's output is 32 wide, as real checkpoints' 128 after 512)."""
    folder = _checkpoint(name, tmp_path)
    captured = capture_layer(folder, 1)
    assert captured.order == CASES[name][2]
    assert (captured.stem_ref is not None) == (name == "mobilebert")
    plan = plan_trace(captured)  # checks the unit against the model's own call on the capture's tokens
    model = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    ids = torch.randint(1, 96, (2, 11), generator=torch.Generator().manual_seed(3))
    args, out = _attention_call(model, model.get_submodule(captured.attention_ref.path), ids)
    hidden = from_model(args[LAYER_INPUT[name]], captured.order)
    want = OUTPUTS[name](out)
    positions = torch.arange(11).expand(2, 11)
    record = trace_record(plan, ())
    assert record.order == captured.order
    assert record.stem == captured.stem_ref
    with torch.no_grad():
        for module in unit_and_rebuilt(plan):
            assert float((module(hidden, positions)[0] - want).abs().max()) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_order_and_stem_sample_exports_and_matches_its_own_module(name: str, tmp_path: Path) -> None:
    """Layer 1 exported (the transposes or the stem named in the manifest) and held to its own module by
    ``validate --against-hf``."""
    folder = _checkpoint(name, tmp_path)
    result = export_traced(tmp_path / f"{name}.onnx", folder, layer=1, rewrite=replace_positions)
    assert result.manifest.trace is not None
    parts = {part.part for part in result.manifest.trace.parts}
    assert (ORDER_PART in parts) == (CASES[name][2] != "batch-major")
    assert (STEM_PART in parts) == (name == "mobilebert")
    report = validate_against_checkpoint(result.path, folder, layer=1)
    assert report.passed, report.to_markdown()


@pytest.mark.slow
def test_mobilebert_s_first_layer_starts_at_its_narrower_token_embeddings(tmp_path: Path) -> None:
    """Layer 0's unit starts at the token embeddings (``embedding_size`` 32, the unit's ``hidden``) that MobileBERT's
    embeddings module widens (trigram input, 96 -> 64) and adds its learned positions to; torch.export guards the
    trigram's ``S - 1 != 1``, deferred (noted in the manifest), so the graph is also held to the module at S = 2."""
    folder = _checkpoint("mobilebert", tmp_path)
    result = export_traced(tmp_path / "mobilebert0.onnx", folder, layer=0, rewrite=replace_positions)
    assert result.manifest.trace is not None
    assert result.manifest.trace.embedding is not None
    assert any("deferred to runtime asserts" in note for note in result.manifest.notes)
    shapes = [Shape(1, 2), Shape(2, 2), Shape(3, 7), Shape(1, 1)]
    report = validate_against_checkpoint(result.path, folder, layer=0, shapes=shapes)
    assert report.passed, report.to_markdown()


@pytest.mark.slow
@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_fsmt_s_time_major_stacks_export_and_match_their_own_modules(stack: str, tmp_path: Path) -> None:
    """FSMT (fairseq's convention) hands both stacks' self-attention ``query=x, key=x`` time-major ``[S, B, E]``.
    Its decoder requires its encoder's states and masks (``posenc.trace.inputs``: as ``FSMTModel`` calls it with
    ``use_cache``, an ``EncoderDecoderCache`` and no masks); its cached unit also holds for decode steps."""
    torch.manual_seed(0)
    config = transformers.FSMTConfig(
        langs=["en", "de"], src_vocab_size=96, tgt_vocab_size=96, d_model=64, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=256, pad_token_id=1,
    )  # fmt: skip
    transformers.FSMTForConditionalGeneration(config).eval().save_pretrained(tmp_path / "fsmt")
    folder = tmp_path / "fsmt"
    result = export_traced(tmp_path / f"{stack}.onnx", folder, layer=0, layer_type=stack, rewrite=replace_positions)
    assert result.manifest.trace is not None
    assert result.manifest.trace.order == "time-major"
    assert result.manifest.trace.cacheless == (stack == "encoder")
    report = validate_against_checkpoint(result.path, folder, layer=0, layer_type=stack)
    assert report.passed, report.to_markdown()
    if stack == "decoder":
        steps = decode_against_checkpoint(result.path, folder, layer=0, layer_type=stack)
        assert steps.passed, steps.to_markdown()
