"""The contenders of the RoPE kernel benchmark (:mod:`posenc.bench.rope_kernel`): each a function of the case's
tensors that returns one launch to time — the posenc Triton kernel, Hugging Face's eager ``rotate_half``, an engine
with TensorRT's rotary layer or with the posenc plugin, and a copy of the same bytes (the case's floor).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from posenc import functional
from posenc.dtypes import torch_dtype
from posenc.plugins.rope.launch import rope_qk
from posenc.plugins.rope.spec import AngleSource, RopeKernelSpec

if TYPE_CHECKING:
    from posenc.bench.rope_kernel import KernelCase


def inputs(case: KernelCase, device: str) -> dict[str, torch.Tensor]:
    """The case's tensors on ``device``: q ``[B, H, S, D]``, k ``[B, Hkv, S, D]``, float32 cos/sin tables
    ``[P, D/2]`` of the case's context, positions ``[B, S]`` (each row from a random offset)."""
    dtype = torch_dtype(case.dtype)
    c, batch, seq = case.config, case.shape.batch, case.shape.seq
    positions = c.max_position_embeddings
    inv_freq, _ = functional.rope_inv_freq(c.head_dim, {"rope_theta": 500000.0})
    cos, sin = functional.rope_cos_sin(torch.arange(positions), inv_freq)
    offsets = torch.randint(0, max(1, min(64, positions - seq)), (batch, 1))
    pos = torch.arange(seq).expand(batch, seq) + offsets
    tensors = {
        "q": torch.randn(batch, c.num_heads, seq, c.head_dim, dtype=dtype),
        "k": torch.randn(batch, c.num_kv_heads, seq, c.head_dim, dtype=dtype),
        "cos": cos,
        "sin": sin,
        "pos": pos.contiguous(),
    }
    return {name: t.to(device) for name, t in tensors.items()}


def kernel_call(t: dict[str, torch.Tensor], case: KernelCase, block_h: int | None, num_warps: int | None):
    """posenc's Triton kernel (:func:`posenc.plugins.rope.launch.rope_qk`) on q and k, into preallocated outputs,
    with a tactic's ``block_h`` / ``num_warps`` (``None``: the launcher's default)."""
    d = case.config.head_dim
    spec = RopeKernelSpec(AngleSource.TABLE, d, d, "half")
    out = (torch.empty_like(t["q"]), torch.empty_like(t["k"]))

    def call() -> None:
        rope_qk(
            t["q"],
            t["k"],
            spec,
            cos=t["cos"],
            sin=t["sin"],
            positions=t["pos"],
            out=out,
            block_h=block_h,
            num_warps=num_warps,
            check_positions=False,
        )

    return call


def eager_call(t: dict[str, torch.Tensor]):
    """Hugging Face style: ``x * cos + rotate_half(x) * sin`` with ``[B, 1, S, D]`` cos/sin in x's dtype."""
    cos = torch.cat((t["cos"][t["pos"]], t["cos"][t["pos"]]), dim=-1).unsqueeze(1).to(t["q"].dtype)
    sin = torch.cat((t["sin"][t["pos"]], t["sin"][t["pos"]]), dim=-1).unsqueeze(1).to(t["q"].dtype)

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def call() -> tuple[torch.Tensor, torch.Tensor]:
        return t["q"] * cos + rotate_half(t["q"]) * sin, t["k"] * cos + rotate_half(t["k"]) * sin

    return call


def trt_engine_call(t: dict[str, torch.Tensor], case: KernelCase, native: bool):
    """An engine with TensorRT's rotary layer (``native``) or the posenc plugin, run on torch buffers."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    dtype = t["q"].dtype
    trt_dtype = {torch.bfloat16: trt.bfloat16, torch.float16: trt.float16, torch.float32: trt.float32}[dtype]
    feeds = {"q": t["q"], "k": t["k"], "pos": t["pos"]}
    if native:  # the layer needs caches in the activation dtype
        feeds["cos"], feeds["sin"] = t["cos"].to(dtype), t["sin"].to(dtype)
        q = network.add_input("q", trt_dtype, tuple(t["q"].shape))
        k = network.add_input("k", trt_dtype, tuple(t["k"].shape))
        cos = network.add_input("cos", trt_dtype, tuple(feeds["cos"].shape))
        sin = network.add_input("sin", trt_dtype, tuple(feeds["sin"].shape))
        pos = network.add_input("pos", trt.int64, tuple(t["pos"].shape))
        for name, x in (("q_rot", q), ("k_rot", k)):
            layer = network.add_rotary_embedding(x, cos, sin, False, case.config.head_dim)
            layer.set_input(3, pos)
            layer.get_output(0).name = name
            network.mark_output(layer.get_output(0))
    else:
        from posenc.plugins.rope.trt_plugin import register_rope_plugins

        register_rope_plugins()
        feeds["cos"], feeds["sin"] = t["cos"], t["sin"]
        parser = trt.OnnxParser(network, logger)
        if not parser.parse(plugin_onnx(t, case).SerializeToString()):
            raise RuntimeError("; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
    plan = builder.build_serialized_network(network, builder.create_builder_config())
    if plan is None:
        raise RuntimeError("TensorRT engine build failed")
    engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
    context = engine.create_execution_context()
    buffers = dict(feeds)
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        if name not in buffers:
            buffers[name] = torch.empty(tuple(engine.get_tensor_shape(name)), dtype=dtype, device="cuda")
        context.set_tensor_address(name, buffers[name].data_ptr())

    def call() -> None:
        context.execute_async_v3(torch.cuda.current_stream().cuda_stream)

    return call


def plugin_onnx(t: dict[str, torch.Tensor], case: KernelCase):
    """A one-node ONNX model of the posenc RoPE plugin over the case's tensors (for TensorRT's ONNX parser)."""
    import onnx
    from onnx import TensorProto, helper

    from posenc.plugins.rope.ort_twin import make_plugin_node

    elem = {torch.bfloat16: TensorProto.BFLOAT16, torch.float16: TensorProto.FLOAT16, torch.float32: TensorProto.FLOAT}
    q_type = elem[t["q"].dtype]
    d = case.config.head_dim
    spec = RopeKernelSpec(AngleSource.TABLE, d, d)
    node = make_plugin_node(spec, ["q", "k", "cos", "sin", "pos"], ["q_rot", "k_rot"])
    inputs = [
        helper.make_tensor_value_info("q", q_type, list(t["q"].shape)),
        helper.make_tensor_value_info("k", q_type, list(t["k"].shape)),
        helper.make_tensor_value_info("cos", TensorProto.FLOAT, list(t["cos"].shape)),
        helper.make_tensor_value_info("sin", TensorProto.FLOAT, list(t["sin"].shape)),
        helper.make_tensor_value_info("pos", TensorProto.INT64, list(t["pos"].shape)),
    ]
    outputs = [
        helper.make_tensor_value_info("q_rot", q_type, list(t["q"].shape)),
        helper.make_tensor_value_info("k_rot", q_type, list(t["k"].shape)),
    ]
    graph = helper.make_graph([node], "rope_plugin", inputs, outputs)
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("posenc", 1)]
    return onnx.helper.make_model(graph, opset_imports=opsets, ir_version=10)


def same_bytes_copy_call(t: dict[str, torch.Tensor]):
    """One ``copy_`` of a buffer of q's and k's size: what reading and writing them costs at this size."""
    elements = t["q"].numel() + t["k"].numel()
    src = torch.empty(elements, dtype=t["q"].dtype, device=t["q"].device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


__all__ = ["eager_call", "inputs", "kernel_call", "plugin_onnx", "same_bytes_copy_call", "trt_engine_call"]
