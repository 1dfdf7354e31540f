"""Custom kernels and the TensorRT plugins built on them.

``posenc.plugins.rope``: the fused RoPE kernel (Triton), its ahead-of-time TensorRT plugin and its ONNX Runtime
twin. Importing this package imports neither triton nor tensorrt; they load when a kernel is launched, compiled
or registered.
"""
