"""The machine's matrix-multiply rate: the roofline a compute-bound call (a block's prefill) is compared with.

A block's prefill is mostly matrix products (the four projections, ``QKᵀ`` and ``PV``). Its roofline on a CPU is the
rate of the GEMM kernel the runtime itself uses: :class:`GemmRunner` is one ONNX ``MatMul`` of ``[M, K] @ [K, N]``
float32 on ONNX Runtime CPU (its MLAS GEMM), with the same threads as the timed graphs, sized to the FLOPs of the call
it is compared with (``M`` = the call's tokens, ``K`` = its width, ``N`` chosen so the FLOPs match). It is timed in
the same alternating rounds as that call, so a shared machine's drift hits both alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from posenc.errors import ConfigError


class GemmRunner:
    """A zero-argument callable running one ``[rows, inner] @ [inner, cols]`` float32 MatMul on ONNX Runtime CPU.

    Args:
        rows, inner, cols: the GEMM's ``M``, ``K``, ``N``.
        threads: ONNX Runtime intra-op threads (those of the graphs it is compared with).

    Attributes:
        flops_per_call: ``2 · M · K · N``.
    """

    def __init__(self, rows: int, inner: int, cols: int, threads: int) -> None:
        for name, value in (("rows", rows), ("inner", inner), ("cols", cols)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"GEMM {name} must be a positive int, got {value!r}.")
        from onnx import TensorProto, helper, numpy_helper

        from posenc.export.runtime import ort_session

        rng = np.random.default_rng(0)
        weight = rng.standard_normal((inner, cols)).astype(np.float32)
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])],
            "gemm",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, inner])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, cols])],
            [numpy_helper.from_array(weight, "w")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        model.ir_version = 9
        self.session: Any = ort_session(
            model.SerializeToString(), ["CPUExecutionProvider"], threads=threads, spinning=False
        )
        self.input = rng.standard_normal((rows, inner)).astype(np.float32)
        self.output = np.empty((rows, cols), dtype=np.float32)
        self.binding = self.session.io_binding()
        self.binding.bind_cpu_input("x", self.input)
        self.binding.bind_output("y", "cpu", 0, np.float32, [rows, cols], self.output.ctypes.data)
        self.flops_per_call = 2 * rows * inner * cols

    @classmethod
    def matching(cls, flops: int, rows: int, inner: int, threads: int) -> GemmRunner:
        """A GEMM of ``rows × inner`` inputs with (about) ``flops`` FLOPs: ``N = round(flops / (2 · rows · inner))``."""
        cols = max(1, round(flops / (2 * rows * inner)))
        return cls(rows, inner, cols, threads)

    def __call__(self) -> None:
        self.session.run_with_iobinding(self.binding)


__all__ = ["GemmRunner"]
