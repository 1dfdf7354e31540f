"""Boxes: the per-token layout boxes of a document model, a graph input of the traced unit.

Document models read a box ``(x0, y0, x1, y1)`` per token beside the token ids and compute from it what their
attention reads: LayoutLMv3 a learned 2-D relative bias (its encoder's ``_cal_2d_pos_emb``) and spatial embeddings
(its embeddings module), LiLT its layout stream (``layout_embeddings``: the first layer's ``layout_inputs``), BROS
relative box embeddings (``bbox_embeddings``, fed the boxes as eight corner coordinates scaled by ``bbox_scale``),
UDOP's encoder its relative bias over the boxes (``relative_bias``). The traced unit takes the boxes as a graph
input ``bbox [B, S, 4]``, after its other inputs, in the dtype the model takes them (:data:`BOXES`), and calls that
same code of the model's on them, so the graph's interface is ``hidden, position_ids, bbox -> out`` and the graph
computes from the boxes what the model does (the model's learned tables and projections, traced).

Every call the capture records is classified against the boxes it passed the model (:func:`feeding` holds them):
an argument equal to them is of kind ``boxes`` (form ``given``), one equal to the model's own rearrangement of them
(BROS's corners and scale, :attr:`~posenc.trace.record.BoxesRecord.points`) of form ``points``; the unit, in turn,
holds its ``bbox`` input in the same context while it runs, and :func:`passed` gives each such argument again.

Capture, ``validate`` and ``bench`` feed seeded boxes in the model's valid range (:func:`seeded_boxes`): integer
boxes on LayoutLM's 0 .. 1000 page grid (or up to the last row of a shorter ``max_2d_position_embeddings`` table),
floating boxes normalised to 0 .. 1 (UDOP's, BROS's), with ``x0 <= x1``
and ``y0 <= y1``. LayoutLMv3 is "LayoutLMv3: Pre-training for Document AI with Unified Text and Image Masking"
(Huang et al., 2022, https://arxiv.org/abs/2204.08387); LiLT "LiLT: A Simple yet Effective Language-Independent
Layout Transformer for Structured Document Understanding" (Wang et al., 2022, https://arxiv.org/abs/2202.13669);
BROS "BROS: A Pre-trained Language Model Focusing on Text and Layout for Better Key Information Extraction from
Documents" (Hong et al., 2022, https://arxiv.org/abs/2108.04539); UDOP "Unifying Vision, Text, and Layout for
Universal Document Processing" (Tang et al., 2023, https://arxiv.org/abs/2212.02623).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from posenc.errors import ConfigError
from posenc.trace.record import BoxesRecord

NAME = "bbox"
"""The graph input's name (the models' own keyword)."""
WIDTH = 4
"""Coordinates per box: ``x0, y0, x1, y1``."""
GRID = 1000
"""The top of integer boxes (LayoutLM's page grid 0 .. 1000, within ``max_2d_position_embeddings`` 1024)."""
DTYPES = {"int64": torch.int64, "float32": torch.float32}


@dataclasses.dataclass(frozen=True)
class BoxSpec:
    """How one model type takes its boxes: dtype, the corner indices and config scale of its own rearrangement
    (BROS's), and what it computes from them."""

    dtype: str
    points: tuple[int, ...] = ()
    scale: str | None = None
    why: str = ""


BOXES: dict[str, BoxSpec] = {
    "layoutlmv3": BoxSpec("int64", why="spatial embeddings and a learned 2-D relative bias (_cal_2d_pos_emb)"),
    "lilt": BoxSpec("int64", why="the layout stream (layout_embeddings of the boxes and positions)"),
    "bros": BoxSpec(
        "float32",
        points=(0, 1, 2, 1, 2, 3, 0, 3),
        scale="bbox_scale",
        why="relative box embeddings (bbox_embeddings of the four corners, times bbox_scale)",
    ),
    "udop": BoxSpec("float32", why="its encoder's relative bias over the boxes (relative_bias)"),
}
"""Model types whose attention reads what the model computes from per-token boxes -> how they take them."""


def boxes_record(hf: Any) -> BoxesRecord | None:
    """The :class:`BoxesRecord` of a ``hf`` config's model type (:data:`BOXES`), or None."""
    spec = BOXES.get(str(getattr(hf, "model_type", "")))
    if spec is None:
        return None
    scale = float(getattr(hf, spec.scale)) if spec.scale else 1.0
    table = getattr(hf, "max_2d_position_embeddings", None)  # the coordinates' embedding tables
    top = float(min(GRID, int(table) - 1) if table else GRID) if spec.dtype == "int64" else 1.0
    return BoxesRecord(spec.dtype, top, spec.points, scale)


def seeded_boxes(batch: int, seq: int, dtype: str, seed: int = 0, top: float = GRID) -> np.ndarray:
    """Valid boxes ``[batch, seq, 4]``: ``x0 <= x1``, ``y0 <= y1``, on the grid 0 .. ``top`` (``int64``) or in
    0 .. 1 (floating ``dtype``)."""
    rng = np.random.default_rng(seed + 4099)
    corner = rng.uniform(0.0, 0.8, (batch, seq, 2))
    size = rng.uniform(0.0, 0.2, (batch, seq, 2))
    boxes = np.concatenate((corner, corner + size), axis=-1)
    if dtype == "int64":
        return np.floor(boxes * top).astype(np.int64)
    return boxes.astype(np.float32)


def capture_boxes(hf: Any, tokens: int) -> torch.Tensor:
    """The boxes the capture passes a ``hf`` model (:func:`seeded_boxes`, one row)."""
    record = boxes_record(hf)
    if record is None:
        raise ConfigError(f"the {hf.model_type} model takes no boxes posenc knows of (posenc.trace.boxes.BOXES).")
    return torch.from_numpy(seeded_boxes(1, tokens, record.dtype, top=record.top))


@dataclasses.dataclass(frozen=True)
class Boxes:
    """The boxes of the call now running (the capture's, or the unit's ``bbox`` input) and how the model takes them."""

    tensor: torch.Tensor
    record: BoxesRecord

    def points(self) -> torch.Tensor:
        """The model's own rearrangement of the boxes (BROS: ``bbox[..., [0, 1, 2, 1, 2, 3, 0, 3]] * bbox_scale``)."""
        return self.tensor[..., list(self.record.points)] * self.record.scale

    def form_of(self, value: Any) -> str | None:
        """``given`` where ``value`` is the boxes, ``points`` where it is their rearrangement, else None."""
        if not torch.is_tensor(value) or value.shape[:-1] != self.tensor.shape[:-1]:
            return None
        if value.dtype == self.tensor.dtype and value.shape == self.tensor.shape and torch.equal(value, self.tensor):
            return "given"
        if self.record.points:
            points = self.points()
            if value.shape == points.shape and value.dtype == points.dtype and torch.equal(value, points):
                return "points"
        return None


_CURRENT: contextvars.ContextVar[Boxes | None] = contextvars.ContextVar("posenc_boxes", default=None)


@contextlib.contextmanager
def feeding(boxes: Boxes | None) -> Iterator[None]:
    """Hold ``boxes`` as the boxes of the call that runs inside (None: a model without boxes)."""
    token = _CURRENT.set(boxes)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def box_form(value: Any) -> str | None:
    """The form in which ``value`` is the current call's boxes (:meth:`Boxes.form_of`), or None (no boxes held)."""
    current = _CURRENT.get()
    return current.form_of(value) if current is not None else None


def passed(form: str) -> torch.Tensor:
    """The current call's boxes in ``form`` (``given`` or ``points``), as the model passes them.

    Raises:
        ConfigError: no boxes are held (the unit was called without its ``bbox`` input), or an unknown form.
    """
    current = _CURRENT.get()
    if current is None:
        raise ConfigError(f"this traced layer takes its tokens' boxes as the input {NAME!r} [B, S, 4]; pass them.")
    if form == "given":
        return current.tensor
    if form == "points":
        return current.points()
    raise ConfigError(f"unknown box form {form!r} in a trace record; re-export the model.")


def box_input(tensor: torch.Tensor, record: BoxesRecord) -> Boxes:
    """The unit's ``bbox`` input ``[B, S, 4]`` as :class:`Boxes`, in the model's dtype (floating boxes follow the
    unit's float64 rebuild; integer boxes stay integers).

    Raises:
        ConfigError: not ``[B, S, 4]``.
    """
    if tensor.dim() != 3 or tensor.shape[-1] != WIDTH:
        raise ConfigError(f"{NAME!r} must be [B, S, {WIDTH}] boxes (x0, y0, x1, y1), got {list(tensor.shape)}.")
    if record.dtype == "int64":
        tensor = tensor.to(torch.int64)
    elif not tensor.is_floating_point():
        tensor = tensor.to(torch.float32)
    return Boxes(tensor, record)


__all__ = [
    "BOXES",
    "DTYPES",
    "GRID",
    "NAME",
    "WIDTH",
    "BoxSpec",
    "Boxes",
    "box_form",
    "box_input",
    "boxes_record",
    "capture_boxes",
    "feeding",
    "passed",
    "seeded_boxes",
]
