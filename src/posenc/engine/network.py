"""Parsing ONNX into a TensorRT network, with errors that name the failing node and op.

Precision comes from the graph's dtypes: networks are strongly typed (TensorRT 11 and TensorRT-RTX have
no precision flags). After parsing, float32 attention is marked decomposable: TensorRT has no fused
float32 attention kernel and would otherwise fail the build.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from posenc.engine.backend import NOISE, Backend, trt_logger
from posenc.errors import BuildError, ModelFileError
from posenc.export.runtime import check_model_file
from posenc.graphs.manifests import read_manifest


@dataclasses.dataclass(frozen=True)
class ParseIssue:
    """One parser error: the ONNX node (name, op type) and TensorRT's description."""

    node: str
    op: str
    message: str

    def __str__(self) -> str:
        return f"node {self.node or '?'!r} (op {self.op or '?'}): {self.message}"


@dataclasses.dataclass
class ParsedNetwork:
    """A parsed network with the builder and parser that own it (keep all three alive together)."""

    backend: Backend
    builder: Any
    network: Any
    parser: Any

    def as_polygraphy(self) -> tuple[Any, Any, Any]:
        return self.builder, self.network, self.parser

    def inputs(self) -> list[tuple[str, list[int], Any]]:
        """``(name, shape with -1 for dynamic dims, dtype)`` of every network input."""
        return [
            (tensor.name, list(tensor.shape), tensor.dtype)
            for tensor in (self.network.get_input(i) for i in range(self.network.num_inputs))
        ]


def _issues(parser: Any) -> list[ParseIssue]:
    issues = []
    for index in range(parser.num_errors):
        error = parser.get_error(index)
        node = getattr(error, "node_name", lambda: "")() or ""
        op = getattr(error, "node_operator", lambda: "")() or ""
        lines = [line for line in str(error.desc()).splitlines() if not any(n in line for n in NOISE)]
        issues.append(ParseIssue(node=str(node), op=str(op), message=" ".join(lines).strip()))
    return issues


def parse_onnx(backend: Backend, path: str | os.PathLike[str]) -> ParsedNetwork:
    """Parse an ONNX file into a strongly typed TensorRT network.

    The file is checked first (:func:`posenc.export.check_model_file`): TensorRT's parser would accept some
    bytes protobuf refuses, and would follow external data out of the model's folder.

    Raises:
        ModelFileError: the file is missing, not a regular file, not a valid ONNX model, or names external data
            outside its folder.
        BuildError: TensorRT cannot parse the graph; the message names each failing node and its op.
    """
    path = Path(path)
    check_model_file(path)
    trt = backend.trt
    builder = trt.Builder(trt_logger(backend))
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, trt_logger(backend))
    if not parser.parse_from_file(str(path)):
        issues = _issues(parser) or [ParseIssue("", "", "the parser gave no details")]
        listed = "; ".join(str(issue) for issue in issues)
        raise BuildError(f"{backend.describe()} cannot parse {path.name}: {listed}. {parse_remedy(path)}")
    return ParsedNetwork(backend, builder, network, parser)


def _optimized_from(path: Path) -> tuple[str | None, str]:
    """``(target, original export)`` of an optimized graph: its manifest's ``optimized`` record and the first
    ``source_onnx`` of the record's chain; ``(None, file name)`` for a graph no ``posenc optimize`` wrote."""
    try:
        found = read_manifest(path)
    except ModelFileError:
        found = None
    record = None if found is None else found.optimized
    if record is None:
        return None, path.name
    target = record.target
    while record.previous is not None:
        record = record.previous
    return target, record.source_onnx


def parse_remedy(path: Path) -> str:
    """What to do about a graph TensorRT cannot parse: optimize it for TensorRT; a graph optimized for another
    target is not the one to optimize again: its original export is."""
    target, original = _optimized_from(path)
    if target is None:
        return f"Optimize the graph for TensorRT first (`posenc optimize {path.name} --target trt`), or replace the op."
    if target == "trt":
        return "The graph is optimized for TensorRT already (its manifest says so); replace the named op."
    return (
        f"{path.name} was optimized for {target} (ONNX Runtime's ops), not TensorRT: optimize its "
        f"original export for TensorRT instead (`posenc optimize {original} --target trt`: the source its manifest "
        f"records)."
    )


