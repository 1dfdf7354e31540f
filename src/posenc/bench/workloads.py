"""What is timed: a scheme's positional op or its whole attention block, at one shape, with sample inputs.

Units:

- ``op``: the positional op as :mod:`posenc.export.units` defines it (RoPE on q ``[B, H, S, D]`` and k, a
  bias producer, an embedding adder, an attention replacement);
- ``op-3d``: for rotary (``qk``) schemes, the same rotation on the projection layout ``[B, S, H*D]`` that a
  deployed block feeds it (heads split, rotated, merged back). ONNX Runtime's CPU ``RotaryEmbedding`` runs
  several times faster on this layout, so it is the op the bandwidth target is about;
- ``block``: the whole :class:`posenc.blocks.AttentionBlock` (with past key/value inputs, empty at prefill);
- ``block-inplace``: the same block over a preallocated cache of ``max_positions`` slots (``--kv-cache inplace``),
  its presents bound to the caches' buffers when timed.

A :class:`Workload` holds the eager module (the reference every backend is compared with), named sample
inputs in the order of the exported graph's inputs, and the bytes one call must move at least: the numerator of
the roofline ratio. For an op, its inputs read and outputs written. For a block, the bytes floor of a step
(:attr:`Workload.floor_bytes`), whatever its cache layout: the projection weights, the hidden states in and out,
the keys and values of every cached and new slot read once, the new slots written once. Position tables are not
counted: a gather reads only the rows it needs. A block also has its FLOPs (:attr:`Workload.flops`), the numerator
of the ratio to a GEMM of the same size (prefill).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from posenc.bench.shapes import Shape
from posenc.blocks import AttentionBlock
from posenc.config import AttentionConfig
from posenc.errors import ConfigError
from posenc.export import export_onnx
from posenc.export.exporter import Exportable
from posenc.export.feeds import check_call_size, make_inputs
from posenc.export.kinds import ALL_UNITS, BLOCK_INPLACE, UNITS, UnitKind
from posenc.export.units import make_unit
from posenc.schemes import build_scheme, get_spec
from posenc.schemes.base import Placement, TableMode

__all__ = ["ALL_UNITS", "BLOCK_UNITS", "UNITS", "Workload", "build_workload", "check_unit", "workload_key"]

BLOCK_UNITS: tuple[str, ...] = ("block", BLOCK_INPLACE)
"""The units that are a whole attention block (their two cache layouts)."""


@dataclasses.dataclass
class Workload:
    """One benchmarked unit at one shape.

    Attributes:
        scheme: registered scheme name.
        unit: one of :data:`UNITS`.
        table_mode: ``precomputed`` or ``dynamic``.
        shape: batch, new tokens, past length.
        config: attention geometry.
        inner: the scheme module (op units) or the block, in eval mode.
        module: what is called: its ``forward`` takes :attr:`inputs` in order.
        inputs: name -> tensor, named as the exported graph's inputs.
        output_names: names of the exported graph's outputs.
        outputs: reference outputs of one eager call.
        weight_bytes: projection weights read by one call (blocks), bytes.
        unread: inputs the exported graph does not read (q and k of a position-only bias); they are
            left out of :attr:`bytes_moved` once the graph is known (:meth:`mark_read_inputs`).
        artifact, artifact_key: a user's file timed as it is, and its key (:mod:`posenc.bench.artifact`).
    """

    scheme: str
    unit: str
    table_mode: str
    shape: Shape
    config: AttentionConfig
    inner: nn.Module
    module: nn.Module
    inputs: dict[str, torch.Tensor]
    output_names: list[str]
    outputs: tuple[torch.Tensor, ...]
    weight_bytes: int = 0
    unread: tuple[str, ...] = ()
    artifact: Path | None = None
    """The user's ONNX file this workload times as it is (``posenc bench MODEL.onnx``); ``None``: exported here."""
    artifact_key: str | None = None
    """:func:`posenc.bench.artifact.artifact_key` of :attr:`artifact`."""

    @property
    def bytes_moved(self) -> int:
        """The bytes one call must move: a block's :attr:`floor_bytes`; an op's inputs read and outputs written."""
        if self.unit in BLOCK_UNITS:
            return self.floor_bytes
        read = [t for name, t in self.inputs.items() if name not in self.unread]
        return sum(t.numel() * t.element_size() for t in (*read, *self.outputs)) + self.weight_bytes

    @property
    def floor_bytes(self) -> int:
        """A block step's bytes floor: projection weights + hidden in + out + every cached and new key and value a
        query can see read once (a causal sliding window of ``W``: the last ``W + S - 1``) + the new keys and values
        written once (the same for every cache layout; 4-byte fp32 elements)."""
        cfg, shape = self.config, self.shape
        element = self.outputs[0].element_size()
        activations = 2 * shape.batch * shape.seq * cfg.hidden_size
        slot = shape.batch * cfg.num_kv_heads * (cfg.head_dim + cfg.value_dim)  # one key and one value per row
        seen = shape.total
        if cfg.sliding_window is not None and cfg.causal:
            seen = min(seen, cfg.sliding_window + shape.seq - 1)
        return self.weight_bytes + element * (activations + slot * seen + slot * shape.seq)

    @property
    def flops(self) -> int | None:
        """A block call's floating-point operations: the four projections and the attention's two products over
        every key (``QKᵀ`` and ``PV``, dense as the kernels compute them); ``None`` for ops."""
        if self.unit not in BLOCK_UNITS:
            return None
        cfg, shape = self.config, self.shape
        tokens = shape.batch * shape.seq
        widths = cfg.head_dim + cfg.value_dim  # q and o; k and v (values may be narrower than keys)
        projections = 2 * tokens * cfg.hidden_size * (cfg.num_heads + cfg.num_kv_heads) * widths
        attention = 2 * tokens * cfg.num_heads * shape.total * widths
        return projections + attention

    def mark_read_inputs(self, graph_inputs: list[str]) -> None:
        """Record which inputs the exported graph reads (the exporter removes the others)."""
        self.unread = tuple(name for name in self.inputs if name not in graph_inputs)

    @property
    def max_positions(self) -> int:
        """Rows of precomputed tables: the model's context, or more when the shape needs it."""
        return max(self.config.max_position_embeddings, self.shape.positions)

    @property
    def key(self) -> str:
        """File-name identifier of this workload's graph (see :func:`workload_key`; an artifact's own key)."""
        if self.artifact_key is not None:
            return self.artifact_key
        return workload_key(self.scheme, self.unit, self.table_mode, self.config, self.max_positions)

    def export(self, path: Path, position_guard: bool = True) -> Path:
        """Write the ONNX graph (dynamic batch, sequence and past: one export serves every shape).

        Every unit goes through :func:`posenc.export.export_onnx` (manifest beside the file), with the position
        guard unless ``position_guard`` is False. An artifact is its own export: its path comes back unchanged.
        """
        if self.artifact is not None:
            return self.artifact
        module = cast(Exportable, self.inner)  # a block or scheme: build_workload made it
        return export_onnx(module, path, unit=self.unit, position_guard=position_guard).path


