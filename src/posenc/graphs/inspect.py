"""``posenc inspect``: what is in an ONNX file and whether TensorRT can take it.

Reports the op histogram, initializer bytes (total and the largest tables), the fused ops present
(RotaryEmbedding, Attention, posenc plugin nodes), the passes recorded in the manifest, and the result of
parsing with TensorRT (``tensorrt`` or ``tensorrt_rtx``; a failure names the node and op).
"""

from __future__ import annotations

import collections
import dataclasses
import os
from pathlib import Path
from typing import Any

import onnx_ir as ir

from posenc.graphs import model_io
from posenc.graphs.manifests import read_raw_manifest

FUSED_OPS = ("RotaryEmbedding", "Attention")


@dataclasses.dataclass
class InspectReport:
    """Everything ``posenc inspect`` prints (``to_dict`` for ``--json``)."""

    path: str
    opset: int
    ops: dict[str, int]
    nodes: int
    initializer_bytes: int
    largest_initializers: list[dict[str, Any]]
    fused_ops: dict[str, int]
    fusions: dict[str, int] | None
    target: str | None
    tensorrt: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_text(self) -> str:
        lines = [f"{self.path}: {self.nodes} nodes, opset {self.opset}"]
        lines.append("ops: " + ", ".join(f"{op} {n}" for op, n in self.ops.items()))
        lines.append(f"initializers: {_human(self.initializer_bytes)}")
        for item in self.largest_initializers:
            lines.append(f"  {item['name']} {item['dtype']}{item['shape']}: {_human(item['bytes'])}")
        lines.append("fused ops: " + (", ".join(f"{op} {n}" for op, n in self.fused_ops.items()) or "none"))
        if self.fusions is None:
            lines.append("fusions applied: unknown (no `posenc optimize` record in the manifest)")
        else:
            applied = ", ".join(f"{name} {n}" for name, n in self.fusions.items() if n) or "none"
            lines.append(f"fusions applied (target {self.target}): {applied}")
        if self.tensorrt is not None:
            trt = self.tensorrt
            if trt["parsed"] is None:
                lines.append(f"TensorRT: {trt['message']}")
            elif trt["parsed"]:
                layers = ", ".join(f"{k} {v}" for k, v in trt["layers"].items())
                lines.append(f"TensorRT ({trt['backend']}): parses ({layers})")
            else:
                lines.append(f"TensorRT ({trt['backend']}): does NOT parse: {trt['message']}")
        return "\n".join(lines)


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def _op_name(node: ir.Node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def inspect_model(path: str | os.PathLike[str], *, check_tensorrt: bool = True, top: int = 5) -> InspectReport:
    """Inspect an ONNX file (and its manifest); ``check_tensorrt`` parses it with TensorRT when installed.

    Raises:
        ModelFileError: the file is missing or not ONNX.
    """
    path = Path(path)
    model = model_io.load_model(path)
    ops = collections.Counter(_op_name(node) for node in model.graph.all_nodes())
    tables = []
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if tensor is None:
            continue
        tables.append({"name": value.name, "dtype": tensor.dtype.name.lower(), "shape": list(tensor.shape.numpy()),
                       "bytes": int(tensor.nbytes)})  # fmt: skip
    tables.sort(key=lambda item: -item["bytes"])
    manifest = read_raw_manifest(path)
    record = (manifest or {}).get("optimized")
    fusions = {p["name"]: int(p["count"]) for p in record["passes"]} if record else None
    fused = {op: n for op, n in ops.items() if op.split("::")[-1] in FUSED_OPS or ("::" in op and "posenc" in op)}
    tensorrt = None
    if check_tensorrt:
        from posenc.engine.parse_check import check_parse

        tensorrt = check_parse(path).to_dict()
    return InspectReport(
        path=str(path),
        opset=model_io.default_opset(model),
        ops=dict(ops.most_common()),
        nodes=sum(ops.values()),
        initializer_bytes=sum(item["bytes"] for item in tables),
        largest_initializers=tables[:top],
        fused_ops=dict(sorted(fused.items())),
        fusions=fusions,
        target=record.get("target") if record else None,
        tensorrt=tensorrt,
    )
