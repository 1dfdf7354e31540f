"""Weights stored once: an ONNX graph whose tensors are external data inside the artifact's safetensors file.

A safetensors file is an 8-byte little-endian header length, a JSON header, then each tensor's raw little-endian
bytes at the offsets the header gives — exactly what ONNX external data names (a file, an offset, a length). So the
graph's large initializers need not be stored a second time: :func:`write_linked` writes one safetensors file holding
every tensor of the module once, as the graph stores it, and points the graph's initializers into it.

Names say what they are. An initializer equal to a ``state_dict`` tensor takes its key (``q_proj.weight``); one equal
to its transpose (how ``nn.Linear`` weights reach a ``MatMul``) takes the key with :data:`TRANSPOSED` appended
(``q_proj.weight.T``) and the file stores the transposed array; position tables keep their keys. Tensors the graph
does not hold as initializers are stored under their keys too, so the file is still the module's complete state:
:func:`read_state` returns the ``state_dict`` (transposing the ``.T`` entries back) for the eager rebuild.

Matching is by content (bytes, dtype and shape), so it holds whatever names the exporter chose; an initializer that
matches nothing, or is smaller than ``min_bytes``, stays inside the graph.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from posenc.errors import ModelFileError

TRANSPOSED = ".T"
"""Suffix of a file entry that holds the transpose of the ``state_dict`` tensor of the same name."""
LINK_MIN_BYTES = 1024
"""Initializers smaller than this stay inside the graph (shapes, scalars, small constants)."""


WEIGHTS_FORMAT = "safetensors"
LINKED_WEIGHTS_FORMAT = "safetensors+onnx-external-data"
"""The weights file is also the graph's external data (:mod:`posenc.export.external`): each tensor stored once, as
the graph holds it (``key.T`` for a transposed weight)."""
LEGACY_WEIGHTS_FORMAT = "torch.save(state_dict)"
"""Weights of manifests written before safetensors: read with ``torch.load(weights_only=True)``."""


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    # flattened first: a "contiguous" tensor with a size-1 dim may keep a last stride other than 1 (the transpose
    # of a [1, N] int64 position buffer, CLAP's), which view(uint8) refuses
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _initializer_bytes(init: Any) -> bytes | None:
    """The raw little-endian bytes of an initializer stored inside the graph (``None`` for external ones)."""
    from onnx import numpy_helper

    if init.data_location == 1:  # TensorProto.EXTERNAL
        return None
    if init.raw_data:
        return bytes(init.raw_data)
    return np.ascontiguousarray(numpy_helper.to_array(init)).tobytes()


def _onnx_dtype(tensor: torch.Tensor) -> int:
    from onnx import TensorProto

    table = {
        torch.float32: TensorProto.FLOAT,
        torch.float16: TensorProto.FLOAT16,
        torch.bfloat16: TensorProto.BFLOAT16,
        torch.float64: TensorProto.DOUBLE,
        torch.int64: TensorProto.INT64,
        torch.int32: TensorProto.INT32,
        torch.bool: TensorProto.BOOL,
    }
    return table.get(tensor.dtype, -1)


def match_initializers(
    model: Any, state: Mapping[str, torch.Tensor], min_bytes: int = LINK_MIN_BYTES
) -> dict[str, str]:
    """``{initializer name: file entry name}`` for the initializers of ``model`` (an ``onnx.ModelProto``) equal to a
    ``state`` tensor (entry: its key) or to the transpose of a 2-D one (entry: key + :data:`TRANSPOSED`)."""
    by_content: dict[tuple[int, tuple[int, ...], bytes], str] = {}
    for key, tensor in state.items():
        dtype = _onnx_dtype(tensor)
        if tensor.numel() * tensor.element_size() < min_bytes or dtype < 0:
            continue
        by_content.setdefault((dtype, tuple(tensor.shape), _tensor_bytes(tensor)), key)
        if tensor.dim() == 2:
            flipped = tensor.t()
            by_content.setdefault((dtype, tuple(flipped.shape), _tensor_bytes(flipped)), key + TRANSPOSED)
    found: dict[str, str] = {}
    for init in model.graph.initializer:
        data = _initializer_bytes(init)
        if data is None or len(data) < min_bytes:
            continue
        entry = by_content.get((init.data_type, tuple(init.dims), data))
        if entry is not None:
            found[init.name] = entry
    return found


def drop_duplicates(model: Any, links: Mapping[str, str]) -> None:
    """Remove from ``model``'s graph every initializer after the first that ``links`` maps to the same file entry
    (equal content: a weight the module uses twice, T5Gemma 2's ``k_proj`` on its tokens and on its encoder's
    states, is folded into two equal initializers), so renaming them after the entry leaves one value of that name."""
    seen: set[str] = set()
    kept = []
    for init in model.graph.initializer:
        entry = links.get(init.name)
        if entry is not None and entry in seen:
            continue
        if entry is not None:
            seen.add(entry)
        kept.append(init)
    if len(kept) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)


def _graphs(graph: Any) -> Iterator[Any]:
    """``graph`` and every subgraph of its nodes (If / Loop / Scan bodies)."""
    from onnx import AttributeProto

    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == AttributeProto.GRAPH:
                yield from _graphs(attribute.g)
            elif attribute.type == AttributeProto.GRAPHS:
                for sub in attribute.graphs:
                    yield from _graphs(sub)


def rename_values(model: Any, renames: Mapping[str, str]) -> None:
    """Rename values of ``model`` in place: initializers, node inputs and outputs, graph inputs and outputs, in every
    subgraph. A new name already used by another value is refused."""
    used = {init.name for graph in _graphs(model.graph) for init in graph.initializer}
    used |= {name for graph in _graphs(model.graph) for node in graph.node for name in (*node.input, *node.output)}
    staying = used - set(renames)
    clashes = [new for old, new in renames.items() if new != old and new in staying]
    if clashes:
        raise ModelFileError(f"cannot name graph values {clashes[:3]}: the names are taken; this is a posenc bug.")
    for graph in _graphs(model.graph):
        for init in graph.initializer:
            init.name = renames.get(init.name, init.name)
        for value in (*graph.input, *graph.output, *graph.value_info):
            value.name = renames.get(value.name, value.name)
        for node in graph.node:
            node.input[:] = [renames.get(name, name) for name in node.input]
            node.output[:] = [renames.get(name, name) for name in node.output]


def safetensors_offsets(path: str | os.PathLike[str]) -> dict[str, tuple[int, int]]:
    """``{entry: (offset, length)}`` in bytes from the start of a safetensors file.

    Raises:
        ModelFileError: not a safetensors file (its header cannot be read).
    """
    try:
        with open(path, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > 100 * 2**20:
                raise ValueError("header too large")
            header = json.loads(handle.read(size))
    except (OSError, ValueError, struct.error) as exc:
        raise ModelFileError(f"{path} is not a readable safetensors file ({exc}); re-export the model.") from None
    start = 8 + size
    return {
        name: (start + int(entry["data_offsets"][0]), int(entry["data_offsets"][1]) - int(entry["data_offsets"][0]))
        for name, entry in header.items()
        if name != "__metadata__"
    }


def write_linked(
    model: Any,
    state: Mapping[str, torch.Tensor],
    weights_path: str | os.PathLike[str],
    location: str,
    min_bytes: int = LINK_MIN_BYTES,
) -> Any:
    """Write ``state`` once into ``weights_path`` (safetensors) and point ``model``'s matching initializers into it.

    Args:
        model: the ``onnx.ModelProto`` to rewrite in place (and return).
        state: the module's ``state_dict``.
        weights_path: where the file is written now (a staging path).
        location: the file's name as the graph will find it, relative to the graph's folder (its final name).
        min_bytes: initializers smaller than this stay inside the graph.

    Returns:
        ``model``, its linked initializers renamed (see the module docstring) and stored as external data.
    """
    from onnx import TensorProto
    from safetensors.torch import save_file

    links = match_initializers(model, state, min_bytes)
    drop_duplicates(model, links)
    rename_values(model, {name: entry for name, entry in links.items() if name != entry})
    entries: dict[str, torch.Tensor] = {}
    linked = set(links.values())
    for key, tensor in state.items():
        if key + TRANSPOSED in linked:
            entries[key + TRANSPOSED] = tensor.detach().cpu().t().contiguous()
            if key not in linked:
                continue
        entries[key] = tensor.detach().cpu().contiguous().clone()
    # one metadata key: safetensors writes its metadata map in a random order, and the file's sha256 must not vary
    save_file(entries, str(weights_path), metadata={"format": "pt"})
    offsets = safetensors_offsets(weights_path)
    for init in model.graph.initializer:
        if init.name not in linked:
            continue
        _point(init, location, *offsets[init.name])
        init.data_location = TensorProto.EXTERNAL
    return model


def link_existing(
    model: Any, weights_path: str | os.PathLike[str], location: str, min_bytes: int = LINK_MIN_BYTES
) -> Any:
    """Point ``model``'s initializers that equal an entry of an existing weights file (bytes, dtype, shape) into it,
    renamed after the entry: an optimized graph keeps reading its export's file instead of a copy. Initializers
    a pass made (a fused or projected weight) stay inside the graph.

    Returns:
        ``model``, rewritten in place.
    """
    from onnx import TensorProto
    from safetensors.torch import load_file

    entries = load_file(str(weights_path))
    # entries are stored as the graph stores them: only an entry itself (not a transpose of it) is a match
    links = {name: entry for name, entry in match_initializers(model, entries, min_bytes).items() if entry in entries}
    drop_duplicates(model, links)
    rename_values(model, {name: entry for name, entry in links.items() if name != entry})
    offsets = safetensors_offsets(weights_path)
    for init in model.graph.initializer:
        if init.name in set(links.values()):
            _point(init, location, *offsets[init.name])
            init.data_location = TensorProto.EXTERNAL
    return model


def _point(init: Any, location: str, offset: int, length: int) -> None:
    init.ClearField("raw_data")
    del init.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = init.external_data.add()
        entry.key, entry.value = key, value


def read_state(entries: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The ``state_dict`` of a weights file: its entries, ``.T`` ones transposed back (one entry per key; a file
    holding both forms of a key keeps the plain one)."""
    state: dict[str, torch.Tensor] = {}
    for name, tensor in entries.items():
        if name.endswith(TRANSPOSED) and tensor.dim() == 2:
            state.setdefault(name.removesuffix(TRANSPOSED), tensor.t().contiguous())
        else:
            state[name] = tensor
    return state