def workload_key(scheme: str, unit: str, table_mode: str, config: AttentionConfig, max_positions: int) -> str:
    """File-name identifier of a graph, e.g. ``rope-op-precomputed-1a2b3c4d``: one graph serves every shape.

    The suffix hashes the geometry and the table length, which decide the graph besides the name.
    """
    geometry = json.dumps([config.to_dict(), max_positions], sort_keys=True)
    return f"{scheme}-{unit}-{table_mode}-{hashlib.sha1(geometry.encode()).hexdigest()[:8]}"


def check_unit(scheme: str, unit: str) -> str | None:
    """Why ``unit`` cannot be benchmarked for ``scheme`` (``None`` when it can).

    Raises:
        ConfigError: unknown scheme or unit.
    """
    if unit not in ALL_UNITS:
        raise ConfigError(f"unknown unit {unit!r}; use one of {list(ALL_UNITS)}.")
    spec = get_spec(scheme)
    if unit == "op" and (spec.placement is Placement.NONE or "op" not in spec.exports):
        return f"{scheme} has no positional op of its own (exports: {sorted(spec.exports)}); see its block."
    if unit == "op-3d" and spec.placement is not Placement.QK:
        return f"unit op-3d is a rotation of q and k; {scheme} acts at {spec.placement.value!r}."
    return None


def build_workload(
    scheme: str,
    unit: str,
    table_mode: str,
    config: AttentionConfig,
    shape: Shape,
    params: Mapping[str, Any] | None = None,
    seed: int = 0,
) -> Workload:
    """Build the eager module and sample inputs of one unit at one shape.

    Inputs of ``op`` and ``block`` are those of :mod:`posenc.export.units` (the same realistic position ids
    validation uses). Precomputed tables get ``max(config.max_position_embeddings, shape.positions)`` rows.

    Raises:
        ConfigError: unknown scheme/unit, a table mode the scheme lacks, or a unit the scheme has not.
    """
    reason = check_unit(scheme, unit)
    if reason:
        raise ConfigError(reason)
    mode = TableMode.parse(table_mode)
    max_positions = max(config.max_position_embeddings, shape.positions)
    feed_shape = shape.feed
    check_call_size(config, feed_shape)
    torch.manual_seed(seed)  # learned tables and projections
    if unit in BLOCK_UNITS:
        inner: nn.Module = AttentionBlock(config, scheme, params, mode, max_positions)
    else:
        inner = build_scheme(scheme, config, params, mode, max_positions)
    inner.eval()
    export_unit = make_unit(inner, UnitKind(unit), torch.float32)
    module = export_unit.module
    arrays = dict(
        zip(
            export_unit.input_names,
            make_inputs(export_unit.slots, feed_shape, torch.float32, seed=seed),
            strict=True,
        )
    )
    output_names = export_unit.output_names
    inputs = {name: torch.from_numpy(np.array(a)) for name, a in arrays.items()}
    with torch.inference_mode():
        result = module(*inputs.values())
    outputs = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    weights = 0
    if unit in BLOCK_UNITS:
        weights = sum(p.numel() * p.element_size() for n, p in inner.named_parameters() if not n.startswith("scheme."))
    return Workload(scheme, unit, mode.value, shape, config, inner, module, inputs, output_names, outputs, weights)
