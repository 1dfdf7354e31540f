"""Benchmark of the fused RoPE kernel on a GPU against the bandwidth floor and the alternatives.

Measured per shape: the kernel (best tactic and the launcher's default), a torch eager ``rotate_half``
baseline (Hugging Face's ``apply_rotary_pos_emb`` with precomputed ``[B, 1, S, D]`` cos/sin in the activation
dtype), and, when ``tensorrt`` is importable, TensorRT's native rotary layer and the posenc plugin inside an
engine. Device copy bandwidth (``dst.copy_(src)`` of 1 GiB, read + write counted) is measured in the same run;
each result is reported as achieved bytes/s and as a fraction of it.

Timing: prefill-sized cases time each launch with CUDA events and flush L2 (a 256 MiB write) before each one;
decode-sized cases (launch-bound, working set in L2 as after the QKV GEMM) replay a CUDA graph of 100 launches
and report time per launch. ``smoke=True`` runs tiny shapes on CPU under Triton's interpreter to test the
harness; its numbers mean nothing.

Bytes counted (notes/performance.md §2): q and k read and written once, ``2 (Nq + Nk) e``; fp32 cos/sin rows
``2 U (r/2) 4`` with U distinct positions (B*S); int64 positions ``8 B S``.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from posenc import functional as PF
from posenc.plugins.rope.launch import rope_qk
from posenc.plugins.rope.spec import TACTICS, RopeKernelSpec

__all__ = ["DECODE", "PREFILL", "BenchShape", "bytes_moved", "run_benchmark"]

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclasses.dataclass(frozen=True)
class BenchShape:
    """One benchmark case."""

    name: str
    batch: int
    seq: int
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    max_positions: int = 8192
    graph_timing: bool = False
    """Time a CUDA graph of launches (decode) instead of single launches with an L2 flush (prefill)."""


PREFILL = BenchShape("llama3-8b-prefill", 1, 4096, 32, 8, 128)
DECODE = BenchShape("llama3-8b-decode", 64, 1, 32, 8, 128, graph_timing=True)


def bytes_moved(shape: BenchShape, rotary_dim: int | None = None) -> int:
    """Minimum DRAM traffic of one rotation of q and k (see the module docstring)."""
    e = torch.finfo(_DTYPES[shape.dtype]).bits // 8
    tokens = shape.batch * shape.seq
    r = rotary_dim or shape.head_dim
    qk = 2 * tokens * (shape.q_heads + shape.kv_heads) * shape.head_dim * e
    return qk + 2 * tokens * (r // 2) * 4 + 8 * tokens


def _inputs(shape: BenchShape, device: str) -> dict[str, torch.Tensor]:
    dtype = _DTYPES[shape.dtype]
    inv_freq, _ = PF.rope_inv_freq(shape.head_dim, {"rope_theta": 500000.0})
    cos, sin = PF.rope_cos_sin(torch.arange(shape.max_positions), inv_freq)
    offsets = torch.randint(0, max(1, min(64, shape.max_positions - shape.seq)), (shape.batch, 1))
    pos = torch.arange(shape.seq).expand(shape.batch, shape.seq) + offsets
    tensors = {
        "q": torch.randn(shape.batch, shape.q_heads, shape.seq, shape.head_dim, dtype=dtype),
        "k": torch.randn(shape.batch, shape.kv_heads, shape.seq, shape.head_dim, dtype=dtype),
        "cos": cos,
        "sin": sin,
        "pos": pos.contiguous(),
    }
    return {name: t.to(device) for name, t in tensors.items()}


# --------------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------------


def _time_cpu(fn: Callable[[], Any], iters: int) -> list[float]:
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def _time_events(fn: Callable[[], Any], iters: int, flush: torch.Tensor | None) -> list[float]:
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        if flush is not None:
            flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return samples


def _time_graph(fn: Callable[[], Any], iters: int, launches: int = 100) -> list[float]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up (compilation, autotune) outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / launches)
    return samples


def _measure(fn: Callable[[], Any], shape: BenchShape, device: str, iters: int, flush: torch.Tensor | None) -> dict:
    if device == "cpu":
        samples = _time_cpu(fn, iters)
        method = "perf_counter (CPU interpreter smoke run)"
    elif shape.graph_timing:
        samples = _time_graph(fn, iters)
        method = "CUDA graph of 100 launches, time per launch"
    else:
        samples = _time_events(fn, iters, flush)
        method = "CUDA events per launch, L2 flushed before each"
    return {"median_s": statistics.median(samples), "min_s": min(samples), "samples": len(samples), "method": method}


def copy_bandwidth(device: str, nbytes: int = 1 << 30, iters: int = 10) -> float:
    """Device copy bandwidth in bytes/s (read + write counted), median of ``iters`` copies."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    if device == "cpu":
        samples = _time_cpu(lambda: dst.copy_(src), iters)
    else:
        samples = _time_events(lambda: dst.copy_(src), iters, None)
    return 2 * nbytes / statistics.median(samples)


