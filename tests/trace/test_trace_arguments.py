"""Arguments the traced unit rebuilds beyond hidden states, positions and cache: multi-axis position ids of text tokens
(vision-language text towers' M-RoPE ``[3, B, S]``) and position embeddings of a rotary module called once per layer
type (ModernBERT's global and local theta).

References: the checkpoint's own transformers model run on its own (whole forward, 3-D position ids as a user passes
them, hooked at the layer's attention), and ``validate --against-hf`` (the checkpoint's attention module, float32 and
float64 angles) for every sample in the slow run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from posenc.checkpoints.source import CheckpointSource
from posenc.export.trace import export_traced
from posenc.graphs.trace_rewrite import replace_positions
from posenc.trace.build import plan_trace, traced_module
from posenc.trace.capture import capture_layer
from posenc.validate.checkpoint import validate_against_checkpoint
from tests.trace.samples import BOUNDED, OTHER_ARGUMENTS, ROTARY_PER_TYPE, SECTIONS, build


def _attention_call(model: torch.nn.Module, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden, out)`` of layer 0's attention in the model's own forward on ``position_ids``."""
    seen: dict[str, torch.Tensor] = {}
    attention = model.layers[0].self_attn

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: tuple) -> None:
        seen["hidden"] = kwargs.get("hidden_states", args[0] if args else None)
        seen["out"] = output[0]

    handle = attention.register_forward_hook(hook, with_kwargs=True)
    ids = torch.randint(0, 96, (1, position_ids.shape[-1]), generator=torch.Generator().manual_seed(4))
    try:
        with torch.no_grad():
            model(input_ids=ids, position_ids=position_ids)
    finally:
        handle.remove()
    return seen["hidden"], seen["out"]