def linked_bytes(model: Any) -> int:
    """Bytes of ``model``'s initializers stored as external data."""
    total = 0
    for init in model.graph.initializer:
        if init.data_location == 1:
            total += int({e.key: e.value for e in init.external_data}.get("length", 0))
    return total


def load_weights_file(path: str | os.PathLike[str], weights_format: str) -> dict[str, Any]:
    """The ``state_dict`` in a weights file: safetensors (plain, or linked by :func:`write_linked`), or a legacy
    ``torch.save`` one (weights only).

    Raises:
        ModelFileError: unreadable, corrupt, or an unknown format.
    """
    try:
        if weights_format in (WEIGHTS_FORMAT, LINKED_WEIGHTS_FORMAT):
            from safetensors.torch import load_file

            return read_state(load_file(str(path), device="cpu"))
        if weights_format == LEGACY_WEIGHTS_FORMAT:
            return dict(torch.load(path, map_location="cpu", weights_only=True))
    except Exception as exc:
        raise ModelFileError(f"cannot read weights {path} ({type(exc).__name__}); re-export the model.") from None
    raise ModelFileError(f"weights {path} have unknown format {weights_format!r}; re-export the model.")


__all__ = [
    "LEGACY_WEIGHTS_FORMAT",
    "LINKED_WEIGHTS_FORMAT",
    "LINK_MIN_BYTES",
    "TRANSPOSED",
    "WEIGHTS_FORMAT",
    "drop_duplicates",
    "link_existing",
    "linked_bytes",
    "load_weights_file",
    "match_initializers",
    "read_state",
    "rename_values",
    "safetensors_offsets",
    "write_linked",
]
