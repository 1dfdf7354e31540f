"""Backends a workload is timed on: eager PyTorch, ONNX Runtime (CPU decomposed / fused / GroupQueryAttention,
CUDA exported / fused), TensorRT.

Each backend says why it cannot run (:meth:`Backend.unavailable`) instead of failing, and turns a
workload into a zero-argument callable whose outputs are preallocated (ONNX Runtime IOBinding), so the
timed call does only the work itself.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posenc.bench.models import ModelStore, SkipCase
from posenc.bench.workloads import Workload
from posenc.errors import BackendUnavailable, ConfigError
from posenc.export.runtime import ort_session
from posenc.export.units import BLOCK_INPLACE
from posenc.validate.runners import CACHE_BUFFERS, bind_in_place

Runner = Callable[[], Any]


class Backend:
    """Base class: a name, a one-line description, availability and :meth:`prepare`."""

    name = ""
    description = ""
    runs_graph = True
    """It times an exported ONNX graph (a guarded one, unless the run turns the guard off)."""

    def unavailable(self) -> str | None:
        """Why this backend cannot run on this machine, or ``None``."""
        return None

    def prepare(self, workload: Workload, models: ModelStore, threads: int) -> Runner:
        """Build everything a timed call needs and return the call.

        Raises:
            SkipCase: this workload cannot run here (the reason goes into the results).
        """
        raise NotImplementedError


class EagerTorch(Backend):
    name = "torch"
    description = "eager PyTorch (the reference module), CPU"
    runs_graph = False

    def prepare(self, workload: Workload, models: ModelStore, threads: int) -> Runner:
        module, args = workload.module, tuple(workload.inputs.values())

        def run() -> Any:
            with torch.inference_mode():
                return module(*args)

        return run


def _bind_names(session: Any, workload: Workload) -> list[tuple[str, np.ndarray]]:
    """Pair the graph's inputs with the workload's tensors: by name, else by position."""
    graph_inputs = [i.name for i in session.get_inputs()]
    available = {name: t.detach().contiguous().numpy() for name, t in workload.inputs.items()}
    if all(name in available for name in graph_inputs):
        return [(name, available[name]) for name in graph_inputs]
    if len(graph_inputs) == len(available):
        return list(zip(graph_inputs, available.values(), strict=True))
    raise SkipCase(
        f"the graph's inputs {graph_inputs} do not match the workload's {list(available)}; re-export the model."
    )


ORT_GRAPHS: dict[str, tuple[str, str | None, str]] = {
    "decomposed": ("ort-cpu", None, "ONNX Runtime CPU, the exported (decomposed) graph"),
    "fused": (
        "ort-cpu-fused",
        "ort-cpu",
        "ONNX Runtime CPU, graph optimized for ort-cpu (fused RotaryEmbedding 3-D, Attention; in-place caches read "
        "without copies when decoding)",
    ),
    "gqa": (
        "ort-cpu-gqa",
        "ort-cuda",
        "ONNX Runtime CPU, graph optimized for ort-cuda (contrib GroupQueryAttention over the in-place cache)",
    ),
}
"""Graph kind -> (backend name, the ``posenc optimize`` target of its graph or None for the export, description)."""


def _model_path(workload: Workload, models: ModelStore, target: str | None) -> Path:
    return models.exported(workload) if target is None else models.optimized(workload, target)


def _in_place_caches(workload: Workload) -> dict[str, np.ndarray]:
    """Copies of an in-place workload's caches (the buffers a timed call writes into), else nothing."""
    if workload.unit != BLOCK_INPLACE:
        return {}
    return {name: workload.inputs[name].detach().numpy().copy() for name, _ in CACHE_BUFFERS}