def test_m_rope_text_positions_are_rebuilt_and_are_posenc_s_rope(tmp_path: Path) -> None:
    """Qwen2-VL's text tower: its model hands the rotary module ``[3, B, S]`` ids. posenc rebuilds them from ``[B, S]``
    (every row the position), and its angles are plain RoPE of the same frequencies: the unit matches the model's own
    forward given 3-D ids at positions far from the capture's (native angles 1e-5; posenc's float64 angles within what
    transformers' float32 angles drift there)."""
    folder = build(SECTIONS["qwen2_vl_text"], tmp_path)
    captured = capture_layer(folder)
    assert captured.rotary_call is not None
    assert captured.rotary_call.positional == ("hidden", "sections")
    assert captured.rotary_call.constants == {"#1": 3}
    plan = plan_trace(captured)  # checks the unit against the model's own call on the capture's tokens
    assert plan.scheme == "rope"
    assert "mrope_section" not in plan.params
    assert plan.angles is not None
    assert plan.angles.layout == "half"

    model = transformers.Qwen2VLTextModel.from_pretrained(folder, attn_implementation="eager").eval()
    positions = torch.arange(3000, 3012)[None]
    hidden, want = _attention_call(model, positions[None].expand(3, 1, -1))
    with torch.no_grad():
        native = traced_module(plan)(hidden, positions)[0]
        exact = traced_module(plan, angles="exact", table_dtype=torch.float64)(hidden, positions)[0]
    assert float((native - want).abs().max()) <= 1e-5
    assert float((exact - want).abs().max()) <= 2e-3
    rows = torch.stack([positions, 3000 + (positions - 3000) // 4, 3000 + (positions - 3000) % 4])  # a 3x4 image
    hidden, image = _attention_call(model, rows)
    with torch.no_grad():  # another computation than any text positions: the unit serves text only
        assert float((traced_module(plan)(hidden, positions)[0] - image).abs().max()) > 1e-3


def test_a_rotary_module_called_per_layer_type_feeds_each_layer_its_own_angles(tmp_path: Path) -> None:
    """ModernBERT-decoder computes cos/sin once per layer type; its sliding layer reads the second call's (local
    theta). posenc finds that call, not the module's first."""
    sample = ROTARY_PER_TYPE["modernbert-decoder"]
    folder = build(sample, tmp_path)
    captured = capture_layer(folder, sample.layer)
    assert captured.rotary_call is not None
    assert captured.rotary_call.constants == {"#2": "sliding_attention"}
    plan = plan_trace(captured)
    config = sample.config()
    assert plan.params["rope_theta"] == config.rope_parameters["sliding_attention"]["rope_theta"]
    assert plan.params["rope_theta"] != config.rope_parameters["full_attention"]["rope_theta"]
    assert plan.angles is not None


def test_keys_and_values_shared_between_layers_and_a_positional_mask_are_rebuilt(tmp_path: Path) -> None:
    """Gemma 4 passes its attention a dict its layer stores keys and values in for later layers (a fresh one is
    rebuilt; the self-check against the model's own call passes); LFM3's tensors are read under the names
    save_pretrained wrote; VisualBERT passes its mask positionally (classified by the forward's parameter name)."""
    sample = OTHER_ARGUMENTS["gemma4_text-full"]
    captured = capture_layer(build(sample, tmp_path), sample.layer)
    assert captured.call.keywords["shared_kv_states"] == "kv_sharing"
    plan = plan_trace(captured)
    assert (plan.scheme, plan.params["partial_rotary_factor"]) == ("rope_proportional", 0.25)
    lfm3 = ROTARY_PER_TYPE["lfm3-full"]  # its gate is g_proj in memory, gate_proj on disk (transformers' conversion)
    folder = build(lfm3, tmp_path)
    captured = capture_layer(folder, lfm3.layer)
    with CheckpointSource.open(folder) as source:
        saved = source.tensor("model.layers.2.self_attn.gate_proj.weight")
    assert "model.layers.2.self_attn.gate_proj.weight" in captured.tensors
    assert torch.equal(captured.attention.g_proj.weight, saved)
    captured = capture_layer(build(OTHER_ARGUMENTS["visual_bert"], tmp_path))
    assert captured.call.positional[:2] == ("hidden", "mask")
    assert captured.mask.kind == "additive"
    plan_trace(captured)


ALL = {**SECTIONS, **ROTARY_PER_TYPE, **OTHER_ARGUMENTS, **BOUNDED}
LEARNED = {"visual_bert", "openai-gpt", "gpt_neo", "xglm"}
"""Samples whose positions enter at the embeddings (learned or sinusoidal table kept)."""
NOPE = {"gpt_neo-local"}
"""Samples whose layer reads no positions (a later layer of a model with learned positions)."""
ROTATION_KEPT = {"gemma4_text", "gemma4_text-full"}
"""Samples whose rotation is not a form posenc's rewrite recognises (it stays decomposed, on posenc's cos/sin)."""


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALL))
def test_every_rebuilt_argument_sample_exports_and_matches_its_own_module(name: str, tmp_path: Path) -> None:
    """Exported with posenc's rewrite and held to its own module by validate --against-hf; a module reading a buffer
    of the context's size by the lengths (BOUNDED) exports with torch.export's bounds, within the context."""
    sample = ALL[name]
    folder = build(sample, tmp_path)
    result = export_traced(tmp_path / f"{name}.onnx", folder, layer=sample.layer, rewrite=replace_positions)
    parts = {part.part: part.status for part in result.manifest.trace.parts}
    if name in LEARNED:
        assert parts["position table"] == "kept"
    elif name in NOPE:
        assert parts["rotary angles"] == "absent"
    else:
        assert parts["rotary angles"] == "replaced"
        assert parts["rotation"] == ("kept" if name in ROTATION_KEPT else "replaced")
    if name in BOUNDED:
        context = result.manifest.attention["max_position_embeddings"]
        assert context // 2 <= (result.manifest.dynamic_dims["seq"].max or 0) <= context
    report = validate_against_checkpoint(result.path, folder, layer=sample.layer)
    assert report.passed, report.to_markdown()
    exact = "hf-fp64" if name in LEARNED | NOPE else "hf-fp64, fp64 angles"
    assert {"hf-fp32", exact} <= {row.reference for row in report.rows}
