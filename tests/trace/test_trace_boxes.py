"""Document models whose attention reads what the model computes from its tokens' boxes (``posenc.trace.boxes``):
the traced unit takes ``bbox [B, S, 4]`` as its last input and calls the model's own code on it (LayoutLMv3's
``_cal_2d_pos_emb`` and spatial embeddings, LiLT's ``layout_embeddings``, BROS's ``bbox_embeddings`` of its scaled
corners, UDOP's encoder ``relative_bias``).

References: the checkpoint's own transformers model run whole on token ids and boxes (hooked at layer 0's attention)
at another batch and length than the capture's, and ``validate --against-hf`` in the slow run (the module called as
its model calls it, ``hf-fp32`` / ``hf-fp64``, and posenc's float64 rebuild, ``eager-fp64``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from posenc.checkpoints.samples import save_seeded
from posenc.errors import ConfigError
from posenc.trace import boxes
from posenc.trace.build import plan_trace
from posenc.trace.capture import capture_layer
from posenc.trace.record import BoxesRecord
from tests.trace.samples import unit_and_rebuilt

_SMALL = {"hidden_size": 48, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32,
          "vocab_size": 64, "max_position_embeddings": 40, "pad_token_id": 0}  # fmt: skip
_LAYOUTLMV3 = {"coordinate_size": 8, "shape_size": 8, "visual_embed": False}
_BROS = {"dim_bbox_sinusoid_emb_2d": 16, "dim_bbox_sinusoid_emb_1d": 2, "dim_bbox_projection": 24}
MODELS = {
    "lilt": ("LiltConfig", "LiltModel", {"channel_shrink_ratio": 2}),
    "layoutlmv3": ("LayoutLMv3Config", "LayoutLMv3Model", _LAYOUTLMV3),
    "bros": ("BrosConfig", "BrosModel", _BROS),
}
"""Per model type: config class, model class, settings of a small model (one layer)."""


def _save(name: str, folder: Path) -> Path:
    import transformers

    config_class, model_class, settings = MODELS[name]
    config = getattr(transformers, config_class)(**{**_SMALL, **settings})
    save_seeded(getattr(transformers, model_class), config, folder, seed=0, shard=None)  # perturbed: boxes matter
    return folder


def _model_call(folder: Path, name: str, ids: torch.Tensor, bbox: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(token embeddings, attention input, attention output)`` of layer 0 in the model's own forward on ``ids``
    and ``bbox``."""
    import transformers

    model = getattr(transformers, MODELS[name][1]).from_pretrained(folder, attn_implementation="eager").eval()
    attention = model.encoder.layer[0].attention
    seen: dict[str, torch.Tensor] = {"tokens": model.embeddings.word_embeddings(ids)}

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: object) -> None:
        seen["hidden"] = kwargs.get("hidden_states", args[0] if args else None)
        seen["out"] = output if torch.is_tensor(output) else output[0]  # type: ignore[index]

    handle = attention.register_forward_hook(hook, with_kwargs=True)
    positions = torch.arange(ids.shape[1]).expand(*ids.shape)
    try:
        with torch.no_grad():
            model(input_ids=ids, bbox=bbox, position_ids=positions)
    finally:
        handle.remove()
    return seen["tokens"], seen["hidden"], seen["out"]


@pytest.mark.parametrize("name", list(MODELS))
def test_the_unit_computes_from_its_boxes_what_the_model_does(name: str, tmp_path: Path) -> None:
    """The unit, and its rebuild from the manifest's record, match the model's own forward on other boxes at batch
    2 and 11 tokens (the capture ran 1 x 8 on its own boxes), and other boxes move its output: the boxes are read
    from the input, not kept from the capture."""
    folder = _save(name, tmp_path / name)
    captured = capture_layer(folder)
    assert captured.boxes is not None
    assert boxes.NAME in captured.streams
    plan = plan_trace(captured)
    ids = torch.randint(1, 64, (2, 11), generator=torch.Generator().manual_seed(5))
    dtype, top = captured.boxes.dtype, captured.boxes.top
    bbox = torch.from_numpy(boxes.seeded_boxes(2, 11, dtype, seed=7, top=top))
    tokens, hidden, want = _model_call(folder, name, ids, bbox)
    start = tokens if captured.embedding is not None else hidden  # LiLT's unit is the attention fed its input
    positions = torch.arange(11).expand(2, 11)
    for unit in unit_and_rebuilt(plan):
        with torch.no_grad():
            got = unit(start, positions, bbox)[0]
            other = unit(start, positions, torch.from_numpy(boxes.seeded_boxes(2, 11, dtype, seed=8, top=top)))[0]
        assert float((got - want).abs().max()) <= 1e-5
        assert float((other - want).abs().max()) > 1e-3


def test_seeded_boxes_are_valid_in_the_model_s_range_and_forms_are_told_apart() -> None:
    """Integer boxes on the 0 .. 1000 grid, floating ones in 0 .. 1, ``x0 <= x1`` and ``y0 <= y1``; an argument is
    the boxes (``given``), BROS's rearrangement of them (``points``), or neither; without boxes held the unit says
    to pass them."""
    for dtype, top in (("int64", boxes.GRID), ("float32", 1.0)):
        made = boxes.seeded_boxes(3, 17, dtype)
        assert made.shape == (3, 17, 4)
        assert made.dtype == np.dtype(dtype)
        assert 0 <= made.min() <= made.max() <= top
        assert (made[..., 2:] >= made[..., :2]).all()
    tensor = torch.from_numpy(boxes.seeded_boxes(1, 5, "float32"))
    held = boxes.Boxes(tensor, BoxesRecord("float32", 1.0, (0, 1, 2, 1, 2, 3, 0, 3), 100.0))
    with boxes.feeding(held):
        assert boxes.box_form(tensor.clone()) == "given"
        assert boxes.box_form(tensor[..., [0, 1, 2, 1, 2, 3, 0, 3]] * 100.0) == "points"
        assert boxes.box_form(tensor + 1) is None
        assert torch.equal(boxes.passed("points"), held.points())
    assert boxes.box_form(tensor) is None
    with pytest.raises(ConfigError, match="pass them"):
        boxes.passed("given")
    with pytest.raises(ConfigError, match=r"\[B, S, 4\]"):
        boxes.box_input(torch.zeros(1, 5, 8), held.record)


@pytest.mark.slow
def test_a_stack_that_reads_no_boxes_takes_no_bbox_input(tmp_path: Path) -> None:
    """UDOP's encoder computes its relative bias from the boxes (a ``bbox`` input, held to its own module); its
    decoder reads none of them: its graph takes ``hidden``, ``position_ids`` and the cache only, and matches its own
    module too."""
    from posenc.census.tiny import save_tiny_model, tiny_config
    from posenc.export.trace import export_traced
    from posenc.graphs.trace_rewrite import replace_positions
    from posenc.validate.checkpoint import validate_against_checkpoint

    folder = tmp_path / "udop"
    save_tiny_model(tiny_config("udop").config, "UdopForConditionalGeneration", folder)
    for stack, inputs in (("encoder", ["hidden", "position_ids", "bbox"]),
                          ("decoder", ["hidden", "position_ids", "past_key", "past_value"])):  # fmt: skip
        result = export_traced(tmp_path / f"{stack}.onnx", folder, layer=0, layer_type=stack, rewrite=replace_positions)
        assert [spec.name for spec in result.manifest.inputs] == inputs
        report = validate_against_checkpoint(result.path, folder)
        assert report.passed, report.to_markdown()