# --------------------------------------------------------------------------------------------------
# contenders
# --------------------------------------------------------------------------------------------------


def _kernel_call(t: dict[str, torch.Tensor], shape: BenchShape, block_h: int | None, num_warps: int | None):
    spec = RopeKernelSpec("table", shape.head_dim, shape.head_dim, "half")
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


def _eager_call(t: dict[str, torch.Tensor]):
    """Hugging Face style: ``x * cos + rotate_half(x) * sin`` with ``[B, 1, S, D]`` cos/sin in x's dtype."""
    cos = torch.cat((t["cos"][t["pos"]], t["cos"][t["pos"]]), dim=-1).unsqueeze(1).to(t["q"].dtype)
    sin = torch.cat((t["sin"][t["pos"]], t["sin"][t["pos"]]), dim=-1).unsqueeze(1).to(t["q"].dtype)

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def call() -> tuple[torch.Tensor, torch.Tensor]:
        return t["q"] * cos + rotate_half(t["q"]) * sin, t["k"] * cos + rotate_half(t["k"]) * sin

    return call


def _trt_engine_call(t: dict[str, torch.Tensor], shape: BenchShape, native: bool):
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
            layer = network.add_rotary_embedding(x, cos, sin, False, shape.head_dim)
            layer.set_input(3, pos)
            layer.get_output(0).name = name
            network.mark_output(layer.get_output(0))
    else:
        from posenc.plugins.rope.trt_plugin import register_rope_plugins

        register_rope_plugins()
        feeds["cos"], feeds["sin"] = t["cos"], t["sin"]
        parser = trt.OnnxParser(network, logger)
        if not parser.parse(_plugin_onnx(t, shape).SerializeToString()):
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


def _plugin_onnx(t: dict[str, torch.Tensor], shape: BenchShape):  # type: ignore[no-untyped-def]
    import onnx
    from onnx import TensorProto, helper

    from posenc.plugins.rope.ort_twin import make_plugin_node

    elem = {torch.bfloat16: TensorProto.BFLOAT16, torch.float16: TensorProto.FLOAT16, torch.float32: TensorProto.FLOAT}
    q_type = elem[t["q"].dtype]
    spec = RopeKernelSpec("table", shape.head_dim, shape.head_dim)
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


# --------------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------------


def _row(name: str, timing: dict | None, nbytes: int, copy_bw: float, **extra: Any) -> dict:
    row = {"contender": name, **extra}
    if timing is not None:
        seconds = timing["median_s"]
        row.update(timing)
        row["us"] = seconds * 1e6
        row["bytes_per_s"] = nbytes / seconds
        row["fraction_of_copy_bw"] = nbytes / seconds / copy_bw
    return row


