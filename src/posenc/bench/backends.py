"""Backends a workload is timed on: eager PyTorch, ONNX Runtime (CPU decomposed / fused, CUDA), TensorRT.

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

Runner = Callable[[], Any]


class Backend:
    """Base class: a name, a one-line description, availability and :meth:`prepare`."""

    name = ""
    description = ""

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


class OrtCpu(Backend):
    """ONNX Runtime CPU on the exported graph (``graph="decomposed"``) or the optimized one (``"fused"``)."""

    def __init__(self, graph: str = "decomposed") -> None:
        if graph not in ("decomposed", "fused"):
            raise ConfigError(f"unknown graph kind {graph!r}; use 'decomposed' or 'fused'.")
        self.graph = graph
        self.name = "ort-cpu" if graph == "decomposed" else "ort-cpu-fused"
        self.description = (
            "ONNX Runtime CPU, the exported (decomposed) graph"
            if graph == "decomposed"
            else "ONNX Runtime CPU, graph optimized for ort-cpu (fused RotaryEmbedding 3-D, Attention)"
        )

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("onnxruntime") is None:
            return "onnxruntime is not installed (pip install onnxruntime)"
        return None

    def model_path(self, workload: Workload, models: ModelStore) -> Path:
        if self.graph == "decomposed":
            return models.exported(workload)
        return models.optimized(workload, "ort-cpu")

    def prepare(self, workload: Workload, models: ModelStore, threads: int) -> Runner:
        path = self.model_path(workload, models)
        session = models.cached(
            ("ort-cpu", str(path), threads),
            lambda: ort_session(path, ["CPUExecutionProvider"], threads=threads, spinning=False, check=False),
        )
        feeds = _bind_names(session, workload)
        binding = session.io_binding()
        for name, array in feeds:
            binding.bind_cpu_input(name, array)
        first = session.run(None, dict(feeds))  # learns output shapes; doubles as a warm-up call
        keep: list[np.ndarray] = []
        for meta, value in zip(session.get_outputs(), first, strict=True):
            out = np.empty_like(value)
            keep.append(out)
            binding.bind_output(meta.name, "cpu", 0, out.dtype, list(out.shape), out.ctypes.data)

        def run() -> list[np.ndarray]:
            session.run_with_iobinding(binding)
            return keep

        return run


class OrtCuda(Backend):
    name = "ort-cuda"
    description = "ONNX Runtime CUDA execution provider, inputs and outputs on the GPU"

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("onnxruntime") is None:
            return "onnxruntime is not installed"
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return "onnxruntime has no CUDAExecutionProvider here (install onnxruntime-gpu on a machine with a GPU)"
        return None

    def prepare(self, workload: Workload, models: ModelStore, threads: int) -> Runner:
        import onnxruntime as ort

        path = models.exported(workload)
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        session = ort_session(path, providers, threads=threads, spinning=False, check=False)
        feeds = _bind_names(session, workload)
        first = session.run(None, dict(feeds))
        binding = session.io_binding()
        keep = []
        for name, array in feeds:
            value = ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0)
            keep.append(value)
            binding.bind_ortvalue_input(name, value)
        for meta, host in zip(session.get_outputs(), first, strict=True):
            value = ort.OrtValue.ortvalue_from_shape_and_type(list(host.shape), host.dtype, "cuda", 0)
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


def all_backends() -> dict[str, Backend]:
    """Every backend by name, in the order results are shown."""
    backends: list[Backend] = [EagerTorch(), OrtCpu("decomposed"), OrtCpu("fused"), OrtCuda(), TensorRT()]
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
