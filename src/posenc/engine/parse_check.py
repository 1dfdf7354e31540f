"""Whether TensorRT can parse a graph, as a report (for ``posenc inspect``) rather than an exception."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import onnx

from posenc.engine.backend import configure_polygraphy, load_backend
from posenc.engine.network import fused_remedy, inlined_plugin_layers, layer_histogram, parse_onnx, plugin_reason
from posenc.errors import BackendUnavailable, BuildError


@dataclasses.dataclass
class ParseReport:
    """Outcome of parsing with TensorRT.

    Attributes:
        backend: ``tensorrt <version>`` / ``tensorrt_rtx <version>``, or ``None`` when none is installed.
        parsed: True / False, or ``None`` when not checked.
        message: the failure (node and op) or why it was not checked.
        layers: layer-type histogram of the parsed network.
        inlined_plugin_layers: layers TensorRT made of posenc plugin nodes by inlining their ONNX function
            (:func:`posenc.engine.network.inlined_plugin_layers`); 0 when none.
        inlined_reason: why, and what to build instead (empty when none were inlined).
    """

    backend: str | None
    parsed: bool | None
    message: str = ""
    layers: dict[str, int] = dataclasses.field(default_factory=dict)
    inlined_plugin_layers: int = 0
    inlined_reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_parse(path: str | os.PathLike[str], backend: str | None = None) -> ParseReport:
    """Parse ``path`` with TensorRT and report; never raises for an unparsable graph or a missing backend."""
    try:
        trt_backend = load_backend(backend)
    except BackendUnavailable as exc:
        return ParseReport(backend=None, parsed=None, message=f"not checked: {exc}")
    try:
        configure_polygraphy(trt_backend)
        parsed = parse_onnx(trt_backend, path)
    except BackendUnavailable as exc:
        return ParseReport(backend=trt_backend.describe(), parsed=None, message=f"not checked: {exc}")
    except BuildError as exc:
        return ParseReport(backend=trt_backend.describe(), parsed=False, message=str(exc))
    inlined = inlined_plugin_layers(parsed, onnx.load(str(path), load_external_data=False))
    return ParseReport(
        backend=trt_backend.describe(),
        parsed=True,
        layers=layer_histogram(parsed),
        inlined_plugin_layers=inlined,
        inlined_reason=f"{plugin_reason(trt_backend)}; {fused_remedy(Path(path))}" if inlined else "",
    )