class OrtCpu(Backend):
    """ONNX Runtime CPU on the exported graph (``graph="decomposed"``), the one optimized for ``ort-cpu``
    (``"fused"``), or the one optimized for ``ort-cuda`` (``"gqa"``, its contrib ops on the CPU kernels).

    In-place cache graphs run as deployed: each present bound to its cache's buffer, so a step writes only its
    new slots.
    """

    def __init__(self, graph: str = "decomposed") -> None:
        if graph not in ORT_GRAPHS:
            raise ConfigError(f"unknown graph kind {graph!r}; use one of {list(ORT_GRAPHS)}.")
        self.graph = graph
        self.name, self.target, self.description = ORT_GRAPHS[graph]

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("onnxruntime") is None:
            return "onnxruntime is not installed (pip install onnxruntime)"
        return None

    def model_path(self, workload: Workload, models: ModelStore) -> Path:
        return _model_path(workload, models, self.target)

    def prepare(self, workload: Workload, models: ModelStore, threads: int) -> Runner:
        import onnxruntime as ort

        path = self.model_path(workload, models)
        session = models.cached(
            ("ort-cpu", str(path), threads),
            lambda: ort_session(path, ["CPUExecutionProvider"], threads=threads, spinning=False, check=False),
        )
        feeds = _bind_names(session, workload)
        buffers = _in_place_caches(workload)
        keep: list[Any] = list(buffers.values())
        caches = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in buffers.items()}  # shares memory
        binding = bind_in_place(session, dict(feeds), caches, other_outputs=False)
        written = {present for cache, present in CACHE_BUFFERS if cache in caches}
        first = session.run(None, dict(feeds))  # learns output shapes; doubles as a warm-up call
        for meta, value in zip(session.get_outputs(), first, strict=True):
            if meta.name in written:
                continue
            out = np.empty_like(value)
            keep.append(out)
            binding.bind_output(meta.name, "cpu", 0, out.dtype, list(out.shape), out.ctypes.data)

        def run() -> list[Any]:
            session.run_with_iobinding(binding)
            return keep

        return run


class OrtCuda(Backend):
    """ONNX Runtime CUDA on the exported graph, or on the one optimized for ``ort-cuda`` (``fused=True``: contrib
    ``GroupQueryAttention`` over an in-place cache); inputs and outputs on the GPU, in-place caches shared."""

    def __init__(self, fused: bool = False) -> None:
        self.fused = fused
        self.name = "ort-cuda-fused" if fused else "ort-cuda"
        self.description = (
            "ONNX Runtime CUDA, graph optimized for ort-cuda (GroupQueryAttention over in-place caches)"
            if fused
            else "ONNX Runtime CUDA execution provider, inputs and outputs on the GPU"
        )

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("onnxruntime") is None:
            return "onnxruntime is not installed"
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return "onnxruntime has no CUDAExecutionProvider here (install onnxruntime-gpu on a machine with a GPU)"
        return None

    def prepare(self, workload: Workload, models: ModelStore, threads: int) -> Runner:
        import onnxruntime as ort

        path = _model_path(workload, models, "ort-cuda" if self.fused else None)
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        session = ort_session(path, providers, threads=threads, spinning=False, check=False)
        feeds = _bind_names(session, workload)
        first = session.run(None, dict(feeds))
        binding = session.io_binding()
        keep = []
        caches = {}
        for name, array in feeds:
            value = ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0)
            keep.append(value)
            binding.bind_ortvalue_input(name, value)
            if workload.unit == BLOCK_INPLACE and name in dict(CACHE_BUFFERS):
                caches[dict(CACHE_BUFFERS)[name]] = value  # the present is written into its cache's buffer
        for meta, host in zip(session.get_outputs(), first, strict=True):
            value = caches.get(meta.name) or ort.OrtValue.ortvalue_from_shape_and_type(
                list(host.shape), host.dtype, "cuda", 0
            )
            keep.append(value)
            binding.bind_ortvalue_output(meta.name, value)

        def run() -> list[Any]:
            session.run_with_iobinding(binding)  # synchronizes the stream before returning
            return keep

        return run