PLUGIN_LAYER_TYPES = frozenset({"PLUGIN", "PLUGIN_V2", "PLUGIN_V3"})


def _layer_type(layer: Any) -> str:
    return str(layer.type).split(".")[-1]


def inlined_plugin_layers(parsed: ParsedNetwork, model: Any) -> int:
    """How many layers TensorRT made of posenc plugin nodes by inlining their ONNX function (the ONNX Runtime twin
    the node carries, :mod:`posenc.plugins.rope.ort_twin`): what it does when no plugin of that name is registered,
    always with TensorRT-RTX, which has no plugins. 0: no plugin node, or TensorRT used the plugin.

    The parser imports nodes in graph order, so a node's layers are those after the last layer of the nodes before
    it, up to the layer producing its last output.

    Args:
        parsed: the parsed network.
        model: the ``onnx.ModelProto`` it was parsed from.
    """
    from posenc.graphs.rope_plugin import plugin_nodes

    plugins = {tuple(node.output) for node in plugin_nodes(model)}  # protobuf wrappers have no stable identity
    if not plugins:
        return 0
    network = parsed.network
    layers = [network.get_layer(index) for index in range(network.num_layers)]
    producer = {layer.get_output(i).name: index for index, layer in enumerate(layers) for i in range(layer.num_outputs)}
    last = -1  # the last layer of the nodes imported so far
    inlined = 0
    for node in model.graph.node:
        made = [producer[name] for name in node.output if name in producer]
        if not made:
            continue
        end = max(made)
        if tuple(node.output) in plugins and not any(
            _layer_type(layer) in PLUGIN_LAYER_TYPES for layer in layers[last + 1 : end + 1]
        ):
            inlined += end - last
        last = max(last, end)
    return inlined


def plugin_reason(backend: Backend) -> str:
    """Why ``backend`` inlines posenc plugin nodes (:func:`inlined_plugin_layers`)."""
    if backend.is_rtx:
        return f"{backend.describe()} has no plugins"
    return (
        f"no posenc plugin is registered with {backend.describe()} in this process "
        f"(posenc.plugins.rope.trt_plugin.register_rope_plugins() registers them)"
    )


def fused_remedy(path: Path) -> str:
    """The graph to build instead of a plugin graph TensorRT inlines: its original export optimized with
    ``--rope fused``."""
    _, original = _optimized_from(path)
    return f"`posenc optimize {original} --target trt --rope fused` gives TensorRT's own rotary layer"


def mark_fp32_attention_decomposable(parsed: ParsedNetwork) -> int:
    """Allow TensorRT to decompose float32 attention (no fused fp32 kernel exists). Returns layers marked.

    The ONNX parser creates ``IAttention`` not decomposable; the standard ONNX op has no attribute for it,
    so the flag is set on the parsed network instead.
    """
    trt = parsed.backend.trt
    layer_type = getattr(trt.LayerType, "ATTENTION_OUTPUT", None)
    if layer_type is None:
        return 0
    marked = 0
    network = parsed.network
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        if layer.type != layer_type:
            continue
        layer.__class__ = trt.IAttentionOutputLayer
        attention = layer.attention
        query = attention.get_input(0)
        if query is not None and query.dtype == trt.float32 and not attention.decomposable:
            attention.decomposable = True
            marked += 1
    return marked


def layer_histogram(parsed: ParsedNetwork) -> dict[str, int]:
    """``{layer type: count}`` of the parsed network (e.g. ROTARY_EMBEDDING, ATTENTION_OUTPUT)."""
    counts: dict[str, int] = {}
    for index in range(parsed.network.num_layers):
        name = _layer_type(parsed.network.get_layer(index))
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))
