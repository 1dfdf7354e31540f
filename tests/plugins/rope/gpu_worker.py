"""GPU checks of the RoPE kernel and its TensorRT plugin, run by test_trt_plugin.py in a fresh process.

The test process runs Triton's interpreter (tests/conftest.py); real kernels and engine builds need a process
without it. Usage: ``python gpu_worker.py CASE [OUT_DIR]``; prints one JSON object.

Cases: ``kernel`` (Triton JIT on CUDA vs float64), ``engine:<source>:<dtype>:<functions>`` (build an engine from
the ONNX plugin graph, run it, compare; saves plan, inputs and expected outputs to OUT_DIR), ``python_free``
(load OUT_DIR's plan with tensorrt alone, without posenc or plugin registration, run and compare).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

B, HQ, HKV, S, D = 2, 8, 2, 37, 128
MAX_POS = 256


def _kernel_case() -> dict:
    import torch

    from posenc import functional
    from posenc.plugins.rope import RopeKernelSpec, freq_inputs, rope_qk
    from tests.plugins.rope.reference import positions_of, rotate_reference, row_inv_freq

    errors = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for layout, rotary_dim in (("half", D), ("interleaved", 64)):
            q = torch.randn(B, S, HQ, D, device="cuda", dtype=dtype).transpose(1, 2)  # BSHD storage
            k = torch.randn(B, HKV, S, D, device="cuda", dtype=dtype)
            inv_freq, _ = functional.rope_inv_freq(rotary_dim)
            cos, sin = (t.cuda() for t in functional.rope_cos_sin(torch.arange(MAX_POS), inv_freq))
            pos = torch.randint(0, MAX_POS, (B, S), device="cuda")
            spec = RopeKernelSpec("table", rotary_dim, D, layout)
            q_out, _ = rope_qk(q, k, spec, cos=cos, sin=sin, positions=pos)
            ref = rotate_reference(q.cpu(), pos.cpu(), inv_freq, 1.0, layout, rotary_dim)
            errors[f"table-{layout}-{dtype}"] = float((q_out.cpu().double() - ref).abs().max())
    q = torch.randn(B, HQ, S, D, device="cuda")
    k = torch.randn(B, HKV, S, D, device="cuda")
    offsets = torch.tensor([131000, 5], device="cuda")
    turns, kwargs = freq_inputs(D, {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192})
    spec = RopeKernelSpec("freq", D, D, positions="offset", **kwargs)
    q_out, _ = rope_qk(q, k, spec, turns=turns.cuda(), positions=offsets)
    inv_freq, factor = functional.rope_inv_freq(
        D, {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192}
    )
    pos = positions_of(offsets.cpu(), "offset", B, S)
    errors["freq-yarn-131072"] = float(
        (q_out.cpu().double() - rotate_reference(q.cpu(), pos, inv_freq, factor, "half", D)).abs().max()
    )
    params = {"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": 4096}
    spec = RopeKernelSpec("ntk", D, D, positions="offset", factor=4.0, max_position_embeddings=4096)
    q_out, _ = rope_qk(q, k, spec, positions=offsets)
    inv_rows, _ = row_inv_freq(D, params, pos)
    errors["ntk-131072"] = float(
        (q_out.cpu().double() - rotate_reference(q.cpu(), pos, inv_rows, 1.0, "half", D)).abs().max()
    )
    return {"errors": errors}


def _plugin_model(source: str, dtype_name: str, with_functions: bool):
    """ONNX model with one plugin node (built directly, or by the graph pass for the table source)."""
    import onnx
    import torch
    from onnx import TensorProto, helper, numpy_helper

    from posenc import functional
    from posenc.graphs.rope_plugin import replace_rope_with_plugin
    from posenc.plugins.rope import RopeKernelSpec, freq_inputs
    from posenc.plugins.rope.ort_twin import make_plugin_node, rope_functions_for

    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}[dtype_name]
    q_info = helper.make_tensor_value_info("q", elem, [B, HQ, S, D])
    k_info = helper.make_tensor_value_info("k", elem, [B, HKV, S, D])
    pos_info = helper.make_tensor_value_info("pos", TensorProto.INT64, [B, S])
    outs = [
        helper.make_tensor_value_info("q_rot", elem, [B, HQ, S, D]),
        helper.make_tensor_value_info("k_rot", elem, [B, HKV, S, D]),
    ]
    opsets = [helper.make_opsetid("", 23)]
    if source == "table":  # through the graph pass: RotaryEmbedding(fp32) between casts -> plugin
        inv_freq, _ = functional.rope_inv_freq(64)
        cos, sin = functional.rope_cos_sin(torch.arange(MAX_POS), inv_freq)
        nodes = [helper.make_node("Cast", [n], [f"{n}32"], to=TensorProto.FLOAT) for n in ("q", "k")]
        nodes += [
            helper.make_node(
                "RotaryEmbedding", [f"{n}32", "cos", "sin", "pos"], [f"{n}r"], interleaved=1, rotary_embedding_dim=64
            )
            for n in ("q", "k")
        ]
        nodes += [helper.make_node("Cast", [f"{n}r"], [f"{n}_rot"], to=elem) for n in ("q", "k")]
        inits = [numpy_helper.from_array(cos.numpy(), "cos"), numpy_helper.from_array(sin.numpy(), "sin")]
        graph = helper.make_graph(nodes, "rope", [q_info, k_info, pos_info], outs, initializer=inits)
        model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=opsets, ir_version=10))
        model, count = replace_rope_with_plugin(model, with_functions=with_functions)
        assert count == 1
        return model
    if source == "freq":
        turns, kwargs = freq_inputs(
            D,
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        )
        spec = RopeKernelSpec("freq", D, D, **kwargs)
        inits = [numpy_helper.from_array(turns.numpy(), "turns")]
        names = ["q", "k", "turns", "pos"]
    else:
        spec = RopeKernelSpec("ntk", D, D, "interleaved", factor=2.0, max_position_embeddings=64)
        inits, names = [], ["q", "k", "pos"]
    node = make_plugin_node(spec, names, ["q_rot", "k_rot"])
    graph = helper.make_graph([node], "rope", [q_info, k_info, pos_info], outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[*opsets, helper.make_opsetid("posenc", 1)], ir_version=10)
    if with_functions:
        model.functions.extend(rope_functions_for(model))
    return model


def _reference(source: str, q, k, pos):
    from posenc import functional
    from tests.plugins.rope.reference import rotate_reference, row_inv_freq

    if source == "table":
        inv_freq, _ = functional.rope_inv_freq(64)
        return [rotate_reference(x, pos, inv_freq, 1.0, "interleaved", 64) for x in (q, k)]
    if source == "freq":
        params = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
        inv_freq, factor = functional.rope_inv_freq(D, params)
        return [rotate_reference(x, pos, inv_freq, factor, "half", D) for x in (q, k)]
    inv_rows, _ = row_inv_freq(D, {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64}, pos)
    return [rotate_reference(x, pos, inv_rows, 1.0, "interleaved", D) for x in (q, k)]


def _run_engine(plan: bytes, feeds: dict) -> dict:
    """Deserialize and run a plan with tensorrt and torch only."""
    import tensorrt as trt
    import torch

    logger = trt.Logger(trt.Logger.WARNING)
    engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
    if engine is None:
        raise RuntimeError("deserialize_cuda_engine returned None")
    context = engine.create_execution_context()
    to_torch = {
        trt.float32: torch.float32,
        trt.float16: torch.float16,
        trt.bfloat16: torch.bfloat16,
        trt.int64: torch.int64,
    }
    buffers = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            buffers[name] = feeds[name].cuda().contiguous()
        else:
            shape = tuple(engine.get_tensor_shape(name))
            buffers[name] = torch.empty(shape, dtype=to_torch[engine.get_tensor_dtype(name)], device="cuda")
        context.set_tensor_address(name, buffers[name].data_ptr())
    stream = torch.cuda.Stream()
    if not context.execute_async_v3(stream.cuda_stream):
        raise RuntimeError("execute_async_v3 failed")
    stream.synchronize()
    return {name: t.cpu() for name, t in buffers.items() if name not in feeds}


def _engine_case(source: str, dtype_name: str, with_functions: bool, out_dir: Path) -> dict:
    import tensorrt as trt
    import torch

    from posenc.plugins.rope.trt_plugin import register_rope_plugins

    register_rope_plugins()
    model = _plugin_model(source, dtype_name, with_functions)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model.SerializeToString()):
        return {"error": "parse failed: " + "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))}
    layer_types = [str(network.get_layer(i).type) for i in range(network.num_layers)]
    plan = builder.build_serialized_network(network, builder.create_builder_config())
    if plan is None:
        return {"error": "build failed", "layers": layer_types}
    dtype = getattr(torch, dtype_name)
    feeds = {
        "q": torch.randn(B, HQ, S, D).to(dtype),
        "k": torch.randn(B, HKV, S, D).to(dtype),
        "pos": torch.randint(0, MAX_POS, (B, S)),
    }
    outputs = _run_engine(bytes(plan), feeds)
    refs = _reference(source, feeds["q"], feeds["k"], feeds["pos"])
    errors = [float((outputs[n].double() - r).abs().max()) for n, r in zip(("q_rot", "k_rot"), refs, strict=True)]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "engine.plan").write_bytes(bytes(plan))
    torch.save({"feeds": feeds, "outputs": outputs}, out_dir / "io.pt")
    return {"errors": errors, "layers": layer_types}


def _python_free_case(out_dir: Path) -> dict:
    """Only tensorrt and torch: no posenc import, no plugin registration (AOT kernels are in the plan)."""
    import torch

    saved = torch.load(out_dir / "io.pt")
    outputs = _run_engine((out_dir / "engine.plan").read_bytes(), saved["feeds"])
    loaded = [m for m in sys.modules if m.startswith("posenc")]
    diffs = [float((outputs[n].double() - saved["outputs"][n].double()).abs().max()) for n in ("q_rot", "k_rot")]
    return {"diffs": diffs, "posenc_modules": loaded}


def main() -> None:
    case = sys.argv[1]
    out_dir = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(".")
    if case == "kernel":
        result = _kernel_case()
    elif case.startswith("engine:"):
        _, source, dtype_name, functions = case.split(":")
        result = _engine_case(source, dtype_name, functions == "1", out_dir)
    elif case == "python_free":
        result = _python_free_case(out_dir)
    else:
        raise SystemExit(f"unknown case {case}")
    print(json.dumps(result))


if __name__ == "__main__":
    np.random.seed(0)
    main()
