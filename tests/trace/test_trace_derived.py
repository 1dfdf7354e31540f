"""Positional tensors a stack computes once from the sequence and hands every layer's attention (RoFormer's
``sinusoidal_pos`` from its encoder's ``embed_positions`` module, MPNet's ``position_bias`` from its encoder's
``compute_position_bias`` method): the traced unit calls the model's own code for them.

References: the checkpoint's own transformers model run on its own (whole forward, hooked at the layer's attention)
at another batch and length than the capture's, and ``validate --against-hf`` in the slow run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import transformers

from posenc.errors import ExportError
from posenc.export.trace import export_traced
from posenc.graphs.trace_rewrite import replace_positions
from posenc.trace.boxes import seeded_boxes
from posenc.trace.build import plan_trace, trace_record, traced_module
from posenc.trace.capture import capture_layer
from posenc.trace.derived import DERIVED_PART
from posenc.validate.checkpoint import validate_against_checkpoint
from tests.trace.samples import DERIVED, build, unit_and_rebuilt

CODE = {
    "roformer": ("sinusoidal_pos", "encoder.embed_positions", "forward", None),
    "mpnet": ("position_bias", "encoder", "compute_position_bias", ("relative_attention_bias",)),
    "beam": ("attention_scaling", None, "compute_attention_scaling", None),
    "layoutlmv3": ("rel_pos", "encoder", "_cal_1d_pos_emb", ("rel_pos_bias",)),
}
"""Per sample: the derived argument, the module whose code computes it, the method, the children the unit keeps."""


def _attention_call(model: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(token embeddings, hidden, out)`` of layer 0's attention in the model's own forward on token ids ``ids``
    at ``positions``."""
    seen: dict[str, torch.Tensor] = {"tokens": model.embeddings.word_embeddings(ids)}
    attention = model.encoder.layer[0].attention

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: tuple) -> None:
        seen["hidden"] = kwargs.get("hidden_states", args[0] if args else None)
        seen["out"] = output[0]

    handle = attention.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=ids, position_ids=positions)
    finally:
        handle.remove()
    return seen["tokens"], seen["hidden"], seen["out"]


@pytest.mark.parametrize("name", ["mpnet", pytest.param("roformer", marks=pytest.mark.slow)])  # beam: below
def test_a_stack_position_tensor_is_computed_by_the_model_s_own_code(name: str, tmp_path: Path) -> None:
    """The capture finds the code that computed the argument (a module's forward, or a method of the module holding
    the layers, pruned to the submodules it read); the unit, and its rebuild from the manifest's record, match the
    model's own forward at batch 2 and 13 tokens (the capture ran 1 x 8: a length taken as a constant would not);
    MPNet's unit starts at its token embeddings (its learned absolute positions enter there, beside the bias)."""
    folder = build(DERIVED[name], tmp_path)
    key, path, method, children = CODE[name]
    captured = capture_layer(folder)
    assert captured.call.keywords[key] == "derived"
    recipe = captured.derived[key].recipe
    assert (recipe.source.path, recipe.method, recipe.children) == (path, method, children)
    plan = plan_trace(captured)  # checks the unit against the model's own call on the capture's tokens
    model = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    ids = torch.randint(0, 96, (2, 13), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(13).expand(2, 13)
    tokens, hidden, want = _attention_call(model, ids, positions)
    if captured.embedding is not None:  # MPNet's learned positions enter at its embeddings: the unit starts there
        hidden = tokens
    with torch.no_grad():
        for module in unit_and_rebuilt(plan):
            assert float((module(hidden, positions)[0] - want).abs().max()) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DERIVED))
def test_every_stack_position_tensor_sample_exports_and_matches_its_own_module(name: str, tmp_path: Path) -> None:
    """Exported (the stack's tensor kept as traced, said so) and held to its own module by validate --against-hf."""
    sample = DERIVED[name]
    folder = build(sample, tmp_path)
    result = export_traced(tmp_path / f"{name}.onnx", folder, layer=sample.layer, rewrite=replace_positions)
    assert result.manifest.trace is not None
    parts = {part.part: part for part in result.manifest.trace.parts}
    assert parts[DERIVED_PART].status == "kept"
    assert (CODE[name][1] or CODE[name][2]) in parts[DERIVED_PART].detail
    report = validate_against_checkpoint(result.path, folder, layer=sample.layer)
    assert report.passed, report.to_markdown()


