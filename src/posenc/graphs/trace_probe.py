"""Probing the traced graph on ONNX Runtime and matching its frontier with posenc's cos/sin.

:func:`run_graph` runs the traced graph (reading any inner value) on :func:`probe_feed`'s probe positions;
:func:`_match` pairs every frontier tensor with posenc's float64 cos or sin of the layer's scheme in one of the
layouts of :mod:`posenc.trace.layouts`. Used by :mod:`posenc.graphs.trace_rewrite`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx_ir as ir
import torch

from posenc.export.trace import RewriteRequest
from posenc.graphs.trace_region import Region
from posenc.schemes.base import TableMode
from posenc.trace.arguments import stream_shapes
from posenc.trace.boxes import NAME as BOX_INPUT
from posenc.trace.boxes import seeded_boxes
from posenc.trace.layouts import match_layout, probe_positions
from posenc.trace.module import scheme_cos_sin

PROBE_BATCH = 2


def _probe_seq(frontier: list[ir.Value]) -> int:
    """A probe length no static dim of the frontier has (so the sequence axis is told apart)."""
    taken = {d for v in frontier if v.shape is not None for d in v.shape.dims if isinstance(d, int)}
    return next(n for n in (7, 11, 13, 17, 19, 23) if n not in taken and n != PROBE_BATCH)


def probe_feed(request: RewriteRequest, seq: int) -> dict[str, np.ndarray]:
    """Random hidden states, probe position ids ``[2, seq]`` and an empty cache."""
    config = request.plan.config
    value_dim = request.plan.captured.value_dim  # a cache's values may differ from its keys (even be zero wide)
    value_dim = config.head_dim if value_dim is None else value_dim
    rng = np.random.default_rng(0)
    return {
        "hidden": rng.standard_normal((PROBE_BATCH, seq, config.hidden_size)).astype(np.float32),
        # within the model's context where the graph guards none: a table the module reads by position (CodeGen's
        # embed_positions) has that many rows
        "position_ids": probe_positions(PROBE_BATCH, seq, request.position_limit or config.max_position_embeddings),
        "past_key": np.zeros((PROBE_BATCH, config.num_kv_heads, 0, config.head_dim), np.float32),
        "past_value": np.zeros((PROBE_BATCH, config.num_kv_heads, 0, value_dim), np.float32),
        "past_indexer_key": np.zeros((PROBE_BATCH, 0, request.plan.captured.indexer_dim or 1), np.float32),  # DSA
        **{  # a hybrid cache layer's fixed-size states (ZAYA's convolution and recurrent states)
            f"past_{state.name}": rng.standard_normal((PROBE_BATCH, *state.shape)).astype(np.float32)
            for state in request.plan.captured.states
        },
        **{  # second streams (NeoMME's value embeddings; an encoder's states of their own length), random
            key: rng.standard_normal((PROBE_BATCH, _stream_length(length, seq), width)).astype(np.float32)
            for key, (length, width) in stream_shapes(request.plan.captured.call).items()
        },
        **_box_feed(request, seq),
    }


def _box_feed(request: RewriteRequest, seq: int) -> dict[str, np.ndarray]:
    """Seeded boxes of a document model's unit (its last input, :mod:`posenc.trace.boxes`); none otherwise."""
    boxes = request.plan.captured.boxes
    return {BOX_INPUT: seeded_boxes(PROBE_BATCH, seq, boxes.dtype, top=boxes.top)} if boxes is not None else {}


def _stream_length(length: int | str, seq: int) -> int:
    """A probe stream's length: the tokens' ``seq``, a fixed one, or a length of its own (``seq + 3``: told apart)."""
    return seq if length == "seq" else length if isinstance(length, int) else seq + 3


def run_graph(model: ir.Model, feed: dict[str, np.ndarray], names: list[str] | None = None) -> dict[str, np.ndarray]:
    """Run ``model`` on ONNX Runtime CPU; ``names``: values to read besides the graph outputs."""
    import onnx
    import onnxruntime as ort

    proto = ir.serde.serialize_model(model)
    known = {o.name for o in proto.graph.output}
    for name in names or []:
        if name not in known:
            proto.graph.output.append(onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    inputs = {i.name for i in session.get_inputs()}
    out = session.run(None, {k: v for k, v in feed.items() if k in inputs})
    return {o.name: array for o, array in zip(session.get_outputs(), out, strict=True)}


@dataclasses.dataclass(frozen=True)
class Axes:
    """Where batch, sequence and features sit in a frontier tensor (every other axis has size 1)."""

    batch: int
    seq: int
    rank: int


def _axes(array: np.ndarray, seq: int) -> Axes | None:
    shape = array.shape
    seqs = [i for i, d in enumerate(shape) if d == seq]
    batches = [i for i, d in enumerate(shape) if d == PROBE_BATCH]
    if len(shape) < 3 or len(seqs) != 1 or len(batches) != 1:
        return None
    b, s = batches[0], seqs[0]
    if not b < s < len(shape) - 1 or any(d != 1 for i, d in enumerate(shape[:-1]) if i not in (b, s)):
        return None
    return Axes(b, s, len(shape))


def _reference_tables(request: RewriteRequest, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """posenc's float64 cos, sin ``[N, r/2]`` of the layer's scheme at the probe positions."""
    exact = request.plan.exact_scheme(_float64_mode(request.plan.scheme), None, torch.float64)
    cos, sin = scheme_cos_sin(exact, torch.from_numpy(positions))
    return cos.reshape(-1, cos.shape[-1]).numpy(), sin.reshape(-1, sin.shape[-1]).numpy()


def _float64_mode(scheme: str) -> TableMode:
    from posenc.schemes import get_spec

    return TableMode.DYNAMIC if TableMode.DYNAMIC in get_spec(scheme).table_modes else TableMode.PRECOMPUTED


def _rows(array: np.ndarray, axes: Axes) -> np.ndarray:
    moved = np.moveaxis(array, (axes.batch, axes.seq), (0, 1))
    return moved.reshape(moved.shape[0] * moved.shape[1], -1).astype(np.float64)


def _match(request: RewriteRequest, model: ir.Model, region: Region) -> tuple[list[tuple[ir.Value, Any]], str]:
    """Each frontier tensor with ``(source, layout, axes)``, or the reason one does not match."""
    seq = _probe_seq(region.frontier)
    feed = probe_feed(request, seq)
    names = [v.name or "" for v in region.frontier]
    values = run_graph(model, feed, names)
    cos, sin = _reference_tables(request, feed["position_ids"])
    matched = []
    for value in region.frontier:
        array = values[value.name or ""]
        axes = _axes(array, seq)
        if axes is None:
            return [], f"{value.name} {list(array.shape)} is not a per-token cos/sin tensor"
        found = match_layout(_rows(array, axes), cos, sin)
        if found is None:
            return [], (
                f"{value.name} {list(array.shape)} is not {request.plan.scheme!r}'s cos or sin in any layout at probe "
                f"positions below {int(feed['position_ids'].max()) + 1}"
            )
        matched.append((value, (found[0], found[1], axes)))
    return matched, ""


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("inf")
    scale = max(1.0, float(np.abs(b).max()) if b.size else 1.0)
    return float(np.abs(a.astype(np.float64) - b).max()) / scale if a.size else 0.0


__all__ = ["PROBE_BATCH", "Axes", "probe_feed", "run_graph"]
