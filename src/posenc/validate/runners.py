"""polygraphy runners: eager PyTorch (float64 reference on CPU) and ONNX Runtime.

:class:`EagerTorchRunner` rebuilds nothing itself: it is given the unit module (float64 weights and
float64 tables, see :func:`posenc.export.load_eager`) and the manifest, upcasts each feed to float64
(position ids stay int64) and returns float64 outputs named like the graph's. polygraphy's own
``PytRunner`` moves tensors to CUDA, so it cannot serve as a CPU reference.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from polygraphy.backend.base import BaseRunner
from polygraphy.backend.onnxrt import OnnxrtRunner
from polygraphy.common import TensorMetadata

from posenc.export.manifest import Manifest
from posenc.export.runtime import reference_inputs
from posenc.export.units import FeedShape, _size

REFERENCE_NAME = "eager-fp64"


class EagerTorchRunner(BaseRunner):
    """Runs the eager module on CPU in float64 for the feeds of one :class:`FeedShape`.

    Args:
        module: the eager unit module (float64), inputs in graph order.
        manifest: the exported model's manifest (input/output names, dims).
        shape: the feed sizes; input metadata reports these concrete shapes (polygraphy needs them).
        feed_dtypes: numpy dtype of each input as fed (defaults to the manifest's dtypes).
        name: runner name in polygraphy results.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        manifest: Manifest,
        shape: FeedShape,
        feed_dtypes: Mapping[str, Any] | None = None,
        name: str = REFERENCE_NAME,
    ) -> None:
        super().__init__(name=name, prefix="eager-runner")
        self.module = module
        self.manifest = manifest
        self.shape = shape
        self.feed_dtypes = dict(feed_dtypes or {})

    def get_input_metadata_impl(self) -> TensorMetadata:
        from posenc.export.units import NUMPY_DTYPES

        meta = TensorMetadata()
        for spec in self.manifest.inputs:
            dtype = self.feed_dtypes.get(spec.name, NUMPY_DTYPES.get(spec.dtype, np.float32))
            meta.add(spec.name, dtype, tuple(_size(d, self.shape) for d in spec.shape))
        return meta

    def infer_impl(self, feed_dict: Mapping[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
        start = time.perf_counter()
        inputs = reference_inputs(self.manifest, feed_dict, torch.float64)
        with torch.no_grad():
            outputs = self.module(*inputs)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        result = OrderedDict(
            (name, np.ascontiguousarray(value.detach().to(torch.float64).numpy()))
            for name, value in zip(self.manifest.output_names, outputs, strict=True)
        )
        self.inference_time = time.perf_counter() - start
        return result


def onnxrt_runner(session_or_loader: Any, name: str = "onnxrt") -> OnnxrtRunner:
    """polygraphy's :class:`OnnxrtRunner` around an ORT session (or a ``SessionFromOnnx`` loader)."""
    return OnnxrtRunner(session_or_loader, name=name)


def session_from_onnx(model: str | bytes, providers: Sequence[str]) -> Any:
    """An ORT session through polygraphy's ``SessionFromOnnx`` loader (path or serialized model)."""
    from polygraphy.backend.onnxrt import SessionFromOnnx

    return SessionFromOnnx(model, providers=list(providers))()