def bench_shape(shape: BenchShape, device: str, copy_bw: float, iters: int, tactics: bool = True) -> dict:
    """All contenders on one shape; failures of optional contenders are recorded, not raised."""
    t = _inputs(shape, device)
    nbytes = bytes_moved(shape)
    flush = torch.empty(64 << 20, dtype=torch.float32, device=device) if device != "cpu" else None
    rows = [
        _row(
            "posenc kernel (default block)",
            _measure(_kernel_call(t, shape, None, None), shape, device, iters, flush),
            nbytes,
            copy_bw,
        )
    ]
    if tactics and device != "cpu":
        for tactic, (block_h, warps) in TACTICS.items():
            call = _kernel_call(t, shape, block_h, warps)
            timing = _measure(call, shape, device, iters, flush)
            rows.append(
                _row(f"posenc kernel tactic {tactic}", timing, nbytes, copy_bw, block_h=block_h, num_warps=warps)
            )
    rows.append(_row("torch eager rotate_half", _measure(_eager_call(t), shape, device, iters, flush), nbytes, copy_bw))
    if device != "cpu":
        for name, native in (("TensorRT native rotary layer", True), ("TensorRT + posenc plugin (AOT)", False)):
            try:
                timing = _measure(_trt_engine_call(t, shape, native), shape, device, iters, flush)
                rows.append(_row(name, timing, nbytes, copy_bw))
            except Exception as exc:  # tensorrt missing, too old, or the build failed: report it
                rows.append({"contender": name, "skipped": f"{type(exc).__name__}: {exc}"})
    return {"shape": dataclasses.asdict(shape), "bytes": nbytes, "rows": rows}


def run_benchmark(
    shapes: list[BenchShape] | None = None, *, device: str = "cuda", iters: int = 50, tactics: bool = True
) -> dict:
    """Run every shape; returns a JSON-ready document with copy bandwidth, rows and target checks."""
    shapes = shapes or [PREFILL, DECODE]
    copy_bw = copy_bandwidth(device, nbytes=(1 << 30) if device != "cpu" else (1 << 24))
    results = [bench_shape(s, device, copy_bw, iters, tactics) for s in shapes]
    doc: dict[str, Any] = {"device": _device_name(device), "copy_bandwidth_bytes_per_s": copy_bw, "results": results}
    doc["targets"] = _targets(results)
    return doc


def _device_name(device: str) -> str:
    if device == "cpu":
        return "cpu (Triton interpreter smoke run)"
    return torch.cuda.get_device_name()


def _best_kernel(result: dict) -> dict | None:
    rows = [r for r in result["rows"] if r["contender"].startswith("posenc kernel") and "us" in r]
    return min(rows, key=lambda r: r["us"]) if rows else None


def _targets(results: list[dict]) -> list[dict]:
    checks = []
    for result in results:
        best = _best_kernel(result)
        if best is None:
            continue
        native = next((r for r in result["rows"] if r["contender"].startswith("TensorRT native") and "us" in r), None)
        if result["shape"]["graph_timing"]:
            checks.append(
                {
                    "shape": result["shape"]["name"],
                    "target": "decode <= 5 us",
                    "value_us": best["us"],
                    "met": best["us"] <= 5.0,
                }
            )
        else:
            fraction = best["fraction_of_copy_bw"]
            checks.append(
                {
                    "shape": result["shape"]["name"],
                    "target": ">= 90% of copy bandwidth",
                    "value": fraction,
                    "met": fraction >= 0.9,
                }
            )
        if native is not None:
            checks.append(
                {
                    "shape": result["shape"]["name"],
                    "target": "not slower than TensorRT's rotary layer",
                    "value_us": best["us"],
                    "native_us": native["us"],
                    "met": best["us"] <= native["us"],
                }
            )
    return checks


def format_table(doc: dict) -> str:
    """A plain-text table of the document."""
    lines = [f"device: {doc['device']}   copy bandwidth: {doc['copy_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s"]
    for result in doc["results"]:
        lines.append(f"\n{result['shape']['name']}  ({result['bytes'] / 1e6:.2f} MB moved)")
        lines.append(f"  {'contender':<36} {'us':>10} {'GB/s':>9} {'% copy':>7}")
        for row in result["rows"]:
            if "us" in row:
                lines.append(
                    f"  {row['contender']:<36} {row['us']:>10.2f} {row['bytes_per_s'] / 1e9:>9.0f} "
                    f"{100 * row['fraction_of_copy_bw']:>6.1f}%"
                )
            else:
                lines.append(f"  {row['contender']:<36} skipped: {row.get('skipped', '')[:80]}")
    lines.append("\ntargets:")
    for check in doc["targets"]:
        lines.append(f"  [{'met' if check['met'] else 'MISSED'}] {check['shape']}: {check['target']} ({check})")
    return "\n".join(lines)
