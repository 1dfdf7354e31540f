"""A traced layer as ``posenc validate --against-hf`` reads a checkpoint layer: its plan, provenance and references.

:func:`load_traced` captures the layer again from the checkpoint (:mod:`posenc.trace.capture`) and returns a
:class:`TracedLayer` with the interface of :class:`posenc.checkpoints.LoadedLayer` that the comparison path uses:
``plan`` (geometry, scheme, layer), ``location``, ``provenance()`` and ``reference(angles, dtype)``. The references are
the checkpoint's own attention module called as its model calls it (:class:`~posenc.trace.module.TracedAttention`):
``native`` with the model's rotary module (transformers' float32 angles), ``float64`` with posenc's float64 cos/sin in
the model's layout (where the layer's angles are posenc's; else its own angles in float64).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
from torch import nn

from posenc.checkpoints.plan import LayerPlan
from posenc.checkpoints.reference import ANGLES, reference_name
from posenc.errors import ConfigError
from posenc.provenance import CheckpointWeights
from posenc.schemes.base import TableMode
from posenc.trace.build import TracePlan, plan_trace, traced_module
from posenc.trace.capture import capture_layer
from posenc.trace.record import tower_note


class TracedReference(nn.Module):
    """One reference: the traced module in ``dtype`` with ``native`` or ``float64`` angles, named for report rows."""

    def __init__(self, module: nn.Module, plan: TracePlan, angles: str, dtype: torch.dtype, exact: bool) -> None:
        super().__init__()
        self.module = copy.deepcopy(module).to(dtype).eval()  # the capture's modules stay float32 for the others
        self.dtype = dtype
        self.angles = angles
        self.exact = exact
        self.layer = plan.captured.layer
        self.module_name = plan.captured.attention_ref.cls.rsplit(".", 1)[-1]
        self.tower = tower_note(plan.captured.model_type, plan.captured.tower)

    @property
    def name(self) -> str:
        return reference_name(self.dtype, exact_angles=self.exact)

    @property
    def description(self) -> str:
        angles = "posenc's float64 angles" if self.exact else "its own angles"
        return (
            f"transformers {self.module_name} (checkpoint weights, layer {self.layer}{self.tower}, {self.dtype}, "
            f"{angles}), called as its model calls it (traced)"
        )

    def forward(
        self, hidden: torch.Tensor, position_ids: torch.Tensor | None = None, *rest: torch.Tensor | None
    ) -> tuple[torch.Tensor, ...]:
        """The unit's call (:meth:`~posenc.trace.module.TracedAttention.forward`): ``rest`` are its cache inputs, then
        its second streams (NeoMME's value embeddings), every floating input cast to the reference's dtype."""
        given = (hidden, *rest)
        cast = [t if t is None or not t.is_floating_point() else t.to(self.dtype) for t in given]  # boxes: integers
        with torch.no_grad():
            return self.module(cast[0], position_ids, *cast[1:])


@dataclasses.dataclass
class TracedLayer:
    """A traced checkpoint layer for the comparison path (see the module docstring)."""

    trace: TracePlan
    plan: LayerPlan
    location: str

    def provenance(self) -> CheckpointWeights:
        return self.trace.captured.provenance()

    def reference(self, angles: str = "native", dtype: torch.dtype = torch.float32) -> TracedReference:
        if angles not in ANGLES:
            raise ConfigError(f"angles must be one of {list(ANGLES)}, got {angles!r}.")
        if angles == "float64" and self.trace.angles is not None:
            module = traced_module(
                self.trace, angles="exact", table_mode=_dynamic_first(self.trace.scheme), table_dtype=torch.float64
            )
            return TracedReference(module, self.trace, angles, dtype, exact=True)
        return TracedReference(traced_module(self.trace), self.trace, angles, dtype, exact=False)


def _dynamic_first(scheme: str) -> TableMode:
    from posenc.schemes import get_spec

    return TableMode.DYNAMIC if TableMode.DYNAMIC in get_spec(scheme).table_modes else TableMode.PRECOMPUTED


def load_traced(checkpoint: Any, layer: int | None = None, layer_type: str | None = None) -> TracedLayer:
    """Capture layer ``layer`` of ``checkpoint`` and plan it (see the module docstring)."""
    plan = plan_trace(capture_layer(checkpoint, layer, layer_type))
    captured = plan.captured
    decoder = not captured.cacheless  # an attention called without a cache takes no decode steps
    layer_plan = LayerPlan(plan.config, plan.scheme, plan.params, captured.layer, captured.layer_type, decoder=decoder)
    return TracedLayer(plan, layer_plan, captured.location)


__all__ = ["TracedLayer", "TracedReference", "load_traced"]
