"""polygraphy runners of posenc comparisons: PyTorch callables (the float64 eager reference) and ONNX Runtime.

- :class:`TorchModuleRunner`: any PyTorch callable ``fn(feed) -> {output name: Tensor | ndarray}`` as a
  polygraphy runner (CPU, no autograd). This is the slot for references from outside posenc, e.g. the
  checkpoint's own transformers attention module.
- :class:`EagerTorchRunner`: the float64 eager posenc reference. It is given the unit module (float64
  weights and tables, see :func:`posenc.export.load_eager`) and the manifest, upcasts each feed to float64
  (position ids stay int64) and returns float64 outputs named like the graph's. polygraphy's own
  ``PytRunner`` moves tensors to CUDA, so it cannot serve as a CPU reference.
- :func:`ort_runner`: polygraphy's ``OnnxrtRunner`` on a session of :func:`posenc.export.ort_session`, or, for an
  in-place cache graph, :class:`InPlaceOrtRunner` (each present bound to its cache input's buffer, as deployed).
- TensorRT: :func:`posenc.engine.engine_runner` returns polygraphy's ``TrtRunner`` (GPU machines).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from polygraphy.backend.base import BaseRunner
from polygraphy.backend.onnxrt import OnnxrtRunner
from polygraphy.common import TensorMetadata

from posenc.dtypes import NUMPY_DTYPES
from posenc.errors import ConfigError
from posenc.export.eager import reference_inputs
from posenc.export.feeds import dim_size
from posenc.export.manifest import Manifest
from posenc.export.runtime import ort_session
from posenc.export.shapes import Shape

REFERENCE_NAME = "eager-fp64"
REFERENCE_DESCRIPTION = "float64 eager posenc reference (CPU)"
FLOAT32_NAME = "eager-fp32"
FLOAT32_DESCRIPTION = (
    "the same eager posenc reference in float32 (CPU): measures what float32 arithmetic alone gets wrong on each "
    "feed, for the float32 floor; no rows of its own"
)

TorchFn = Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]]
"""``fn(feed) -> {output name: torch.Tensor | numpy array}``; the feed maps graph input names to arrays."""


def feed_metadata(feed: Mapping[str, np.ndarray]) -> TensorMetadata:
    """polygraphy input metadata of a feed: its names and dtypes, every dim dynamic."""
    meta = TensorMetadata()
    for name, array in feed.items():
        meta.add(name, np.asarray(array).dtype, tuple(f"{name}_{axis}" for axis in range(np.ndim(array))))
    return meta


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:  # numpy has no bf16: float32 holds it exactly
            value = value.to(torch.float32)
        return np.ascontiguousarray(value.numpy())
    return np.ascontiguousarray(np.asarray(value))


class TorchModuleRunner(BaseRunner):
    """A PyTorch callable as a polygraphy runner (CPU, under ``torch.no_grad()``).

    Args:
        fn: ``fn(feed) -> {output name: Tensor | ndarray}``; ``feed`` maps graph input names to numpy arrays.
        name: runner name (the ``reference`` / ``runner`` column of comparison rows).
        output_names: outputs to keep, in this order (default: every output ``fn`` returns). A name ``fn``
            does not return raises :class:`ConfigError`.
        input_metadata: polygraphy ``TensorMetadata`` of the inputs (polygraphy casts each feed to it).
            ``None``: :func:`posenc.validate.compare.compare` sets it from its feeds (:func:`feed_metadata`).
    """

    def __init__(
        self,
        fn: TorchFn,
        name: str,
        output_names: Sequence[str] | None = None,
        input_metadata: TensorMetadata | None = None,
    ) -> None:
        super().__init__(name=name, prefix="torch-runner")
        self.fn = fn
        self.output_names = list(output_names) if output_names is not None else None
        self.input_metadata = input_metadata

    def get_input_metadata_impl(self) -> TensorMetadata:
        if self.input_metadata is None:
            raise ConfigError(
                f"runner {self.name!r} has no input metadata; pass input_metadata= (e.g. feed_metadata(feed)) "
                f"or run it through posenc.validate.compare.compare, which sets it from the feeds."
            )
        return self.input_metadata

    def infer_impl(self, feed_dict: Mapping[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
        start = time.perf_counter()
        with torch.no_grad():
            outputs = self.fn(feed_dict)
        names = self.output_names if self.output_names is not None else list(outputs)
        missing = [n for n in names if n not in outputs]
        if missing:
            raise ConfigError(
                f"runner {self.name!r} returned outputs {list(outputs)}, not {missing}; "
                f"return every name in output_names."
            )
        result = OrderedDict((n, _to_numpy(outputs[n])) for n in names)
        self.inference_time = time.perf_counter() - start
        return result


class EagerTorchRunner(TorchModuleRunner):
    """The float64 eager posenc reference: the unit module of a manifest, on CPU.

    Args:
        module: the eager unit module (float64), inputs in graph order (:func:`posenc.export.load_eager`).
        manifest: the exported model's manifest (input/output names, dims).
        shape: when given, input metadata reports these concrete sizes; ``None`` keeps the manifest's
            symbolic dims (one runner then serves feeds of every shape).
        feed_dtypes: numpy dtype of each input as fed (defaults to the manifest's dtypes).
        name: runner name in polygraphy results.
        dtype: the module's dtype, which its inputs are cast to (float32 for :data:`FLOAT32_NAME`, which measures
            what float32 arithmetic alone gets wrong).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        manifest: Manifest,
        shape: Shape | None = None,
        feed_dtypes: Mapping[str, Any] | None = None,
        name: str = REFERENCE_NAME,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        self.module = module
        self.dtype = dtype
        self.manifest = manifest
        self.shape = shape
        self.feed_dtypes = dict(feed_dtypes or {})
        meta = TensorMetadata()
        for spec in manifest.inputs:
            dtype = self.feed_dtypes.get(spec.name, NUMPY_DTYPES.get(spec.dtype, np.float32))
            dims = tuple(dim_size(d, shape) for d in spec.shape) if shape is not None else tuple(spec.shape)
            meta.add(spec.name, dtype, dims)
        super().__init__(self._run, name, manifest.output_names, meta)

    def _run(self, feed: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        outputs = self.module(*reference_inputs(self.manifest, feed, self.dtype))
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        return {name: value.to(torch.float64) for name, value in zip(self.manifest.output_names, outputs, strict=True)}


def ort_runner(
    model: str | bytes, providers: Sequence[str] = ("CPUExecutionProvider",), name: str = "", in_place: bool = False
) -> BaseRunner:
    """polygraphy's :class:`OnnxrtRunner` on a session made now (:func:`posenc.export.ort_session`), so that a
    graph ONNX Runtime cannot load fails here.

    Args:
        model: path or serialized model (e.g. :attr:`posenc.validate.bf16.OrtModel.model`).
        providers: ONNX Runtime providers in order of preference.
        name: runner name (default ``onnxrt-cuda`` when CUDA comes first, else ``onnxrt-cpu``).
        in_place: an in-place cache graph (``block-inplace``): an :class:`InPlaceOrtRunner`, which binds each present
            to its cache input's buffer as a deployment does (``GroupQueryAttention`` leaves the slots it does not
            write unspecified unless the buffers are shared).

    Raises:
        BackendUnavailable: ONNX Runtime lacks a kernel the graph needs.
        ModelFileError: ONNX Runtime cannot load the graph.
    """
    session = ort_session(model, providers, check=False)
    label = name or ("onnxrt-cuda" if providers and providers[0].startswith("CUDA") else "onnxrt-cpu")
    if in_place:
        return InPlaceOrtRunner(session, name=label)
    return OnnxrtRunner(session, name=label)


CACHE_BUFFERS: tuple[tuple[str, str], ...] = (("key_cache", "present_key"), ("value_cache", "present_value"))
"""``(cache input, present output)`` pairs of an in-place cache graph: one buffer each."""
_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
              "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}  # fmt: skip


def bind_in_place(session: Any, feed: Mapping[str, Any], caches: Mapping[str, Any], other_outputs: bool = True) -> Any:
    """An ONNX Runtime IOBinding of ``feed`` with each cache OrtValue of ``caches`` (by input name) bound as both
    its input and its present output; the other outputs go to CPU memory, in the session's output order (unless
    ``other_outputs`` is False: the caller binds them)."""
    binding = session.io_binding()
    presents = dict(CACHE_BUFFERS)
    for name, value in feed.items():
        if name in caches:
            binding.bind_ortvalue_input(name, caches[name])
            binding.bind_ortvalue_output(presents[name], caches[name])
        else:
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
    written = {presents[name] for name in caches}
    for meta in session.get_outputs() if other_outputs else ():
        if meta.name not in written:
            binding.bind_output(meta.name, "cpu")
    return binding


class InPlaceOrtRunner(BaseRunner):
    """ONNX Runtime on an in-place cache graph, each present bound to its cache input's buffer (IOBinding).

    Each call copies the fed caches into fresh buffers, runs in place, and returns every output (the presents are
    the buffers after the run), so a feed is never modified.

    Args:
        session: an ``onnxruntime.InferenceSession`` (:func:`posenc.export.ort_session`).
        name: runner name.
    """

    def __init__(self, session: Any, name: str) -> None:
        super().__init__(name=name, prefix="onnxrt-inplace")
        self.session = session

    def get_input_metadata_impl(self) -> TensorMetadata:
        meta = TensorMetadata()
        for value in self.session.get_inputs():
            meta.add(value.name, _ORT_TYPES.get(value.type, np.float32), tuple(value.shape))
        return meta

    def infer_impl(self, feed_dict: Mapping[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
        import onnxruntime as ort

        start = time.perf_counter()
        buffers = {name: np.array(feed_dict[name], copy=True) for name, _ in CACHE_BUFFERS if name in feed_dict}
        caches = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in buffers.items()}  # shares memory
        binding = bind_in_place(self.session, feed_dict, caches)
        self.session.run_with_iobinding(binding)
        others = iter(binding.copy_outputs_to_cpu()[len(caches) :])
        presents = {present: buffers[cache] for cache, present in CACHE_BUFFERS if cache in buffers}
        result = OrderedDict(
            (meta.name, presents[meta.name] if meta.name in presents else next(others))
            for meta in self.session.get_outputs()
        )
        self.inference_time = time.perf_counter() - start
        return result
