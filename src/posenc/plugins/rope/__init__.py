"""The posenc RoPE plugin: one fused Triton kernel for q and k, its TensorRT plugin and its ONNX Runtime twin.

- :mod:`.spec`: what a kernel instance computes (:class:`RopeKernelSpec`), plugin names and attributes.
- :mod:`.launch`: run the kernel on torch tensors (:func:`rope_qk`), the host-side position check.
- :mod:`.aot`: compile the kernel to PTX for a GPU architecture without a GPU (:func:`compile_rope_ptx`).
- :mod:`.trt_plugin`: the ``tensorrt.plugin`` (QDP) registration with an ahead-of-time implementation.
- :mod:`.ort_twin`: ONNX functions that make plugin nodes run in ONNX Runtime.

See README.md in this directory for inputs, attributes, limits and how to load the plugin.
Importing this package needs neither triton nor tensorrt.
"""

from posenc.plugins.rope.launch import check_rope_positions, freq_inputs, rope_qk
from posenc.plugins.rope.spec import (
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
    AngleSource,
    PositionMode,
    QKFormat,
    RopeKernelSpec,
)

__all__ = [
    "PLUGIN_NAMESPACE",
    "PLUGIN_VERSION",
    "AngleSource",
    "PositionMode",
    "QKFormat",
    "RopeKernelSpec",
    "check_rope_positions",
    "freq_inputs",
    "rope_qk",
]