def test_a_position_dependent_scale_is_computed_by_the_model_s_function(tmp_path: Path) -> None:
    """Beam's NoPE layers scale the query by ``(1 + (p + 1) / 2048) ** 0.1``, computed before the layers by a
    function of its modeling module from the position ids: the unit calls that function (it reads the positions
    only, so a cached decoder layer takes it), and matches the model's own forward at positions 3000.. (the capture
    ran 0 .. 7: a scale taken as a constant would be ~9 % off)."""
    sample = DERIVED["beam"]
    folder = build(sample, tmp_path)
    captured = capture_layer(folder, sample.layer)
    assert not captured.cacheless
    recipe = captured.derived["attention_scaling"].recipe
    assert (recipe.source, recipe.method) == (None, "transformers.models.beam.modeling_beam:compute_attention_scaling")
    assert recipe.call.positional == ("position_ids",)
    plan = plan_trace(captured)
    model = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    seen: dict[str, torch.Tensor] = {}

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: tuple) -> None:
        seen["hidden"], seen["out"] = kwargs["hidden_states"], output[0]

    handle = model.layers[sample.layer].self_attn.register_forward_hook(hook, with_kwargs=True)
    positions = torch.arange(3000, 3011).expand(2, 11)
    ids = torch.randint(0, 96, (2, 11), generator=torch.Generator().manual_seed(5))
    try:
        with torch.no_grad():
            model(input_ids=ids, position_ids=positions)
    finally:
        handle.remove()
    with torch.no_grad():
        got = traced_module(plan)(seen["hidden"], positions)[0]
    assert float((got - seen["out"]).abs().max()) <= 1e-5


def test_a_stack_method_that_reads_a_child_s_weight_keeps_that_child(tmp_path: Path) -> None:
    """LayoutLMv3's encoder computes its 1-D relative bias ``rel_pos`` in ``_cal_1d_pos_emb`` by indexing
    ``rel_pos_bias.weight`` (the child never runs as a module): the unit keeps that child, and only it, and matches
    the model's own forward at batch 2 and 13 tokens (the capture ran 1 x 8). Its 2-D bias ``rel_2d_pos`` is computed
    from the unit's boxes input (``test_trace_boxes``)."""
    folder = build(DERIVED["layoutlmv3"], tmp_path)
    captured = capture_layer(folder)
    recipe = captured.derived["rel_pos"].recipe
    assert (recipe.source.path, recipe.method, recipe.children) == ("encoder", "_cal_1d_pos_emb", ("rel_pos_bias",))
    plan = plan_trace(captured)
    model = transformers.LayoutLMv3Model.from_pretrained(folder, attn_implementation="eager").eval()
    seen: dict[str, torch.Tensor] = {}

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: tuple) -> None:
        seen["out"] = output  # LayoutLMv3Attention returns its output states alone

    handle = model.encoder.layer[0].attention.register_forward_hook(hook, with_kwargs=True)
    ids = torch.randint(0, 96, (2, 13), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(13).expand(2, 13)
    bbox = torch.from_numpy(seeded_boxes(2, 13, "int64", top=63))  # its spatial embeddings read them (64 rows)
    try:
        with torch.no_grad():
            tokens = model.embeddings.word_embeddings(ids)
            model(input_ids=ids, bbox=bbox, position_ids=positions)
    finally:
        handle.remove()
    assert captured.embedding is not None  # its learned absolute positions enter at the embeddings: starts there
    with torch.no_grad():
        got = traced_module(plan)(tokens, positions, bbox)[0]
    assert float((got - seen["out"]).abs().max()) <= 1e-5


@pytest.mark.slow  # importing CLVP's modeling module alone takes seconds
def test_angles_computed_for_positions_below_the_length_are_computed_for_the_context(tmp_path: Path) -> None:
    """CLVP's rotary module computes angles of positions ``0 .. S - 1`` from the length and its attention gathers
    them at the position ids: the unit calls it on the context's length (``rotary_rows``), so it serves any position
    below it, matches the model's own forward (at 2 x 11 tokens, not the capture's 8) and its module at far positions
    (validate --against-hf). Without that, the plan refuses it (``check_offsets``) rather than an export that fails in
    ONNX Runtime's GatherND."""
    torch.manual_seed(0)
    config = transformers.ClvpEncoderConfig(hidden_size=64, num_attention_heads=2, projection_dim=64,
                                            intermediate_size=64, num_hidden_layers=2, vocab_size=96)  # fmt: skip
    model = transformers.ClvpEncoder(config).eval()
    model.save_pretrained(tmp_path / "clvp")
    captured = capture_layer(tmp_path / "clvp")
    assert captured.rotary_by_length
    with pytest.raises(ExportError, match=r"rotary_pos_emb \(ClvpRotaryPositionalEmbedding\).*0 \.\. S - 1"):
        plan_trace(dataclasses.replace(captured, rotary_by_length=False))
    plan = plan_trace(captured)
    assert trace_record(plan, ()).rotary_rows == plan.config.max_position_embeddings
    seen: dict[str, torch.Tensor] = {}

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: tuple) -> None:
        seen["hidden"], seen["out"] = args[0], output[0]

    handle = model.layers[0].self_attn.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=torch.randint(0, 96, (2, 11), generator=torch.Generator().manual_seed(3)))
    finally:
        handle.remove()
    with torch.no_grad():
        for module in unit_and_rebuilt(plan):
            got = module(seen["hidden"], torch.arange(11).expand(2, 11))[0]
            assert float((got - seen["out"]).abs().max()) <= 1e-5
    result = export_traced(tmp_path / "clvp.onnx", tmp_path / "clvp", rewrite=replace_positions)
    report = validate_against_checkpoint(result.path, tmp_path / "clvp")
    assert report.passed, report.to_markdown()
