"""How bf16 graphs are validated on a machine without a bf16-capable runtime.

ONNX Runtime's CPU provider has no bf16 kernels for most ops (MatMul, Softmax, ...), and its Python
API cannot even feed bf16 arrays. posenc therefore checks a bf16 graph in two ways:

1. structurally: ``onnx.checker`` (full check with shape inference) and the graph's activation inputs
   and outputs really are bfloat16 (:func:`check_bf16_structure`; float32 position tables and the
   float32 bias of score ops are expected and listed as notes);
2. numerically, by emulation (:func:`emulate_bf16`): every bf16 value of the graph becomes float32,
   and each one is rounded to bf16 (``Cast(to=BFLOAT16)`` then ``Cast(to=FLOAT)``) right where the
   original graph produced it. Arithmetic then runs in float32 between bf16 rounding points, which is
   how bf16 kernels behave (fp32 accumulation, bf16 storage). ONNX Runtime CPU runs the emulated
   graph; polygraphy compares it with the float64 eager reference at the scheme's bf16 tolerance.

:func:`prepare_for_ort` is the one entry point every ONNX Runtime comparison goes through (``posenc
validate``, the position sweep, the before/after check of ``posenc optimize``): it leaves other graphs
alone, and for a bf16 graph returns the emulated model and its feeds with bf16 inputs carried (exactly)
as float32.

Native bf16 execution is checked on TensorRT (GPU machines; ``posenc`` engine stage), whose
precision follows the graph's dtypes.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from posenc.errors import ModelFileError

_BF16 = 16  # onnx.TensorProto.BFLOAT16
_FLOAT = 1  # onnx.TensorProto.FLOAT


def _value_types(model: Any) -> dict[str, int]:
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=False)
    types: dict[str, int] = {}
    for graph in _graphs(inferred.graph):
        for value in [*graph.input, *graph.output, *graph.value_info]:
            if value.type.HasField("tensor_type"):
                types[value.name] = value.type.tensor_type.elem_type
        for init in graph.initializer:
            types[init.name] = init.data_type
    return types


def _graphs(graph: Any) -> list[Any]:
    """``graph`` and every subgraph of its nodes (``If`` branches, loop bodies), depth first."""
    found = [graph]
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                found += _graphs(sub)
    return found


def _to_float_tensor(tensor: Any) -> Any:
    from onnx import numpy_helper

    array = numpy_helper.to_array(tensor).astype(np.float32)
    converted = numpy_helper.from_array(array, tensor.name)
    return converted


def emulate_bf16(model: Any) -> Any:
    """A float32 copy of a bf16 ONNX model that rounds to bf16 wherever the original stored bf16.

    Args:
        model: ``onnx.ModelProto`` with bfloat16 values.

    Returns:
        a new ``onnx.ModelProto`` (inputs and outputs float32 holding bf16-representable values).
    """
    import onnx

    model = onnx.ModelProto.FromString(model.SerializeToString())
    types = _value_types(model)
    for graph in reversed(_graphs(model.graph)):  # subgraphs first: rebuilding a graph's nodes copies them
        _emulate_graph(graph, types)
    return model


def _emulate_graph(graph: Any, types: Mapping[str, int]) -> None:
    """:func:`emulate_bf16` on one graph (its subgraphs are visited apart)."""
    import onnx
    from onnx import helper

    for index, init in enumerate(graph.initializer):
        if init.data_type == _BF16:
            graph.initializer[index].CopyFrom(_to_float_tensor(init))
    for value in [*graph.input, *graph.output]:
        if value.type.tensor_type.elem_type == _BF16:
            value.type.tensor_type.elem_type = _FLOAT
    kept_info = [v for v in graph.value_info if v.type.tensor_type.elem_type != _BF16]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)

    new_nodes = []
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == _BF16:
                attr.i = _FLOAT
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == _BF16:
                attr.t.CopyFrom(_to_float_tensor(attr.t))
        new_nodes.append(node)
        for position, output in enumerate(node.output):
            if not output or types.get(output) != _BF16:
                continue
            raw = f"{output}__fp32"
            node.output[position] = raw
            rounded = f"{output}__bf16"
            new_nodes.append(helper.make_node("Cast", [raw], [rounded], to=_BF16, name=f"{raw}_round"))
            new_nodes.append(helper.make_node("Cast", [rounded], [output], to=_FLOAT, name=f"{raw}_back"))
    del graph.node[:]
    graph.node.extend(new_nodes)


def check_bf16_structure(model: Any) -> list[str]:
    """Structural checks of a bf16 graph; returns findings (empty = fine).

    Raises:
        ModelFileError: the model is not valid ONNX.
    """
    import onnx

    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:
        raise ModelFileError(f"the bf16 graph fails onnx.checker: {str(exc).splitlines()[0][:300]}") from None
    findings = []
    for value in [*model.graph.input, *model.graph.output]:
        elem = value.type.tensor_type.elem_type
        if elem not in (_BF16, onnx.TensorProto.INT64):
            findings.append(f"{value.name} is {onnx.TensorProto.DataType.Name(elem)}, not BFLOAT16")
    return findings


EMULATION_NOTE = (
    "bf16: ONNX Runtime CPU has no bf16 kernels; the graph ran with float32 arithmetic and bf16 rounding "
    "at every bf16 value (posenc.validate.bf16). Native bf16 runs on TensorRT."
)


@dataclasses.dataclass
class OrtModel:
    """A model and its feeds, ready for ONNX Runtime CPU.

    Attributes:
        model: the path or serialized bytes ONNX Runtime loads (``SessionFromOnnx`` takes either).
        feeds: the feeds, bf16 inputs as float32 when ``emulated``.
        emulated: the graph is bf16 and runs emulated (:func:`emulate_bf16`).
        notes: structural findings and how the graph ran (empty for other graphs).
    """

    model: str | bytes
    feeds: list[dict[str, np.ndarray]]
    emulated: bool = False
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def mode(self) -> str:
        """``"bf16-emulated"`` or ``"numeric"``."""
        return "bf16-emulated" if self.emulated else "numeric"


def is_bf16(model: Any) -> bool:
    """True when an ``onnx.ModelProto`` has a bfloat16 input, output or initializer."""
    values = [*model.graph.input, *model.graph.output]
    return any(v.type.tensor_type.elem_type == _BF16 for v in values) or any(
        init.data_type == _BF16 for init in model.graph.initializer
    )


def load_proto(model: str | os.PathLike[str] | bytes) -> Any:
    """The ``onnx.ModelProto`` of a path or of serialized bytes."""
    import onnx

    return onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(str(model))


def prepare_for_ort(
    model: str | os.PathLike[str] | bytes,
    feeds: Sequence[Mapping[str, np.ndarray]],
    *,
    proto: Any = None,
    check_structure: bool = False,
) -> OrtModel:
    """``model`` and ``feeds`` as ONNX Runtime CPU can run them: unchanged, or bf16-emulated.

    Args:
        model: path or serialized ONNX model.
        feeds: ``{input name: array}`` per run, in the graph's dtypes (bf16 arrays for bf16 inputs).
        proto: ``model`` already parsed (``onnx.ModelProto``), to save loading it again.
        check_structure: for bf16 graphs, also run :func:`check_bf16_structure` (findings become notes).

    Returns:
        :class:`OrtModel`.
    """
    proto = proto if proto is not None else load_proto(model)
    source = model if isinstance(model, bytes) else str(model)
    if not is_bf16(proto):
        return OrtModel(source, [dict(feed) for feed in feeds])
    notes = check_bf16_structure(proto) if check_structure else []
    bf16_inputs = {v.name for v in proto.graph.input if v.type.tensor_type.elem_type == _BF16}
    carried = [
        {name: (np.asarray(a).astype(np.float32) if name in bf16_inputs else a) for name, a in feed.items()}
        for feed in feeds
    ]
    return OrtModel(emulate_bf16(proto).SerializeToString(), carried, emulated=True, notes=[*notes, EMULATION_NOTE])
