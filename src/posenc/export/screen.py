"""Bounds on a graph before posenc rewrites, inspects or runs it: hostile ONNX refused with the reason.

posenc's own exports are attention blocks of about a hundred nodes with no control flow. A graph handed to
``posenc optimize``, ``inspect`` or ``validate`` may instead hold a ``Loop`` that runs 2**62 times (constant folding
or the parity check would never return), a chain of 100,000 nodes (onnxscript's rewriter matches multi-node
patterns in time quadratic in the graph's size), inputs declared with dimensions no machine can hold, or ops of a
domain no runtime knows (the parity check cannot run them). :func:`screen_graph` refuses the first two when the
file is opened (:func:`posenc.export.runtime.check_model_file`); :func:`unknown_ops` and :func:`feed_bytes` let a
caller that runs the graph refuse the others, naming the op or the input.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from posenc.errors import ModelFileError

MAX_NODES = 5_000
"""Most nodes (subgraphs included) a graph may hold: 40 times the largest posenc export (a traced attention block,
about 120 nodes); optimize takes about 10 s at this bound on one core."""
MAX_LOOP_TRIPS = 1 << 16
"""Largest constant trip count of a ``Loop``; a Loop without a constant trip count is refused (it is bounded only by
what its condition computes)."""
RUNTIME_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft"})
"""Op domains ONNX Runtime runs without registering anything."""


def all_nodes(graph: Any) -> Iterator[Any]:
    """Every ``onnx.NodeProto`` of ``graph`` and of the subgraphs its nodes hold (Loop, If, Scan bodies)."""
    from onnx import AttributeProto

    stack = [graph]
    while stack:
        current = stack.pop()
        for node in current.node:
            yield node
            for attribute in node.attribute:
                if attribute.type == AttributeProto.GRAPH:
                    stack.append(attribute.g)
                elif attribute.type == AttributeProto.GRAPHS:
                    stack.extend(attribute.graphs)


def _constants(graph: Any) -> dict[str, Any]:
    """Name -> ``TensorProto`` of the graph's initializers and ``Constant`` nodes' tensors."""
    found = {init.name: init for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output:
            for attribute in node.attribute:
                if attribute.name == "value" and attribute.HasField("t"):
                    found[node.output[0]] = attribute.t
    return found


def _loop_trips(graph: Any, path: str) -> None:
    """Refuse a ``Loop`` of ``graph`` (or of its subgraphs) without a constant trip count up to the bound."""
    from onnx import AttributeProto, numpy_helper

    constants = _constants(graph)
    for node in graph.node:
        if node.op_type == "Loop" and node.domain in ("", "ai.onnx"):
            name = node.input[0] if node.input else ""
            tensor = constants.get(name) if name else None
            trips = None
            if tensor is not None:
                values = numpy_helper.to_array(tensor).reshape(-1)
                trips = int(values[0]) if values.size == 1 else None
            if trips is None or not 0 <= trips <= MAX_LOOP_TRIPS:
                count = "no constant trip count" if trips is None else f"trip count {trips:,}"
                raise ModelFileError(
                    f"{path}: Loop node {node.name or '?'} has {count}; posenc rewrites and runs graphs whose loops "
                    f"end within {MAX_LOOP_TRIPS:,} iterations (constant folding and the parity check would run it). "
                    f"Pass posenc's own export, or a graph without unbounded loops."
                )
        for attribute in node.attribute:
            if attribute.type == AttributeProto.GRAPH:
                _loop_trips(attribute.g, path)
            elif attribute.type == AttributeProto.GRAPHS:
                for sub in attribute.graphs:
                    _loop_trips(sub, path)


def screen_graph(model: Any, path: str) -> None:
    """Refuse a ``ModelProto`` with more than :data:`MAX_NODES` nodes or a Loop without a bounded trip count.

    Raises:
        ModelFileError: names the count or the loop, and the bound.
    """
    count = 0
    for _ in all_nodes(model.graph):
        count += 1
        if count > MAX_NODES:
            raise ModelFileError(
                f"{path} holds more than {MAX_NODES:,} nodes; posenc optimizes, inspects and validates attention "
                f"blocks (its exports hold about a hundred), and a graph this size would take minutes. Export one "
                f"attention layer with posenc export."
            )
    for function in model.functions:
        count += len(function.node)
    if count > MAX_NODES:
        raise ModelFileError(f"{path} holds {count:,} nodes with its functions, over posenc's bound of {MAX_NODES:,}.")
    _loop_trips(model.graph, path)


def unknown_ops(model: Any) -> list[str]:
    """``domain::op`` of every node in a domain ONNX Runtime does not run and the model defines no function for,
    sorted (empty: the graph runs on ONNX Runtime)."""
    known = RUNTIME_DOMAINS | {function.domain for function in model.functions}
    return sorted({f"{node.domain}::{node.op_type}" for node in all_nodes(model.graph) if node.domain not in known})


def feed_bytes(dims: list[int], itemsize: int) -> int:
    """Bytes of one feed of shape ``dims``."""
    total = itemsize
    for dim in dims:
        total *= max(int(dim), 0)
    return total


__all__ = ["MAX_LOOP_TRIPS", "MAX_NODES", "RUNTIME_DOMAINS", "all_nodes", "feed_bytes", "screen_graph", "unknown_ops"]
