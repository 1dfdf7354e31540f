"""Eager rebuilds of an exported model (the float64 reference): the module from its manifest and weights file
(:func:`load_eager`), the graph's tables checked against it (:func:`check_graph_tables`), and the torch inputs of a
feed (:func:`reference_inputs`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from posenc.artifacts.files import manifest_path_for
from posenc.dtypes import torch_dtype
from posenc.errors import ConfigError, ModelFileError
from posenc.export.external import load_weights_file
from posenc.export.kinds import UnitKind
from posenc.export.manifest import Manifest, load_manifest, weights_file
from posenc.export.units import make_unit
from posenc.schemes.base import table_keys


def build_eager(
    manifest: Manifest,
    *,
    dtype: torch.dtype | str = torch.float64,
    table_dtype: torch.dtype | str | None = None,
) -> nn.Module:
    """The eager module of a manifest (its scheme, params, unit, geometry), without weights.

    Args:
        manifest: the exported model's manifest.
        dtype: dtype of weights and activations (float64 for the reference).
        table_dtype: dtype of position tables (default: ``dtype`` when float64, else the manifest's).

    Returns:
        the unit module: its ``forward`` takes the graph's inputs in order (inputs the graph dropped are
        filled in by :func:`reference_inputs`).
    """
    from posenc.blocks import build_block
    from posenc.schemes import build_scheme

    activation = torch_dtype(dtype)
    if table_dtype is None:
        tables = torch.float64 if activation == torch.float64 else torch_dtype(manifest.table_dtype)
    else:
        tables = torch_dtype(table_dtype)
    config = manifest.attention_config()
    rest = (manifest.params, manifest.table_mode, manifest.build_max_positions, tables)
    if manifest.trace is not None:
        return _traced_eager(manifest, activation, rest)
    inner: nn.Module
    kind = UnitKind.parse(manifest.unit)
    if kind.is_block:
        inner = build_block(config, manifest.scheme, *rest)  # make_unit refuses an in-place MLA block
    else:
        inner = build_scheme(manifest.scheme, manifest.rotary_config(), *rest)
    return make_unit(inner.to(activation).eval(), kind, activation, ring=manifest.cache_ring).module


def _traced_eager(manifest: Manifest, activation: torch.dtype, rest: tuple[Any, ...]) -> nn.Module:
    """A traced export's module (:mod:`posenc.export.trace`): the checkpoint's attention module as its model calls
    it, with posenc's scheme computing its angles where the graph's were replaced (the float64 reference)."""
    from posenc.schemes import build_scheme
    from posenc.trace.build import rebuild

    record = manifest.trace
    if record is None:
        raise ConfigError("the manifest has no trace record.")
    exact = build_scheme(manifest.scheme, manifest.attention_config(), *rest) if record.replaced() else None
    limit = exact.position_limit if exact is not None else manifest.max_positions
    return rebuild(record, exact, limit, activation)


def check_graph_tables(manifest: Manifest, onnx_path: str | os.PathLike[str], module: nn.Module | None = None) -> None:
    """Check the manifest's table sizes (and input and output names) against the graph itself: a manifest is
    not trusted on its own.

    The module the manifest describes is rebuilt (without weights, unless ``module`` is that rebuild) and
    every precomputed table over positions must be in the graph with the same shape (by name, else by shape),
    and its position limit must be the manifest's ``max_positions``. An edited ``max_positions`` or
    ``build_max_positions`` (a longer table promised than the graph holds) is refused.

    Raises:
        ModelFileError: names the table, the shape the manifest implies and the one the graph holds.
    """
    import onnx

    rebuilt = module if module is not None else build_eager(manifest, dtype=torch.float32)
    scheme = getattr(rebuilt, "scheme", rebuilt)
    inner_scheme = getattr(scheme, "scheme", scheme)
    limit = getattr(inner_scheme, "position_limit", None)
    if limit != manifest.max_positions:
        raise ModelFileError(
            f"the manifest of {Path(onnx_path).name} says max_positions {manifest.max_positions}, but the module it "
            f"describes (build_max_positions {manifest.build_max_positions}) serves positions below {limit}: the "
            f"manifest was edited. Re-export the model (a manifest cannot be repaired by hand)."
        )
    graph = onnx.load(str(onnx_path), load_external_data=False)
    for kind, recorded, held in (
        ("inputs", [t.name for t in manifest.inputs], [v.name for v in graph.graph.input]),
        ("outputs", [t.name for t in manifest.outputs], [v.name for v in graph.graph.output]),
    ):
        initializers = {init.name for init in graph.graph.initializer}
        held = [name for name in held if name not in initializers]
        if sorted(recorded) != sorted(held):
            raise ModelFileError(
                f"the manifest of {Path(onnx_path).name} names {kind} {recorded}, but the graph has {held}: the "
                f"manifest does not describe this graph. Re-export the model."
            )
    shapes = {init.name: tuple(int(d) for d in init.dims) for init in graph.graph.initializer}
    present = set(shapes.values())
    state = rebuilt.state_dict()
    rows = manifest.build_max_positions
    for key in sorted(table_keys(rebuilt) if manifest.table_mode == "precomputed" else ()):
        if key not in state:
            continue
        want = tuple(int(d) for d in state[key].shape)
        if not any(d >= rows for d in want):
            continue  # not a table over positions (e.g. inverse frequencies), whatever the exporter made of it
        got = shapes.get(key)
        if got is None and want in present:
            continue  # renamed by the exporter, the shape is there
        if got != want:
            found = "holds no such table" if got is None else f"holds {list(got)}"
            raise ModelFileError(
                f"{Path(onnx_path).name}: the manifest implies position table {key!r} of shape {list(want)} "
                f"(max_positions {manifest.max_positions}), but the graph {found}: the manifest does not describe "
                f"this graph. Re-export the model."
            )


def load_weights(
    module: nn.Module, state: Mapping[str, torch.Tensor], saved_tables: Sequence[str] | None = None
) -> None:
    """Load exported weights into a rebuild of the same unit (e.g. the float64 reference).

    Parameters and non-table buffers are copied, cast to the rebuild's dtype. Position tables (buffers
    registered with ``register_table``) are functions of the scheme parameters (or refreshed from the
    weights on load, like FLOATER's), so the rebuild keeps its own, computed in its own precision; a
    float64 rebuild may even hold other table buffers (``inv_freq`` instead of float32 ``turns``).

    Args:
        module: the rebuilt unit module.
        state: the exported ``state_dict`` (keys of the block, or of the scheme for op units).
        saved_tables: keys of ``state`` that are position tables (the manifest's ``weights.tables``).

    Raises:
        ModelFileError: weights missing, unexpected or of the wrong shape.
    """
    target = module.state_dict()
    # a unit module wrapping the saved one (an op around its scheme, the in-place unit around its block)
    wrappers = ("block.", "scheme.")
    # (every key of the wrapper is under it; a layer of a --layers folder saves no table keys, so "scheme." is not one)
    prefix = next(
        (
            p
            for p in wrappers
            if target and all(k.startswith(p) for k in target) and not any(k.startswith(p) for k in state)
        ),
        "",
    )
    tables = table_keys(module)
    kept_tables = set(saved_tables or ())
    missing = [k for k in target if k not in tables and k.removeprefix(prefix) not in state]
    unexpected = [k for k in state if k not in kept_tables and prefix + k not in target]
    if missing or unexpected:
        raise ModelFileError(
            f"the weights file does not fit the module of its manifest (missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}); it belongs to another model. Re-export."
        )
    new_state = {}
    for key, current in target.items():
        if key in tables:
            new_state[key] = current
            continue
        saved = state[key.removeprefix(prefix)]
        if tuple(saved.shape) != tuple(current.shape):
            raise ModelFileError(
                f"weight {key!r} has shape {list(saved.shape)} in the weights file but {list(current.shape)} in "
                f"the rebuilt module; the weights do not belong to this manifest. Re-export."
            )
        new_state[key] = saved.to(current.dtype) if current.is_floating_point() else saved
    module.load_state_dict(new_state)


def load_eager(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype | str = torch.float64,
    manifest: Manifest | None = None,
) -> tuple[nn.Module, Manifest]:
    """Rebuild the eager module of an exported model from its manifest and weights file.

    Args:
        path: the ONNX file (or its manifest).
        dtype: float64 for the reference (tables recomputed in float64); the graph dtype to mirror it.

    Returns:
        ``(module, manifest)``.
    """
    manifest = manifest or load_manifest(path)
    path = Path(path)
    manifest_path = path if path.name.endswith(".manifest.json") else manifest_path_for(path)
    weights = weights_file(manifest, manifest_path)
    state = load_weights_file(weights, manifest.weights.format)
    module = build_eager(manifest, dtype=dtype)
    load_weights(module, state, manifest.weights.tables)
    return module, manifest


def reference_inputs(manifest: Manifest, feed: Mapping[str, np.ndarray], dtype: torch.dtype) -> list[torch.Tensor]:
    """Torch inputs for the eager unit module, in its signature order, upcast to ``dtype``.

    Inputs the graph dropped (unread q/k of a position-only bias) are given as zero tensors of the
    right shape: the scheme does not read them; a past the graph does not take (a traced encoder's) is empty.
    """
    from posenc.export.units import _slots  # the unit layout is the single source of input order
    from posenc.schemes import get_spec
    from posenc.schemes.base import Placement

    config = manifest.attention_config()
    axes = get_spec(manifest.scheme).position_axes
    slots, _ = _slots(
        UnitKind.parse(manifest.unit), Placement(manifest.placement), config, axes, manifest.build_max_positions
    )
    arrays = {k: np.asarray(v) for k, v in feed.items()}
    sizes: dict[str, int] = {}
    for spec in manifest.inputs:
        for want, got in zip(spec.shape, arrays[spec.name].shape, strict=True):
            if isinstance(want, str):
                sizes[want] = int(got)
    tensors = []
    for slot in slots:
        if slot.name in arrays:
            tensors.append(_tensor(arrays[slot.name], dtype))
        else:
            shape = [d if isinstance(d, int) else sizes.get(d, 0 if d == "past" else 1) for d in slot.shape]
            tensors.append(torch.zeros(shape, dtype=dtype))
    named = {slot.name for slot in slots}
    for spec in manifest.inputs:  # after the unit's: a traced DSA layer's past_indexer_key
        if spec.name not in named and spec.name in arrays:  # and its second streams, a document model's boxes
            tensors.append(_tensor(arrays[spec.name], dtype))
    return tensors


def _tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """An input as the eager unit takes it: integers as int64 (positions, boxes), the rest upcast to ``dtype``."""
    if array.dtype.kind in "iu":
        return torch.from_numpy(np.array(array, dtype=np.int64))
    return torch.from_numpy(np.array(array, dtype=np.float64)).to(dtype)


__all__ = ["build_eager", "check_graph_tables", "load_eager", "load_weights", "reference_inputs"]