class TensorRT(Backend):
    """A TensorRT engine built from the exported graph by :mod:`posenc.engine`, run on the GPU."""

    name = "tensorrt"
    description = "TensorRT engine (datacenter tensorrt) on an NVIDIA GPU"

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("tensorrt") is None:
            if importlib.util.find_spec("tensorrt_rtx") is not None:
                return (
                    "only tensorrt_rtx is installed: it builds engines ahead of time (see the engine builds) but "
                    "cannot run them without an NVIDIA GPU; install tensorrt on a GPU machine to time engines"
                )
            return "TensorRT is not installed (pip install tensorrt on a machine with an NVIDIA GPU)"
        if not torch.cuda.is_available():
            return "no CUDA device visible to torch: TensorRT engines need an NVIDIA GPU to run"
        return None

    def prepare(self, workload: Workload, models: ModelStore, threads: int) -> Runner:
        engine_path = models.engine(workload)
        if workload.unit == BLOCK_INPLACE:
            return _tensorrt_in_place(engine_path, workload, models)
        try:
            from posenc.engine import engine_runner

            runner = engine_runner(engine_path)
        except (ImportError, BackendUnavailable) as exc:
            raise SkipCase(f"the engine cannot be run here: {exc}") from None
        runner.activate()
        feed = {name: t.contiguous().cuda() for name, t in workload.inputs.items()}
        models.on_close(runner.deactivate)

        def run() -> Any:
            outputs = runner.infer(feed, copy_outputs_to_host=False)
            torch.cuda.synchronize()
            return outputs

        return run


def _tensorrt_in_place(engine_path: Path, workload: Workload, models: ModelStore) -> Runner:
    """A TensorRT engine of an in-place cache graph, each present bound to its cache's device buffer.

    TensorRT's KV-cache update layer writes in place: its output must share the cache input's memory, which
    polygraphy's ``TrtRunner`` (outputs of its own) does not do, so the engine runs through the TensorRT API here.
    """
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise SkipCase(f"the engine cannot be run here: {exc}") from None
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(Path(engine_path).read_bytes())
    if engine is None:
        raise SkipCase(f"TensorRT could not deserialize {engine_path} on this GPU")
    context = engine.create_execution_context()
    tensors = {name: t.contiguous().cuda() for name, t in workload.inputs.items()}
    presents = {present: cache for cache, present in CACHE_BUFFERS}
    for name, tensor in tensors.items():
        context.set_input_shape(name, tuple(tensor.shape))
        context.set_tensor_address(name, tensor.data_ptr())
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        if engine.get_tensor_mode(name) != trt.TensorIOMode.OUTPUT:
            continue
        if name in presents:
            context.set_tensor_address(name, tensors[presents[name]].data_ptr())  # written in place
            continue
        dtype = torch.from_numpy(np.empty(0, dtype=trt.nptype(engine.get_tensor_dtype(name)))).dtype
        tensors[name] = torch.empty(tuple(context.get_tensor_shape(name)), dtype=dtype, device="cuda")
        context.set_tensor_address(name, tensors[name].data_ptr())
    stream = torch.cuda.current_stream()
    models.on_close(lambda: tensors.clear())

    def run() -> Any:
        context.execute_async_v3(stream.cuda_stream)
        torch.cuda.synchronize()
        return tensors

    return run


def all_backends() -> dict[str, Backend]:
    """Every backend by name, in the order results are shown."""
    backends: list[Backend] = [
        EagerTorch(),
        OrtCpu("decomposed"),
        OrtCpu("fused"),
        OrtCpu("gqa"),
        OrtCuda(),
        OrtCuda(fused=True),
        TensorRT(),
    ]
    return {b.name: b for b in backends}


BACKEND_NAMES: tuple[str, ...] = tuple(all_backends())


def get_backends(names: list[str] | None) -> list[Backend]:
    """Backends by name (all when ``names`` is empty).

    Raises:
        ConfigError: an unknown backend name (the message lists the valid ones).
    """
    backends = all_backends()
    if not names:
        return list(backends.values())
    unknown = [n for n in names if n not in backends]
    if unknown:
        raise ConfigError(f"unknown backend(s) {unknown}; valid backends are {list(backends)}.")
    return [backends[n] for n in dict.fromkeys(names)]
